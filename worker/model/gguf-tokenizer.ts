import { GgufError, type GgufMeta, type GgufValue } from "./gguf.ts";
import type { GgufMetaValue } from "./gguf-write.ts";

/**
 * A GGUF file's tokenizer (tokenizer.ggml.*) as the tokenizer.json that
 * @huggingface/tokenizers runs, and back:
 *   - "gpt2": byte-level BPE, tokens and merges as stored, the pre-tokenizer
 *     chosen by tokenizer.ggml.pre (PRE_TOKENIZERS);
 *   - "llama": SentencePiece-style BPE with byte fallback, "▁" for spaces,
 *     merges derived from the token scores (a merge ranks by its result's
 *     score, as transformers' GGUF converter derives them).
 * Token types (1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6
 * byte): control and user-defined tokens become added tokens (control ones
 * special), so their text maps to their id.
 */
const TYPE_NORMAL = 1;
const TYPE_CONTROL = 3;
const TYPE_USER = 4;
const TYPE_UNUSED = 5;

const LLAMA3_SPLIT =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_SPLIT =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const byteLevel = (useRegex: boolean) => ({
  type: "ByteLevel",
  add_prefix_space: false,
  trim_offsets: true,
  use_regex: useRegex,
});
const split = (pattern: string) => ({
  type: "Sequence",
  pretokenizers: [
    { type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false },
    byteLevel(false),
  ],
});

/** tokenizer.ggml.pre → the pre-tokenizer of a "gpt2" vocabulary. */
const PRE_TOKENIZERS: Readonly<Record<string, unknown>> = {
  default: byteLevel(true),
  "gpt-2": byteLevel(true),
  "llama-bpe": split(LLAMA3_SPLIT),
  llama3: split(LLAMA3_SPLIT),
  qwen2: split(QWEN2_SPLIT),
};

const isString = (v: GgufValue): v is string => typeof v === "string";
const isNumber = (v: GgufValue): v is number => typeof v === "number";

export interface GgufTokenizer {
  /** tokenizer.json's object. */
  readonly json: Record<string, unknown>;
  /** tokenizer_config.json's fields (bos_token, chat_template). */
  readonly config: Record<string, unknown>;
}

export function tokenizerFromGguf(meta: GgufMeta, vocab: number): GgufTokenizer {
  const file = meta.header.file;
  const model = meta.string("tokenizer.ggml.model");
  const tokens = meta.array("tokenizer.ggml.tokens", isString, "a string");
  if (tokens === undefined) throw new GgufError(`${file}: metadata tokenizer.ggml.tokens: missing`);
  if (tokens.length > vocab)
    throw new GgufError(
      `${file}: metadata tokenizer.ggml.tokens has ${tokens.length} tokens but token_embd.weight has only ${vocab} rows`,
    );
  const types = meta.array("tokenizer.ggml.token_type", isNumber, "an integer") ?? [];
  if (types.length > 0 && types.length !== tokens.length)
    throw new GgufError(
      `${file}: metadata tokenizer.ggml.token_type has ${types.length} entries, tokens has ${tokens.length}`,
    );
  const idOf = (key: string): number | undefined => {
    if (!meta.has(key)) return undefined;
    const id = meta.uint(key);
    if (id >= tokens.length)
      throw new GgufError(`${file}: metadata ${key} = ${id} is not a token (there are ${tokens.length})`);
    return id;
  };
  const bos = idOf("tokenizer.ggml.bos_token_id");
  const eos = idOf("tokenizer.ggml.eos_token_id");
  const unk = idOf("tokenizer.ggml.unknown_token_id");
  const added = tokens.flatMap((content, id) => {
    const t = types[id] ?? TYPE_NORMAL;
    if (t !== TYPE_CONTROL && t !== TYPE_USER) return [];
    return [
      {
        id,
        content,
        single_word: false,
        lstrip: false,
        rstrip: false,
        normalized: false,
        special: t === TYPE_CONTROL,
      },
    ];
  });
  const vocabMap: Record<string, number> = {};
  for (const [id, t] of tokens.entries()) if (!Object.hasOwn(vocabMap, t)) vocabMap[t] = id;
  const spm = model === "llama";
  const addBos = meta.bool("tokenizer.ggml.add_bos_token", spm);
  if (meta.bool("tokenizer.ggml.add_eos_token", false))
    throw new GgufError(`${file}: metadata tokenizer.ggml.add_eos_token = true is not supported`);
  if (addBos && bos === undefined)
    throw new GgufError(
      `${file}: metadata tokenizer.ggml.add_bos_token is true but there is no bos_token_id`,
    );
  const bosName = bos === undefined ? null : tokens[bos]!;
  const postProcessor = addBos
    ? {
        type: "TemplateProcessing",
        single: [{ SpecialToken: { id: bosName, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
        pair: [
          { SpecialToken: { id: bosName, type_id: 0 } },
          { Sequence: { id: "A", type_id: 0 } },
          { SpecialToken: { id: bosName, type_id: 1 } },
          { Sequence: { id: "B", type_id: 1 } },
        ],
        special_tokens: { [bosName!]: { id: bosName, ids: [bos], tokens: [bosName] } },
      }
    : null;
  let json: Record<string, unknown>;
  if (model === "gpt2") {
    const pre = meta.string("tokenizer.ggml.pre", "default");
    const preTokenizer = PRE_TOKENIZERS[pre];
    if (preTokenizer === undefined)
      throw new GgufError(
        `${file}: metadata tokenizer.ggml.pre = "${pre}" is not supported (supported: ${Object.keys(PRE_TOKENIZERS).join(", ")}); put the model's tokenizer.json beside the file to use it instead`,
      );
    const merges = meta.array("tokenizer.ggml.merges", isString, "a string");
    if (merges === undefined)
      throw new GgufError(`${file}: metadata tokenizer.ggml.merges: missing (a gpt2 vocabulary needs them)`);
    json = {
      version: "1.0",
      truncation: null,
      padding: null,
      added_tokens: added,
      normalizer: null,
      pre_tokenizer: preTokenizer,
      post_processor: postProcessor,
      decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
      model: {
        type: "BPE",
        dropout: null,
        unk_token: null,
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: false,
        byte_fallback: false,
        ignore_merges: pre !== "default" && pre !== "gpt-2",
        vocab: vocabMap,
        merges,
      },
    };
  } else if (spm) {
    const scores = meta.array("tokenizer.ggml.scores", isNumber, "a number");
    if (scores === undefined || scores.length !== tokens.length)
      throw new GgufError(
        `${file}: metadata tokenizer.ggml.scores must give one score per token for a llama vocabulary`,
      );
    const prefix = meta.bool("tokenizer.ggml.add_space_prefix", true);
    json = {
      version: "1.0",
      truncation: null,
      padding: null,
      added_tokens: added,
      normalizer: {
        type: "Sequence",
        normalizers: [
          ...(prefix ? [{ type: "Prepend", prepend: "▁" }] : []),
          { type: "Replace", pattern: { String: " " }, content: "▁" },
        ],
      },
      pre_tokenizer: null,
      post_processor: postProcessor,
      decoder: {
        type: "Sequence",
        decoders: [
          { type: "Replace", pattern: { String: "▁" }, content: " " },
          { type: "ByteFallback" },
          { type: "Fuse" },
          ...(prefix ? [{ type: "Strip", content: " ", start: 1, stop: 0 }] : []),
        ],
      },
      model: {
        type: "BPE",
        dropout: null,
        unk_token: unk === undefined ? null : tokens[unk],
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: true,
        byte_fallback: true,
        ignore_merges: false,
        vocab: vocabMap,
        merges: mergesFromScores(tokens, scores, types),
      },
    };
  } else {
    throw new GgufError(`${file}: metadata tokenizer.ggml.model = "${model}" is not supported (gpt2, llama)`);
  }
  const config: Record<string, unknown> = {};
  if (bosName !== null) config.bos_token = bosName;
  if (eos !== undefined) config.eos_token = tokens[eos];
  if (meta.has("tokenizer.chat_template")) config.chat_template = meta.string("tokenizer.chat_template");
  return { json, config };
}

/**
 * SentencePiece BPE as merges: every split of a normal token into two
 * tokens is a merge, ranked by the token's score (higher first), splits of
 * one token by their parts' scores.
 */
function mergesFromScores(
  tokens: readonly string[],
  scores: readonly number[],
  types: readonly number[],
): string[][] {
  const score = new Map<string, number>();
  tokens.forEach((t, i) => {
    if (!score.has(t)) score.set(t, scores[i]!);
  });
  const merges: { l: string; r: string; s: number }[] = [];
  tokens.forEach((t, i) => {
    if ((types[i] ?? TYPE_NORMAL) !== TYPE_NORMAL) return;
    const chars = Array.from(t);
    const local: { l: string; r: string; s: number }[] = [];
    for (let k = 1; k < chars.length; k++) {
      const l = chars.slice(0, k).join("");
      const r = chars.slice(k).join("");
      if (score.has(l) && score.has(r)) local.push({ l, r, s: scores[i]! });
    }
    local.sort((a, b) => score.get(b.l)! - score.get(a.l)! || score.get(b.r)! - score.get(a.r)!);
    merges.push(...local);
  });
  merges.sort((a, b) => b.s - a.s);
  return merges.map((m) => [m.l, m.r]);
}

// ---- writing ---------------------------------------------------------------

/**
 * tokenizer.ggml.* for a byte-level BPE tokenizer.json (GPT-2 style: the
 * "gpt2" model with pre "gpt-2"), `vocab` tokens long (ids without a token —
 * embedding rows past the tokenizer — become unused "[PAD<id>]" tokens, as
 * llama.cpp pads). Other tokenizer kinds are refused, naming what they are.
 */
export function ggufTokenizerMetadata(
  json: Record<string, unknown>,
  tokConfig: Record<string, unknown>,
  vocab: number,
  eosIds: readonly number[],
  bosId: number | null,
): Map<string, GgufMetaValue> {
  const model = json.model as Record<string, unknown> | undefined;
  const pre = json.pre_tokenizer as Record<string, unknown> | null | undefined;
  if (model?.type !== "BPE" || pre?.type !== "ByteLevel" || pre.use_regex !== true)
    throw new GgufError(
      `tokenizer.json: only a byte-level BPE tokenizer (model BPE, pre_tokenizer ByteLevel with its GPT-2 regex) can be written to GGUF here, got model ${JSON.stringify(model?.type)} with pre_tokenizer ${JSON.stringify(pre?.type ?? null)}`,
    );
  const tokens: (string | undefined)[] = new Array(vocab);
  const types = new Array<number>(vocab).fill(TYPE_NORMAL);
  for (const [t, id] of Object.entries(model.vocab as Record<string, number>)) if (id < vocab) tokens[id] = t;
  for (const a of (json.added_tokens ?? []) as { id: number; content: string; special: boolean }[]) {
    if (a.id >= vocab) continue;
    tokens[a.id] = a.content;
    types[a.id] = a.special ? TYPE_CONTROL : TYPE_USER;
  }
  for (let id = 0; id < vocab; id++) {
    if (tokens[id] !== undefined) continue;
    tokens[id] = `[PAD${id}]`;
    types[id] = TYPE_UNUSED;
  }
  const merges = (model.merges as (string | [string, string])[]).map((m) =>
    typeof m === "string" ? m : m.join(" "),
  );
  const meta = new Map<string, GgufMetaValue>([
    ["tokenizer.ggml.model", { type: "string", value: "gpt2" }],
    ["tokenizer.ggml.pre", { type: "string", value: "gpt-2" }],
    ["tokenizer.ggml.tokens", { type: "strings", value: tokens as string[] }],
    ["tokenizer.ggml.token_type", { type: "i32s", value: types }],
    ["tokenizer.ggml.merges", { type: "strings", value: merges }],
    ["tokenizer.ggml.add_bos_token", { type: "bool", value: json.post_processor != null && bosId !== null }],
  ]);
  if (bosId !== null) meta.set("tokenizer.ggml.bos_token_id", { type: "u32", value: bosId });
  if (eosIds[0] !== undefined) meta.set("tokenizer.ggml.eos_token_id", { type: "u32", value: eosIds[0] });
  if (eosIds[1] !== undefined) meta.set("tokenizer.ggml.eot_token_id", { type: "u32", value: eosIds[1] });
  if (typeof tokConfig.chat_template === "string")
    meta.set("tokenizer.chat_template", { type: "string", value: tokConfig.chat_template });
  return meta;
}
