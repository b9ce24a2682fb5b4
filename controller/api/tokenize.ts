import { ApiError, badRequest } from "./errors.ts";
import { parseChatFields } from "./request-chat.ts";
import { asObject, type Body, optBool, optTokenIds, refuseUnsupported } from "./request-fields.ts";
import type { ModelInfo } from "./service.ts";

/**
 * vLLM's tokenizer endpoints and model card, pure over a parsed body:
 *  - POST /tokenize {prompt, add_special_tokens = true} or
 *    {messages, add_generation_prompt, continue_final_message, chat_template,
 *    chat_template_kwargs, tools, add_special_tokens = false}, both with
 *    return_token_strs → {count, max_model_len, tokens, token_strs};
 *  - POST /detokenize {tokens} → {prompt};
 *  - GET /v1/models and /v1/models/{id} → the model card.
 */

export const MAX_DETOKENIZE_TOKENS = 1 << 20;

/** The model a body names (or the only one served when it names none). */
export function pickModel(models: readonly ModelInfo[], name: unknown): ModelInfo {
  if (name === undefined || name === null) {
    if (models.length === 1) return models[0]!;
    throw badRequest("'model' is required", "model");
  }
  if (typeof name !== "string") throw badRequest("'model' must be a string", "model");
  return findModel(models, name);
}

/** The served model named `name`, else a 404 model_not_found (the name echoed up to 128 characters). */
export function findModel(models: readonly ModelInfo[], name: string): ModelInfo {
  const m = models.find((x) => x.id === name);
  if (!m)
    throw new ApiError(
      404,
      `the model '${name.slice(0, 128)}' does not exist`,
      "invalid_request_error",
      "model",
      "model_not_found",
    );
  return m;
}

/** What POST /tokenize asks: the text to encode (a chat rendered by its template) and how. */
export interface TokenizeInput {
  readonly model: ModelInfo;
  readonly text: string;
  readonly addSpecialTokens: boolean;
  readonly returnTokenStrs: boolean;
}

export function tokenizeInput(models: readonly ModelInfo[], body: unknown): TokenizeInput {
  const b = asObject(body);
  const model = pickModel(models, b.model);
  const returnTokenStrs = optBool(b, "return_token_strs") ?? false;
  if (b.messages !== undefined) {
    refuseUnsupported(b, "chat");
    const chat = parseChatFields(b, toolList(b));
    return {
      model,
      text: model.codec.renderChat(chat.prompt),
      addSpecialTokens: chat.addSpecialTokens,
      returnTokenStrs,
    };
  }
  const prompt = b.prompt;
  if (typeof prompt !== "string") throw badRequest("'prompt' (a string) or 'messages' is required", "prompt");
  return { model, text: prompt, addSpecialTokens: optBool(b, "add_special_tokens") ?? true, returnTokenStrs };
}

/** vLLM's /tokenize answer for `tokens`. */
export function tokenizeAnswer(input: TokenizeInput, tokens: readonly number[]): Record<string, unknown> {
  return {
    count: tokens.length,
    max_model_len: input.model.maxContext,
    tokens,
    token_strs: input.returnTokenStrs ? tokens.map((id) => input.model.codec.tokenString(id)) : null,
  };
}

export function detokenize(models: readonly ModelInfo[], body: unknown): Record<string, unknown> {
  const b = asObject(body);
  const model = pickModel(models, b.model);
  const ids = optTokenIds(b, "tokens", MAX_DETOKENIZE_TOKENS);
  if (ids === undefined) throw badRequest("'tokens' (a list of token ids) is required", "tokens");
  const bad = ids.find((t) => t >= model.codec.vocabSize);
  if (bad !== undefined)
    throw badRequest(`token id ${bad} is outside the vocabulary of ${model.codec.vocabSize}`, "tokens");
  return { prompt: model.codec.decode(ids, { skipSpecialTokens: false }) };
}

/** OpenAI's model object, with vLLM's root, parent and max_model_len. */
export function modelCard(m: ModelInfo): Record<string, unknown> {
  return {
    id: m.id,
    object: "model",
    created: m.created,
    owned_by: "continuum",
    root: m.id,
    parent: null,
    max_model_len: m.maxContext,
  };
}

/** tools for a templated /tokenize (validated like chat's). */
function toolList(b: Body): unknown[] | null {
  const v = b.tools;
  if (v === undefined || v === null) return null;
  if (!Array.isArray(v)) throw badRequest("'tools' must be a list", "tools");
  return v;
}
