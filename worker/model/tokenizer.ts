import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";

/**
 * A model's tokenizer: `tokenizer.json` (+ `tokenizer_config.json`) through
 * @huggingface/tokenizers, plus chat formatting.
 *
 * Chat formatting does not run Jinja. The chat template in
 * tokenizer_config.json is recognised by family from the special tokens it
 * uses, and the same layout is rendered here:
 *   - "llama3":  <|begin_of_text|><|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|>…
 *   - "chatml":  <|im_start|>ROLE\nTEXT<|im_end|>\n…  (Qwen2 and the generated models)
 *   - "inst":    <s>[INST] TEXT [/INST] ANSWER</s>…    (Llama 2, Mistral; a system message
 *                is prepended to the first user turn)
 *   - "plain":   when there is no template: "ROLE: TEXT\n" per message, then "assistant:".
 */
export class TokenizerError extends Error {
  override readonly name = "TokenizerError";
}

export interface ChatMessage {
  readonly role: "system" | "user" | "assistant";
  readonly content: string;
}

export type ChatFormat = "llama3" | "chatml" | "inst" | "plain";

export class ModelTokenizer {
  private readonly specialIdSet: ReadonlySet<number>;

  private constructor(
    private readonly hf: HfTokenizer,
    /** Ids that have a token string (a checkpoint's vocab_size may exceed it). */
    readonly size: number,
    readonly chatFormat: ChatFormat,
    readonly bosToken: string | null,
    private readonly cleanUpSpaces: boolean,
  ) {
    this.specialIdSet = new Set(
      [...hf.get_added_tokens_decoder().entries()].filter(([, t]) => t.special).map(([id]) => id),
    );
  }

  static fromJson(tokenizerJson: unknown, tokenizerConfig: Record<string, unknown> = {}): ModelTokenizer {
    let hf: HfTokenizer;
    try {
      hf = new HfTokenizer(tokenizerJson as object, tokenizerConfig);
    } catch (err) {
      throw new TokenizerError(`tokenizer.json: ${(err as Error).message}`);
    }
    let size = 0;
    for (const id of hf.get_vocab(true).values()) size = Math.max(size, id + 1);
    const template = typeof tokenizerConfig.chat_template === "string" ? tokenizerConfig.chat_template : "";
    const bos = tokenName(tokenizerConfig.bos_token);
    return new ModelTokenizer(
      hf,
      size,
      chatFormatOf(template),
      bos,
      tokenizerConfig.clean_up_tokenization_spaces === true,
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
    return ModelTokenizer.fromJson(json, config);
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

  /** The prompt text for `messages`, ending where the assistant's answer begins. */
  renderChat(messages: readonly ChatMessage[]): string {
    for (const [i, m] of messages.entries()) {
      if (m.role !== "system" && m.role !== "user" && m.role !== "assistant")
        throw new TokenizerError(
          `messages[${i}].role must be system, user or assistant, got ${String(m.role)}`,
        );
      if (typeof m.content !== "string") throw new TokenizerError(`messages[${i}].content must be a string`);
    }
    switch (this.chatFormat) {
      case "llama3": {
        let s = "<|begin_of_text|>";
        for (const m of messages)
          s += `<|start_header_id|>${m.role}<|end_header_id|>\n\n${m.content.trim()}<|eot_id|>`;
        return `${s}<|start_header_id|>assistant<|end_header_id|>\n\n`;
      }
      case "chatml": {
        let s = "";
        for (const m of messages) s += `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`;
        return `${s}<|im_start|>assistant\n`;
      }
      case "inst": {
        let s = "";
        let system = "";
        for (const m of messages) {
          if (m.role === "system") system = `${m.content}\n\n`;
          else if (m.role === "user") {
            s += `${this.bosToken ?? "<s>"}[INST] ${system}${m.content.trim()} [/INST]`;
            system = "";
          } else s += ` ${m.content.trim()}</s>`;
        }
        return s;
      }
      case "plain": {
        let s = this.bosToken ?? "";
        for (const m of messages) s += `${m.role}: ${m.content}\n`;
        return `${s}assistant:`;
      }
    }
  }

  /** Token ids of the chat prompt (specials in the rendered text become their ids; nothing else is added). */
  encodeChat(messages: readonly ChatMessage[]): number[] {
    return this.encode(this.renderChat(messages), { addSpecialTokens: false });
  }
}

function tokenName(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (v !== null && typeof v === "object" && typeof (v as { content?: unknown }).content === "string")
    return (v as { content: string }).content;
  return null;
}

/** The chat layout a Jinja template implements, recognised by the tokens it emits. */
export function chatFormatOf(template: string): ChatFormat {
  if (template.includes("<|start_header_id|>")) return "llama3";
  if (template.includes("<|im_start|>")) return "chatml";
  if (template.includes("[INST]")) return "inst";
  return "plain";
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
