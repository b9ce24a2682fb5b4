import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { BYTE_TO_UNICODE } from "./bpe.ts";

/**
 * A model's tokenizer: `tokenizer.json` (+ `tokenizer_config.json`) through
 * @huggingface/tokenizers, and the chat templates it ships: the Jinja source
 * in tokenizer_config.json's `chat_template` (a string, or a list of named
 * templates) or in `chat_template.jinja` (transformers' newer layout, which
 * wins). Rendering them is chat-template.ts's job.
 */
export class TokenizerError extends Error {
  override readonly name = "TokenizerError";
}

/** The special-token names a chat template may read (transformers' special_tokens_map). */
const SPECIAL_TOKEN_KEYS = [
  "bos_token",
  "eos_token",
  "unk_token",
  "pad_token",
  "sep_token",
  "cls_token",
  "mask_token",
];

export class ModelTokenizer {
  private readonly specialIdSet: ReadonlySet<number>;

  private constructor(
    private readonly hf: HfTokenizer,
    /** Ids that have a token string (a checkpoint's vocab_size may exceed it). */
    readonly size: number,
    /** Chat templates by name ("default" for a single template); empty: none. */
    readonly chatTemplates: ReadonlyMap<string, string>,
    /** bos_token, eos_token, … as strings, for templates. */
    readonly specialTokens: Readonly<Record<string, string>>,
    private readonly cleanUpSpaces: boolean,
    /** How a vocabulary string maps to output bytes (the decoder's kind). */
    private readonly byteMapping: ByteMapping,
  ) {
    this.specialIdSet = new Set(
      [...hf.get_added_tokens_decoder().entries()].filter(([, t]) => t.special).map(([id]) => id),
    );
  }

  static fromJson(
    tokenizerJson: unknown,
    tokenizerConfig: Record<string, unknown> = {},
    /** chat_template.jinja's text, when the directory has one (it replaces tokenizer_config's). */
    templateFile?: string,
  ): ModelTokenizer {
    let hf: HfTokenizer;
    try {
      hf = new HfTokenizer(tokenizerJson as object, tokenizerConfig);
    } catch (err) {
      throw new TokenizerError(`tokenizer.json: ${(err as Error).message}`);
    }
    let size = 0;
    for (const id of hf.get_vocab(true).values()) size = Math.max(size, id + 1);
    const specials: Record<string, string> = {};
    for (const key of SPECIAL_TOKEN_KEYS) {
      const name = tokenName(tokenizerConfig[key]);
      if (name !== null) specials[key] = name;
    }
    return new ModelTokenizer(
      hf,
      size,
      templateFile !== undefined ? new Map([["default", templateFile]]) : chatTemplatesOf(tokenizerConfig),
      specials,
      tokenizerConfig.clean_up_tokenization_spaces === true,
      byteMappingOf((tokenizerJson as { decoder?: unknown }).decoder),
    );
  }

  /** Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json. */
  static async load(dir: string): Promise<ModelTokenizer> {
    let json: unknown;
    try {
      json = JSON.parse(await readFile(join(dir, "tokenizer.json"), "utf8"));
    } catch (err) {
      throw new TokenizerError(`${join(dir, "tokenizer.json")}: ${(err as Error).message}`);
    }
    let config: Record<string, unknown> = {};
    try {
      config = JSON.parse(await readFile(join(dir, "tokenizer_config.json"), "utf8"));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT")
        throw new TokenizerError(`${join(dir, "tokenizer_config.json")}: ${(err as Error).message}`);
    }
    let templateFile: string | undefined;
    try {
      templateFile = await readFile(join(dir, "chat_template.jinja"), "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT")
        throw new TokenizerError(`${join(dir, "chat_template.jinja")}: ${(err as Error).message}`);
    }
    return ModelTokenizer.fromJson(json, config, templateFile);
  }

  /**
   * Token ids of `text`. With `addSpecialTokens` the tokenizer's
   * post-processor adds what the model expects around a sequence (a BOS).
   * Special-token strings inside `text` become their ids.
   */
  encode(text: string, opts: { addSpecialTokens?: boolean } = {}): number[] {
    return this.hf.encode(text, { add_special_tokens: opts.addSpecialTokens ?? false }).ids;
  }

  /** Text of `ids`; ids with no token (padding rows of the embedding) decode to nothing. */
  decode(ids: readonly number[], opts: { skipSpecialTokens?: boolean } = {}): string {
    const known = ids.filter((id) => {
      if (!Number.isInteger(id) || id < 0) throw new TokenizerError(`not a token id: ${id}`);
      return this.hf.id_to_token(id) !== undefined;
    });
    const kept = opts.skipSpecialTokens ? known.filter((id) => !this.specialIdSet.has(id)) : known;
    if (kept.length === 0) return "";
    return this.hf.decode(kept, {
      skip_special_tokens: false,
      clean_up_tokenization_spaces: this.cleanUpSpaces,
    });
  }

  tokenToId(token: string): number | undefined {
    return this.hf.token_to_id(token);
  }

  idToToken(id: number): string | undefined {
    return this.hf.id_to_token(id);
  }

  isSpecial(id: number): boolean {
    return this.specialIdSet.has(id);
  }

  /**
   * The bytes each id contributes to the output (what a byte-level grammar
   * constrains), or null for special tokens and ids without a token. Byte-level
   * BPE maps each character back through GPT-2's byte table; SentencePiece-style
   * vocabularies turn "▁" into a space and "<0xNN>" into that byte; added
   * (non-special) tokens are their text.
   */
  tokenBytes(): (Uint8Array | null)[] {
    const added = this.hf.get_added_tokens_decoder();
    const out: (Uint8Array | null)[] = [];
    for (let id = 0; id < this.size; id++) {
      const token = this.hf.id_to_token(id);
      const a = added.get(id);
      if (token === undefined || this.specialIdSet.has(id)) out.push(null);
      else if (a !== undefined) out.push(new Uint8Array(Buffer.from(a.content, "utf8")));
      else out.push(vocabBytes(token, this.byteMapping));
    }
    return out;
  }
}

function tokenName(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (v !== null && typeof v === "object" && typeof (v as { content?: unknown }).content === "string")
    return (v as { content: string }).content;
  return null;
}

type ByteMapping = "byte-level" | "metaspace" | "utf8";

const UNICODE_TO_BYTE = new Map(BYTE_TO_UNICODE.map((c, b) => [c, b]));

/** The decoder tells how vocabulary strings become text: ByteLevel, or Metaspace / Replace("▁") with ByteFallback. */
function byteMappingOf(decoder: unknown): ByteMapping {
  const kinds: string[] = [];
  const visit = (d: unknown) => {
    if (typeof d !== "object" || d === null) return;
    const o = d as { type?: unknown; decoders?: unknown[]; pattern?: { String?: unknown } };
    if (o.type === "Sequence" && Array.isArray(o.decoders)) for (const x of o.decoders) visit(x);
    else if (o.type === "Replace" && o.pattern?.String === "▁") kinds.push("Metaspace");
    else if (typeof o.type === "string") kinds.push(o.type);
  };
  visit(decoder);
  if (kinds.includes("ByteLevel")) return "byte-level";
  if (kinds.includes("Metaspace")) return "metaspace";
  return "utf8";
}

function vocabBytes(token: string, mapping: ByteMapping): Uint8Array | null {
  if (mapping === "byte-level") {
    const out = new Uint8Array(token.length);
    let n = 0;
    for (const c of token) {
      const b = UNICODE_TO_BYTE.get(c);
      if (b === undefined) return new Uint8Array(Buffer.from(token, "utf8"));
      out[n++] = b;
    }
    return out.subarray(0, n);
  }
  if (mapping === "metaspace") {
    const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(token);
    if (m) return Uint8Array.of(parseInt(m[1]!, 16));
    return new Uint8Array(Buffer.from(token.replaceAll("▁", " "), "utf8"));
  }
  return new Uint8Array(Buffer.from(token, "utf8"));
}

/** tokenizer_config.json's chat_template: one string, or [{name, template}, …] (transformers). */
function chatTemplatesOf(config: Record<string, unknown>): Map<string, string> {
  const t = config.chat_template;
  const out = new Map<string, string>();
  if (typeof t === "string") out.set("default", t);
  else if (Array.isArray(t)) {
    for (const [i, entry] of t.entries()) {
      const e = entry as { name?: unknown; template?: unknown } | null;
      if (typeof e?.name !== "string" || typeof e.template !== "string")
        throw new TokenizerError(
          `tokenizer_config.json: chat_template[${i}] needs a string name and template`,
        );
      out.set(e.name, e.template);
    }
  } else if (t !== undefined && t !== null) {
    throw new TokenizerError(
      "tokenizer_config.json: chat_template must be a string or a list of named templates",
    );
  }
  return out;
}

/**
 * Streams text as ids arrive. Byte-level tokens can end inside a UTF-8
 * character, so text is released only up to the last complete character: a
 * decoded tail ending in U+FFFD (an incomplete sequence) is held back. Only a
 * short window of ids is re-decoded per step (the ids since the last release
 * plus the ones before it, for context such as a leading space), so a long
 * generation costs O(tokens), not O(tokens²).
 */
export class StreamDecoder {
  private readonly ids: number[] = [];
  /** ids[0, readStart) were already released; they give context. */
  private readStart = 0;

  constructor(
    private readonly tokenizer: ModelTokenizer,
    private readonly skipSpecialTokens = true,
  ) {}

  /** Adds one id; returns the newly completed text (possibly ""). */
  push(id: number): string {
    this.ids.push(id);
    const opts = { skipSpecialTokens: this.skipSpecialTokens };
    const prefix = this.tokenizer.decode(this.ids.slice(0, this.readStart), opts);
    const text = this.tokenizer.decode(this.ids, opts);
    if (text.length <= prefix.length || text.endsWith("\uFFFD")) return "";
    // Keep only the context window: ids before it are never decoded again.
    this.ids.splice(0, this.readStart);
    this.readStart = this.ids.length;
    return text.slice(prefix.length);
  }
}
