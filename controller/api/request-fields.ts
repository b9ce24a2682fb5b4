import { badRequest } from "./errors.ts";
import { describeValue } from "./limits.ts";

/**
 * Typed readers of one request body's fields, each naming the field in its
 * error, and the table of fields vLLM's OpenAI server defines that this one
 * does not implement: a refused field is answered 400 naming it unless its
 * value is the one that changes nothing. Pure.
 */

export type Body = Record<string, unknown>;

export type Endpoint = "completion" | "chat";

export function asObject(body: unknown, what = "request body", param: string | null = null): Body {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw badRequest(`${what} must be a JSON object`, param);
  }
  return body as Body;
}

/** Absent and null both mean "not given", as in vLLM's pydantic models. */
export function given(b: Body, key: string): boolean {
  return b[key] !== undefined && b[key] !== null;
}

export function optNumber(
  b: Body,
  key: string,
  min: number,
  max: number,
  integer: boolean,
  param = key,
): number | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v) || (integer && !Number.isInteger(v))) {
    throw badRequest(
      `'${param}' must be ${integer ? "an integer" : "a number"}, got ${describeValue(v)}`,
      param,
    );
  }
  if (v < min || v > max) throw badRequest(`'${param}' must be between ${min} and ${max}, got ${v}`, param);
  return v;
}

export function optBool(b: Body, key: string, param = key): boolean | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean")
    throw badRequest(`'${param}' must be a boolean, got ${describeValue(v)}`, param);
  return v;
}

export function optString(b: Body, key: string, maxLength: number, param = key): string | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw badRequest(`'${param}' must be a string`, param);
  if (v.length > maxLength) throw badRequest(`'${param}' is longer than ${maxLength} characters`, param);
  return v;
}

export function optObject(b: Body, key: string, param = key): Body | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  return asObject(v, `'${param}'`, param);
}

/** A list of token ids (non-negative integers), at most `max` long. */
export function optTokenIds(b: Body, key: string, max: number): number[] | undefined {
  const v = b[key];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || !v.every((t) => typeof t === "number" && Number.isInteger(t) && t >= 0))
    throw badRequest(`'${key}' must be a list of token ids (non-negative integers)`, key);
  if (v.length > max) throw badRequest(`'${key}' takes at most ${max} token ids`, key);
  return v as number[];
}

/**
 * Fields of vLLM's CompletionRequest / ChatCompletionRequest (and OpenAI's)
 * that this server does not implement, with the values that leave a request
 * unchanged (absent and null always do). Anything else is refused, naming
 * the field: accepting it would silently ignore it.
 */
interface Refusal {
  readonly endpoints: readonly Endpoint[];
  /** Values accepted because they mean "off". */
  readonly neutral: (v: unknown) => boolean;
  readonly why: string;
}

const both: readonly Endpoint[] = ["completion", "chat"];
const chatOnly: readonly Endpoint[] = ["chat"];
const completionOnly: readonly Endpoint[] = ["completion"];
const is = (x: unknown) => (v: unknown) => v === x;
const never = () => false;
const emptyList = (v: unknown) => Array.isArray(v) && v.length === 0;

export const REFUSED_FIELDS: Readonly<Record<string, Refusal>> = {
  suffix: { endpoints: completionOnly, neutral: is(""), why: "insertion (suffix) is not implemented" },
  use_beam_search: { endpoints: both, neutral: is(false), why: "beam search is not implemented" },
  length_penalty: { endpoints: both, neutral: is(1), why: "it applies to beam search only" },
  early_stopping: { endpoints: both, neutral: is(false), why: "it applies to beam search only" },
  watermarking: { endpoints: both, neutral: is(false), why: "watermarking is not implemented" },
  bad_words: { endpoints: both, neutral: emptyList, why: "bad-word lists are not implemented" },
  logprob_token_ids: { endpoints: both, neutral: never, why: "use logprobs / top_logprobs" },
  prompt_embeds: { endpoints: completionOnly, neutral: never, why: "prompts are token ids or text" },
  spaces_between_special_tokens: {
    endpoints: both,
    neutral: is(true),
    why: "detokenization is the fast tokenizer's (no spaces inserted around special tokens is not implemented)",
  },
  session_id: { endpoints: both, neutral: never, why: "sessions are not implemented" },
  routed_experts_prompt_start: {
    endpoints: both,
    neutral: is(0),
    why: "no mixture-of-experts model is served",
  },
  return_token_offsets: { endpoints: both, neutral: is(false), why: "it applies to the render endpoints" },
  return_mm_kwargs: { endpoints: both, neutral: is(true), why: "it applies to the render endpoints" },
  kv_transfer_params: { endpoints: both, neutral: never, why: "disaggregated serving is not implemented" },
  ec_transfer_params: { endpoints: both, neutral: never, why: "disaggregated serving is not implemented" },
  vllm_xargs: { endpoints: both, neutral: never, why: "there are no custom extensions" },
  repetition_detection: { endpoints: both, neutral: never, why: "repetition detection is not implemented" },
  thinking_token_budget: { endpoints: both, neutral: is(-1), why: "reasoning budgets are not implemented" },
  stream_interval: { endpoints: both, neutral: is(1), why: "every token is streamed as it is generated" },
  guided_grammar: { endpoints: both, neutral: never, why: "EBNF grammars are not implemented" },
  guided_decoding_backend: { endpoints: both, neutral: never, why: "there is one built-in backend" },
  guided_whitespace_pattern: { endpoints: both, neutral: never, why: "the JSON whitespace is fixed" },
  reasoning_effort: { endpoints: chatOnly, neutral: never, why: "no reasoning model is served" },
  include_reasoning: { endpoints: chatOnly, neutral: is(true), why: "no reasoning parser is configured" },
  media_io_kwargs: { endpoints: chatOnly, neutral: never, why: "only text is served" },
  mm_processor_kwargs: { endpoints: chatOnly, neutral: never, why: "only text is served" },
  modalities: {
    endpoints: chatOnly,
    neutral: (v) => Array.isArray(v) && v.length === 1 && v[0] === "text",
    why: "only text is served",
  },
  audio: { endpoints: chatOnly, neutral: never, why: "only text is served" },
  prediction: { endpoints: chatOnly, neutral: never, why: "predicted outputs are not implemented" },
  store: { endpoints: chatOnly, neutral: is(false), why: "completions are not stored" },
  metadata: { endpoints: chatOnly, neutral: never, why: "completions are not stored" },
  service_tier: {
    endpoints: both,
    neutral: (v) => v === "auto" || v === "default",
    why: "there is one tier",
  },
  functions: { endpoints: chatOnly, neutral: never, why: "use tools" },
  function_call: { endpoints: chatOnly, neutral: never, why: "use tool_choice" },
  web_search_options: { endpoints: chatOnly, neutral: never, why: "web search is not implemented" },
  verbosity: { endpoints: chatOnly, neutral: never, why: "verbosity is not implemented" },
};

/** Refuses any field of REFUSED_FIELDS (for this endpoint) whose value is not neutral. */
export function refuseUnsupported(b: Body, endpoint: Endpoint): void {
  for (const [key, r] of Object.entries(REFUSED_FIELDS)) {
    if (!given(b, key) || !r.endpoints.includes(endpoint) || r.neutral(b[key])) continue;
    throw badRequest(`'${key}' is not supported: ${r.why}`, key);
  }
}
