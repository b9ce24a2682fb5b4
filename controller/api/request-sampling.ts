import { badRequest } from "./errors.ts";
import { describeValue } from "./limits.ts";
import { type Body, optBool, optNumber, optTokenIds } from "./request-fields.ts";
import type { SamplingParams } from "./service.ts";

/**
 * The sampling and stopping fields of a completion or chat request, with
 * vLLM's names, defaults and bounds (SamplingParams._verify_args). Pure.
 */

export const MAX_CHOICES = 16;
export const MAX_STOP_SEQUENCES = 16;
export const MAX_STOP_LENGTH = 256;
/** Bound on stop_token_ids, allowed_token_ids and logit_bias entries. */
export const MAX_TOKEN_LIST = 4096;

/** How generation ends, beyond max_tokens. */
export interface StopRules {
  /** Stop strings: the text ends before the first one (included with includeStopStr). */
  readonly strings: readonly string[];
  /** stop_token_ids: generation ends after emitting one (its text is dropped unless includeStopStr). */
  readonly tokenIds: readonly number[];
  readonly includeStopStr: boolean;
  /** The model's EOS ids do not end generation. */
  readonly ignoreEos: boolean;
}

export interface SamplingFields {
  readonly sampling: SamplingParams;
  readonly stop: StopRules;
  readonly n: number;
  /** Choices generated per prompt before the n best are kept (≥ n). */
  readonly bestOf: number;
  /** vLLM's priority: lower is served first. */
  readonly priority: number;
}

function parseStopStrings(b: Body): string[] {
  const v = b.stop;
  if (v === undefined || v === null) return [];
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list) || list.some((s) => typeof s !== "string" || s === "")) {
    throw badRequest("'stop' must be a non-empty string or a list of non-empty strings", "stop");
  }
  if (list.length > MAX_STOP_SEQUENCES)
    throw badRequest(`'stop' takes at most ${MAX_STOP_SEQUENCES} sequences`, "stop");
  if (list.some((s: string) => s.length > MAX_STOP_LENGTH))
    throw badRequest(`a stop sequence is longer than ${MAX_STOP_LENGTH} characters`, "stop");
  return list as string[];
}

/** logit_bias: {"token id": bias}; biases are clamped to [-100, 100] as OpenAI and vLLM do. */
function parseLogitBias(b: Body): (readonly [number, number])[] {
  const v = b.logit_bias;
  if (v === undefined || v === null) return [];
  if (typeof v !== "object" || Array.isArray(v))
    throw badRequest("'logit_bias' must map token ids to biases", "logit_bias");
  const entries = Object.entries(v as Body);
  if (entries.length > MAX_TOKEN_LIST)
    throw badRequest(`'logit_bias' takes at most ${MAX_TOKEN_LIST} entries`, "logit_bias");
  return entries.map(([key, bias]) => {
    const id = Number(key);
    if (!/^\d+$/.test(key) || !Number.isSafeInteger(id))
      throw badRequest(`'logit_bias' key ${describeValue(key)} is not a token id`, "logit_bias");
    if (typeof bias !== "number" || !Number.isFinite(bias))
      throw badRequest(`'logit_bias' value for ${key} must be a number`, "logit_bias");
    return [id, Math.max(-100, Math.min(100, bias))] as const;
  });
}

export function parseSampling(b: Body): SamplingFields {
  const temperature = optNumber(b, "temperature", 0, 2, false) ?? 1;
  const topP = optNumber(b, "top_p", Number.MIN_VALUE, 1, false) ?? 1;
  // -1 and 0 both disable top-k in vLLM.
  const topK = Math.max(0, optNumber(b, "top_k", -1, 1 << 20, true) ?? 0);
  const minP = optNumber(b, "min_p", 0, 1, false) ?? 0;
  const seed = optNumber(b, "seed", -(2 ** 53) + 1, 2 ** 53 - 1, true);
  const repetitionPenalty = optNumber(b, "repetition_penalty", Number.MIN_VALUE, 1e6, false) ?? 1;
  const presencePenalty = optNumber(b, "presence_penalty", -2, 2, false) ?? 0;
  const frequencyPenalty = optNumber(b, "frequency_penalty", -2, 2, false) ?? 0;
  const minTokens = optNumber(b, "min_tokens", 0, 1 << 20, true) ?? 0;
  const allowed = optTokenIds(b, "allowed_token_ids", MAX_TOKEN_LIST);
  if (allowed !== undefined && allowed.length === 0)
    throw badRequest("'allowed_token_ids' must not be empty", "allowed_token_ids");
  const n = optNumber(b, "n", 1, MAX_CHOICES, true) ?? 1;
  const bestOf = optNumber(b, "best_of", 1, MAX_CHOICES, true) ?? n;
  if (bestOf < n) throw badRequest(`'best_of' (${bestOf}) must be at least n (${n})`, "best_of");
  const priority = optNumber(b, "priority", -(2 ** 31), 2 ** 31 - 1, true) ?? 0;
  const stop: StopRules = {
    strings: parseStopStrings(b),
    tokenIds: optTokenIds(b, "stop_token_ids", MAX_TOKEN_LIST) ?? [],
    includeStopStr: optBool(b, "include_stop_str_in_output") ?? false,
    ignoreEos: optBool(b, "ignore_eos") ?? false,
  };
  return {
    sampling: {
      temperature,
      topP,
      topK,
      minP,
      seed,
      repetitionPenalty,
      presencePenalty,
      frequencyPenalty,
      logitBias: parseLogitBias(b),
      minTokens,
      allowedTokenIds: allowed ?? null,
    },
    stop,
    n,
    bestOf,
    priority,
  };
}

/** min_tokens may not exceed the generation budget (vLLM's check). */
export function checkMinTokens(sampling: SamplingParams, maxTokens: number | undefined): void {
  if (maxTokens !== undefined && sampling.minTokens > maxTokens)
    throw badRequest(
      `'min_tokens' (${sampling.minTokens}) must be at most max_tokens (${maxTokens})`,
      "min_tokens",
    );
}

/** Every token id a request names (bias, allowed, stop) must be in the vocabulary. */
export function checkTokenIds(sampling: SamplingParams, stop: StopRules, vocabSize: number): void {
  const check = (ids: Iterable<number>, param: string) => {
    for (const id of ids)
      if (id >= vocabSize)
        throw badRequest(`'${param}' has token id ${id}, outside the vocabulary of ${vocabSize}`, param);
  };
  check(
    sampling.logitBias.map(([id]) => id),
    "logit_bias",
  );
  check(sampling.allowedTokenIds ?? [], "allowed_token_ids");
  check(stop.tokenIds, "stop_token_ids");
}
