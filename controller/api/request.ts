import type { ConstraintSpec } from "../../schema/constraint.ts";
import { ApiError, badRequest } from "./errors.ts";
import { type ChatFields, parseChatFields } from "./request-chat.ts";
import {
  asObject,
  type Body,
  type Endpoint,
  optBool,
  optNumber,
  optObject,
  optString,
  refuseUnsupported,
} from "./request-fields.ts";
import { parseConstraint } from "./request-format.ts";
import { type LogprobsFields, parseLogprobs } from "./request-logprobs.ts";
import { checkMinTokens, parseSampling, type SamplingFields } from "./request-sampling.ts";
import type { ChatMessage } from "./service.ts";
import { parseToolFields, type ToolFields } from "./tools.ts";

/**
 * Parsing and validation of OpenAI-style request bodies, one parser per
 * field group (request-sampling.ts, …). Pure: a parsed request or an
 * ApiError naming the offending field. Fields vLLM's protocol defines that
 * are not implemented are refused (request-fields.ts); fields no protocol
 * defines are ignored, as OpenAI and vLLM do.
 */

/** Bounds that keep one request from monopolising a worker. */
export { MAX_CHOICES, MAX_STOP_SEQUENCES } from "./request-sampling.ts";
export const MAX_PROMPTS = 64;
/** vLLM's default max_tokens for /v1/completions (OpenAI's too). */
export const DEFAULT_MAX_TOKENS = 16;

export type PromptInput =
  | { readonly kind: "text"; readonly text: string }
  | { readonly kind: "tokens"; readonly ids: number[] };

interface CommonRequest extends SamplingFields {
  readonly model: string;
  /** undefined: fill the context (bounded by the model's maximum). */
  readonly maxTokens: number | undefined;
  readonly stream: boolean;
  readonly includeUsageInStream: boolean;
  /** stream_options.continuous_usage_stats: usage in every chunk (vLLM). */
  readonly continuousUsage: boolean;
  /** Skip special tokens when detokenizing (vLLM's default: true). */
  readonly skipSpecialTokens: boolean;
  /** The client's end-user id (logged with the request). */
  readonly user: string | undefined;
  readonly lp: LogprobsFields;
  /** truncate_prompt_tokens: keep this many prompt tokens (-1: the model's maximum); null: all. */
  readonly truncate: { readonly tokens: number | null; readonly side: "left" | "right" };
  /** vLLM's cache_salt: prefixes are shared only with requests of the same salt (and tenant). */
  readonly cacheSalt: string | null;
  /** vLLM's request_id: the response id is built from it (a fresh UUID otherwise). */
  readonly requestId: string | null;
  /** response_format / structured_outputs / guided_*: the grammar the output must follow; null: free. */
  readonly constraint: ConstraintSpec | null;
}

export interface CompletionRequest extends CommonRequest {
  readonly kind: "completion";
  readonly prompts: readonly PromptInput[];
  /** Text prompts get what the tokenizer's post-processor adds (a BOS); vLLM's default: true. */
  readonly addSpecialTokens: boolean;
}

export interface ChatRequest extends CommonRequest {
  readonly kind: "chat";
  readonly chat: ChatFields;
  /** tools / tool_choice / parallel_tool_calls; null: no tools. */
  readonly tools: ToolFields | null;
  /** chat.prompt.messages */
  readonly messages: readonly ChatMessage[];
}

function isTokenArray(v: unknown): v is number[] {
  return (
    Array.isArray(v) && v.length > 0 && v.every((t) => typeof t === "number" && Number.isInteger(t) && t >= 0)
  );
}

function parseTruncation(b: Body): CommonRequest["truncate"] {
  const tokens = optNumber(b, "truncate_prompt_tokens", -1, 1 << 20, true) ?? null;
  if (tokens === 0)
    throw badRequest("'truncate_prompt_tokens' must be -1 or at least 1", "truncate_prompt_tokens");
  const side = b.truncation_side ?? "left";
  if (side !== "left" && side !== "right")
    throw badRequest("'truncation_side' must be 'left' or 'right'", "truncation_side");
  return { tokens, side };
}

/** vLLM: a non-empty string of at most 1024 characters. */
function parseCacheSalt(b: Body): string | null {
  const v = optString(b, "cache_salt", 1024);
  if (v === "") throw badRequest("'cache_salt' must not be empty", "cache_salt");
  return v ?? null;
}

/** Printable ASCII, short enough that "chatcmpl-<id>.<choice>" stays a valid request id. */
function parseRequestId(b: Body): string | null {
  const v = optString(b, "request_id", 96);
  if (v === undefined) return null;
  if (!/^[\x21-\x7e]+$/.test(v))
    throw badRequest("'request_id' must be printable ASCII without spaces", "request_id");
  return v;
}

function parseCommon(b: Body, endpoint: Endpoint, defaultMaxTokens?: number): CommonRequest {
  if (typeof b.model !== "string" || b.model === "")
    throw badRequest("'model' is required and must be a string", "model");
  refuseUnsupported(b, endpoint);
  const stream = optBool(b, "stream") ?? false;
  const lp = parseLogprobs(b, endpoint, stream);
  // max_tokens 0 scores an echoed prompt without generating (completions, vLLM).
  const least = endpoint === "completion" && lp.echo ? 0 : 1;
  const maxTokens =
    optNumber(b, "max_completion_tokens", 1, 1 << 20, true) ??
    optNumber(b, "max_tokens", least, 1 << 20, true) ??
    defaultMaxTokens;
  const sampling = parseSampling(b);
  let includeUsageInStream = false;
  let continuousUsage = false;
  const streamOptions = optObject(b, "stream_options");
  if (streamOptions) {
    if (!stream) throw badRequest("'stream_options' can only be set when 'stream' is true", "stream_options");
    includeUsageInStream = optBool(streamOptions, "include_usage", "stream_options.include_usage") ?? false;
    continuousUsage =
      optBool(streamOptions, "continuous_usage_stats", "stream_options.continuous_usage_stats") ?? false;
  }
  if (stream && sampling.bestOf > sampling.n)
    throw badRequest("'best_of' above n cannot be streamed", "best_of");
  checkMinTokens(sampling.sampling, maxTokens);
  return {
    model: b.model,
    maxTokens,
    ...sampling,
    stream,
    includeUsageInStream,
    continuousUsage,
    skipSpecialTokens: optBool(b, "skip_special_tokens") ?? true,
    user: optString(b, "user", 256),
    lp,
    truncate: parseTruncation(b),
    cacheSalt: parseCacheSalt(b),
    requestId: parseRequestId(b),
    constraint: parseConstraint(b),
  };
}

export function parseCompletionRequest(body: unknown): CompletionRequest {
  const b = asObject(body);
  const common = parseCommon(b, "completion", DEFAULT_MAX_TOKENS);
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
  if (prompts.length * common.bestOf > MAX_PROMPTS) {
    throw badRequest(
      `prompts × ${common.bestOf > common.n ? "best_of" : "n"} must be at most ${MAX_PROMPTS}`,
      common.bestOf > common.n ? "best_of" : "n",
    );
  }
  if (prompts.some((x) => x.kind === "text" && x.text === ""))
    throw badRequest("'prompt' must not be empty", "prompt");
  return {
    kind: "completion",
    ...common,
    prompts,
    addSpecialTokens: optBool(b, "add_special_tokens") ?? true,
  };
}

export function parseChatRequest(body: unknown): ChatRequest {
  const b = asObject(body);
  const common = parseCommon(b, "chat");
  const tools = parseToolFields(b);
  const chat = parseChatFields(b, tools?.raw ?? null);
  if (
    tools &&
    (tools.choice === "required" || typeof tools.choice === "object") &&
    common.constraint !== null
  )
    throw badRequest(
      "you can only either use constraints for structured outputs or a required or named tool, not both",
      "tool_choice",
    );
  return { kind: "chat", ...common, chat, tools, messages: chat.prompt.messages };
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
