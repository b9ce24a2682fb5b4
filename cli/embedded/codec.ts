import type { EncodeOptions } from "../../controller/api/service.ts";
import type { ModelTokenizer } from "../../worker/model/tokenizer.ts";

/**
 * Text to token ids as the front door does it, in the service's codec
 * (text-codec.ts) and on each tokenizer thread (codec-thread.ts) alike, so
 * a prompt gets the same ids wherever it is tokenized. Special tokens (the
 * post-processor's BOS) only when asked: completions ask by default, chat
 * does not (its template writes them).
 */
export function encodeText(tok: ModelTokenizer, text: string, opts?: EncodeOptions): number[] {
  return tok.encode(text, { addSpecialTokens: opts?.addSpecialTokens ?? false });
}
