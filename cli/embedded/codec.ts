import type { ChatMessage, TextCodec } from "../../controller/api/service.ts";
import type { ModelTokenizer } from "../../worker/model/tokenizer.ts";

/**
 * The front door's codec over a model's tokenizer: what the service hands
 * the front door, and what each tokenizer thread builds from the model
 * directory (cli/embedded/codec-thread.ts), so both produce the same ids.
 */
export function codecOf(tok: ModelTokenizer, eosTokenIds: readonly number[], vocabSize: number): TextCodec {
  return {
    encode: (text) => tok.encode(text),
    decode: (ids) => tok.decode(ids, { skipSpecialTokens: true }),
    // The tokenizer's templates know system/user/assistant; a tool result is
    // shown to the model as a user turn.
    chatPrompt: (messages: readonly ChatMessage[]) =>
      tok.encodeChat(
        messages.map((m) => ({ role: m.role === "tool" ? "user" : m.role, content: m.content })),
      ),
    eosTokenIds,
    vocabSize,
  };
}
