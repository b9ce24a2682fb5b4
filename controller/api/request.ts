import { ApiError, badRequest } from "./errors.ts";
import { describeValue } from "./limits.ts";
import type { ChatMessage, SamplingParams } from "./service.ts";

/**
 * Parsing and validation of OpenAI-style request bodies. Pure: a parsed
 * request or an ApiError naming the offending field. Unknown fields are
 * ignored (as OpenAI and vLLM do); known fields of the wrong type or out of
 * range are errors.
 */

/** Bounds that keep one request from monopolising a worker. */
export const MAX_CHOICES = 16;
export const MAX_PROMPTS = 64;
export const MAX_STOP_SEQUENCES = 4;
export const DEFAULT_MAX_TOKENS = 16;

export type PromptInput =
  | { readonly kind: "text"; readonly text: string }
  | { readonly kind: "tokens"; readonly ids: number[] };

interface CommonRequest {
  readonly model: string;
  /** undefined: fill the context (bounded by the model's maximum). */
  readonly maxTokens: number | undefined;
  readonly sampling: SamplingParams;
  readonly stop: readonly string[];
  readonly n: number;
  readonly stream: boolean;
  readonly includeUsageInStream: boolean;
}

export interface CompletionRequest extends CommonRequest {
  readonly kind: "completion";
  readonly prompts: readonly PromptInput[];
}

export interface ChatRequest extends CommonRequest {
  readonly kind: "chat";
  readonly messages: readonly ChatMessage[];
}

type Body = Record<string, unknown>;

function asObject(body: unknown): Body {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw badRequest("request body must be a JSON object");
  }
  return body as Body;
}

function optNumber(b: Body, key: string, min: number, max: number, integer: boolean): number | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v) || (integer && !Number.isInteger(v))) {
    throw badRequest(`'${key}' must be ${integer ? "an integer" : "a number"}, got ${describeValue(v)}`, key);
  }
  if (v < min || v > max) throw badRequest(`'${key}' must be between ${min} and ${max}, got ${v}`, key);
  return v;
}

function optBool(b: Body, key: string): boolean | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw badRequest(`'${key}' must be a boolean, got ${describeValue(v)}`, key);
  return v;
}

function isTokenArray(v: unknown): v is number[] {
  return (
    Array.isArray(v) && v.length > 0 && v.every((t) => typeof t === "number" && Number.isInteger(t) && t >= 0)
  );
}

function parseStop(b: Body): string[] {
  const v = b.stop;
  if (v === undefined || v === null) return [];
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list) || list.some((s) => typeof s !== "string" || s === "")) {
    throw badRequest("'stop' must be a non-empty string or a list of non-empty strings", "stop");
  }
  if (list.length > MAX_STOP_SEQUENCES)
    throw badRequest(`'stop' takes at most ${MAX_STOP_SEQUENCES} sequences`, "stop");
  return list as string[];
}

/** Parameters that would change results in ways we do not implement are refused, not ignored. */
function refuseUnsupported(b: Body): void {
  for (const key of ["presence_penalty", "frequency_penalty"]) {
    const v = b[key];
    if (v !== undefined && v !== null && v !== 0) throw badRequest(`'${key}' is not supported (only 0)`, key);
  }
  if (b.logprobs !== undefined && b.logprobs !== null && b.logprobs !== false && b.logprobs !== 0) {
    throw badRequest("'logprobs' is not supported", "logprobs");
  }
  if (b.echo === true) throw badRequest("'echo' is not supported", "echo");
  if (b.logit_bias !== undefined && b.logit_bias !== null)
    throw badRequest("'logit_bias' is not supported", "logit_bias");
  if (b.tools !== undefined && b.tools !== null) throw badRequest("'tools' is not supported", "tools");
}

function parseCommon(b: Body): CommonRequest {
  if (typeof b.model !== "string" || b.model === "")
    throw badRequest("'model' is required and must be a string", "model");
  refuseUnsupported(b);
  const maxTokens =
    optNumber(b, "max_completion_tokens", 1, 1 << 20, true) ?? optNumber(b, "max_tokens", 1, 1 << 20, true);
  const temperature = optNumber(b, "temperature", 0, 2, false) ?? 1;
  const topP = optNumber(b, "top_p", Number.MIN_VALUE, 1, false) ?? 1;
  const topKRaw = optNumber(b, "top_k", -1, 1 << 20, true) ?? 0;
  const seed = optNumber(b, "seed", -(2 ** 53) + 1, 2 ** 53 - 1, true);
  const n = optNumber(b, "n", 1, MAX_CHOICES, true) ?? 1;
  const stream = optBool(b, "stream") ?? false;
  let includeUsageInStream = false;
  if (b.stream_options !== undefined && b.stream_options !== null) {
    if (typeof b.stream_options !== "object" || Array.isArray(b.stream_options)) {
      throw badRequest("'stream_options' must be an object", "stream_options");
    }
    includeUsageInStream = optBool(b.stream_options as Body, "include_usage") ?? false;
  }
  return {
    model: b.model,
    maxTokens,
    sampling: { temperature, topP, topK: Math.max(0, topKRaw), seed },
    stop: parseStop(b),
    n,
    stream,
    includeUsageInStream,
  };
}

export function parseCompletionRequest(body: unknown): CompletionRequest {
  const b = asObject(body);
  const common = parseCommon(b);
  const p = b.prompt;
  let prompts: PromptInput[];
  if (typeof p === "string") prompts = [{ kind: "text", text: p }];
  else if (isTokenArray(p)) prompts = [{ kind: "tokens", ids: p }];
  else if (Array.isArray(p) && p.length > 0 && p.every((x) => typeof x === "string")) {
    prompts = (p as string[]).map((text) => ({ kind: "text", text }));
  } else if (Array.isArray(p) && p.length > 0 && p.every(isTokenArray)) {
    prompts = (p as number[][]).map((ids) => ({ kind: "tokens", ids }));
  } else {
    throw badRequest(
      "'prompt' is required: a string, a list of strings, a list of token ids, or a list of token-id lists",
      "prompt",
    );
  }
  if (prompts.length > MAX_PROMPTS) throw badRequest(`at most ${MAX_PROMPTS} prompts per request`, "prompt");
  if (prompts.length * common.n > MAX_PROMPTS) {
    throw badRequest(`prompts × n must be at most ${MAX_PROMPTS}`, "n");
  }
  if (prompts.some((x) => x.kind === "text" && x.text === ""))
    throw badRequest("'prompt' must not be empty", "prompt");
  return { kind: "completion", ...common, prompts };
}

const ROLES = new Set(["system", "user", "assistant", "tool"]);

function messageText(content: unknown, i: number): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    const parts: string[] = [];
    for (const part of content) {
      if (typeof part !== "object" || part === null || (part as Body).type !== "text") {
        throw badRequest(`messages[${i}].content: only text parts are supported`, `messages[${i}].content`);
      }
      const text = (part as Body).text;
      if (typeof text !== "string")
        throw badRequest(`messages[${i}].content: a text part needs 'text'`, `messages[${i}].content`);
      parts.push(text);
    }
    return parts.join("");
  }
  throw badRequest(
    `messages[${i}].content must be a string or a list of text parts`,
    `messages[${i}].content`,
  );
}

export function parseChatRequest(body: unknown): ChatRequest {
  const b = asObject(body);
  const common = parseCommon(b);
  const raw = b.messages;
  if (!Array.isArray(raw) || raw.length === 0)
    throw badRequest("'messages' must be a non-empty list", "messages");
  const messages: ChatMessage[] = raw.map((m, i) => {
    if (typeof m !== "object" || m === null)
      throw badRequest(`messages[${i}] must be an object`, `messages[${i}]`);
    const role = (m as Body).role;
    if (typeof role !== "string" || !ROLES.has(role)) {
      throw badRequest(
        `messages[${i}].role must be one of system, user, assistant, tool`,
        `messages[${i}].role`,
      );
    }
    return { role: role as ChatMessage["role"], content: messageText((m as Body).content, i) };
  });
  return { kind: "chat", ...common, messages };
}

/** Prompt plus generation must fit the model's context. */
export function checkContext(
  promptTokens: number,
  maxTokens: number | undefined,
  maxContext: number,
): number {
  if (promptTokens === 0) throw badRequest("the prompt is empty after tokenization", "prompt");
  if (promptTokens >= maxContext) {
    throw new ApiError(
      400,
      `this model's maximum context length is ${maxContext} tokens; the prompt has ${promptTokens}`,
      "invalid_request_error",
      "prompt",
      "context_length_exceeded",
    );
  }
  const budget = maxContext - promptTokens;
  if (maxTokens === undefined) return budget;
  if (maxTokens > budget) {
    throw new ApiError(
      400,
      `this model's maximum context length is ${maxContext} tokens; the prompt has ${promptTokens} and max_tokens is ${maxTokens}`,
      "invalid_request_error",
      "max_tokens",
      "context_length_exceeded",
    );
  }
  return maxTokens;
}
