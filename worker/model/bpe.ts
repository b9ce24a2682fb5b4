/**
 * Trains a byte-level BPE (GPT-2 style) and writes it as a Hugging Face
 * `tokenizer.json`. Deterministic: same corpus and sizes → same merges, same
 * JSON bytes.
 *
 * Byte level: every UTF-8 byte maps to one printable character (GPT-2's
 * bytes_to_unicode table), so the 256 byte symbols cover any text and no
 * input is ever unknown. Text is first split into words with GPT-2's
 * pre-tokenization pattern (the one the ByteLevel pre-tokenizer applies), then
 * merges are learned greedily: at each step the most frequent adjacent pair
 * (ties: the smaller pair in string order) becomes a new symbol.
 */

/** GPT-2's pre-tokenization pattern (ByteLevel with use_regex). */
const WORD_PATTERN = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

/**
 * GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * rest to code points 256, 257, … in byte order.
 */
export const BYTE_TO_UNICODE: readonly string[] = (() => {
  const out: string[] = new Array(256);
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    out[b] = String.fromCodePoint(printable ? b : next++);
  }
  return out;
})();

export function byteLevel(text: string): string {
  let s = "";
  for (const b of Buffer.from(text, "utf8")) s += BYTE_TO_UNICODE[b];
  return s;
}

/** Learns up to `maxMerges` merges; stops early when no pair occurs twice. */
export function trainBpeMerges(corpus: string, maxMerges: number): [string, string][] {
  const counts = new Map<string, number>();
  for (const m of corpus.matchAll(WORD_PATTERN)) {
    const w = byteLevel(m[0]);
    counts.set(w, (counts.get(w) ?? 0) + 1);
  }
  // Words as symbol lists, in a fixed order so every pass visits them alike.
  const words = [...counts.entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([w, n]) => ({ syms: Array.from(w), n }));
  const merges: [string, string][] = [];
  while (merges.length < maxMerges) {
    const pairs = new Map<string, number>();
    for (const { syms, n } of words) {
      for (let i = 0; i + 1 < syms.length; i++) {
        const key = `${syms[i]}\u0000${syms[i + 1]}`;
        pairs.set(key, (pairs.get(key) ?? 0) + n);
      }
    }
    let best: string | undefined;
    let bestCount = 1;
    for (const [key, n] of pairs) {
      if (n > bestCount || (n === bestCount && best !== undefined && key < best)) {
        best = key;
        bestCount = n;
      }
    }
    if (best === undefined) break;
    const [a, b] = best.split("\u0000") as [string, string];
    merges.push([a, b]);
    for (const w of words) {
      const out: string[] = [];
      for (let i = 0; i < w.syms.length; i++) {
        if (i + 1 < w.syms.length && w.syms[i] === a && w.syms[i + 1] === b) {
          out.push(a + b);
          i++;
        } else out.push(w.syms[i]!);
      }
      w.syms = out;
    }
  }
  return merges;
}

export interface BpeTokenizerSpec {
  /** Total vocabulary: bytes + merges + special tokens + reserved fill. */
  readonly vocabSize: number;
  /** Special tokens, in id order after the merges (e.g. "<|bos|>"). */
  readonly specials: readonly string[];
  /** Prepended by the post-processor when special tokens are requested. */
  readonly bosToken: string;
  readonly corpus: string;
}

export interface BuiltTokenizer {
  /** The tokenizer.json object. */
  readonly json: Record<string, unknown>;
  readonly specialIds: ReadonlyMap<string, number>;
  readonly mergeCount: number;
}

/**
 * Builds tokenizer.json: ids 0..255 are the bytes, then one id per merge
 * result, then the special tokens, then reserved special tokens
 * `<|reserved_N|>` up to `vocabSize` (as Llama 3 reserves ids), so every row
 * of the embedding has a token.
 */
export function buildByteLevelBpe(spec: BpeTokenizerSpec): BuiltTokenizer {
  const budget = spec.vocabSize - 256 - spec.specials.length;
  if (budget < 0)
    throw new RangeError(
      `vocab size ${spec.vocabSize} is below 256 bytes + ${spec.specials.length} specials`,
    );
  const vocab = new Map<string, number>();
  for (let b = 0; b < 256; b++) vocab.set(BYTE_TO_UNICODE[b]!, b);
  const merges = trainBpeMerges(spec.corpus, budget);
  for (const [a, b] of merges) if (!vocab.has(a + b)) vocab.set(a + b, vocab.size);
  const added: Record<string, unknown>[] = [];
  const specialIds = new Map<string, number>();
  const addSpecial = (content: string) => {
    const id = vocab.size;
    vocab.set(content, id);
    specialIds.set(content, id);
    added.push({
      id,
      content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true,
    });
  };
  for (const s of spec.specials) addSpecial(s);
  for (let r = 0; vocab.size < spec.vocabSize; r++) addSpecial(`<|reserved_${r}|>`);
  const bosId = specialIds.get(spec.bosToken);
  if (bosId === undefined) throw new RangeError(`bos token ${spec.bosToken} is not among the specials`);
  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: spec.bosToken, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [
        { SpecialToken: { id: spec.bosToken, type_id: 0 } },
        { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: spec.bosToken, type_id: 1 } },
        { Sequence: { id: "B", type_id: 1 } },
      ],
      special_tokens: { [spec.bosToken]: { id: spec.bosToken, ids: [bosId], tokens: [spec.bosToken] } },
    },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab: Object.fromEntries([...vocab.entries()].filter(([t]) => !specialIds.has(t))),
      merges,
    },
  };
  return { json, specialIds, mergeCount: merges.length };
}
