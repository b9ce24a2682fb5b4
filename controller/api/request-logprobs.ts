import { badRequest } from "./errors.ts";
import { type Body, type Endpoint, given, optBool, optNumber } from "./request-fields.ts";

/**
 * The log-probability and echo fields (vLLM's names and checks). Pure.
 *
 * completions: `logprobs` (int) alternatives per generated token; `echo`
 * prepends the prompt (its text, and with logprobs its tokens' entries);
 * `max_tokens: 0` with echo scores the prompt without generating.
 * chat: `logprobs` (bool) with `top_logprobs` (int); `echo` prepends the last
 * message's content when it is the assistant's (vLLM).
 * both: `prompt_logprobs` (int) returns vLLM's `prompt_logprobs` list.
 */

/** vLLM's default --max-logprobs. */
export const MAX_LOGPROBS = 20;

export interface LogprobsFields {
  /** Alternatives per generated token (0: the token's own only); null: no log-probabilities. */
  readonly logprobs: number | null;
  /** vLLM's prompt_logprobs: alternatives per prompt position; null: not returned. */
  readonly promptLogprobs: number | null;
  readonly echo: boolean;
  /** 'token_id:N' instead of token text (vLLM's return_tokens_as_token_ids). */
  readonly tokensAsIds: boolean;
  /** token_ids / prompt_token_ids in the response (vLLM's return_token_ids). */
  readonly returnTokenIds: boolean;
}

function count(b: Body, key: string): number | null {
  if (given(b, key) && b[key] === -1)
    throw badRequest(`'${key}': -1 (the whole vocabulary) is not supported; at most ${MAX_LOGPROBS}`, key);
  return optNumber(b, key, 0, MAX_LOGPROBS, true) ?? null;
}

export function parseLogprobs(b: Body, endpoint: Endpoint, stream: boolean): LogprobsFields {
  let logprobs: number | null;
  if (endpoint === "completion") {
    logprobs = count(b, "logprobs");
  } else {
    const on = optBool(b, "logprobs") ?? false;
    const top = count(b, "top_logprobs") ?? 0;
    if (top > 0 && !on)
      throw badRequest("when using 'top_logprobs', 'logprobs' must be set to true", "top_logprobs");
    logprobs = on ? top : null;
  }
  const promptLogprobs = count(b, "prompt_logprobs");
  if (promptLogprobs !== null && stream)
    throw badRequest("'prompt_logprobs' is not available when 'stream' is true", "prompt_logprobs");
  return {
    logprobs,
    promptLogprobs,
    echo: optBool(b, "echo") ?? false,
    tokensAsIds: optBool(b, "return_tokens_as_token_ids") ?? false,
    returnTokenIds: optBool(b, "return_token_ids") ?? false,
  };
}

/**
 * What the worker must score: the prompt when prompt_logprobs is asked for,
 * or when a completion echoes its prompt with logprobs (the legacy shape
 * lists the prompt's tokens first).
 */
export function promptScoring(f: LogprobsFields, endpoint: Endpoint): number | null {
  const forEcho = endpoint === "completion" && f.echo && f.logprobs !== null ? f.logprobs : null;
  if (forEcho === null) return f.promptLogprobs;
  return Math.max(forEcho, f.promptLogprobs ?? 0);
}
