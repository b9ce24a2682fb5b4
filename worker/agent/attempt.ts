import type { Decline, Offer } from "../../schema/control.ts";
import { RequestId } from "../../schema/ids.ts";
import { logitsRules, type TokenLogprob } from "../model/logits.ts";
import type { RequestTiming, RuntimeGeneration, SubmitRequest } from "../runtime/runtime-api.ts";

/** One accepted attempt as the agent runs it: its generation and what is still to send. */
export interface RunningAttempt {
  readonly requestId: RequestId;
  readonly attempt: number;
  readonly generation: RuntimeGeneration;
  readonly prompt: readonly number[];
  readonly salt: string | undefined;
  /** Prompt tokens still to prefill (for the heartbeat's queue): not those resident or planned to be restored. */
  readonly queuedTokens: number;
  readonly acceptedAt: number;
  /** Set by a cancel or a lost connection: nothing more of this attempt is sent. */
  fenced: boolean;
  firstTokenAt: number | null;
  sent: number;
  readonly pending: number[];
  /** The pending tokens' log-probabilities, when the offer asked for them (null: not asked). */
  readonly pendingLogprobs: TokenLogprob[] | null;
  /** The prompt's scores until the first frame carries them. */
  promptLogprobs: readonly TokenLogprob[] | null;
  readonly generated: number[];
  flushScheduled: boolean;
}

/** The runtime's id for one attempt: attempts of one request never share a runtime slot. */
export function runtimeId(requestId: RequestId, attempt: number): RequestId {
  return RequestId(`${requestId}#${attempt}`);
}

/** The runtime request an accepted offer becomes (sampling defaults filled, the constraint compiled). */
export function submitRequest(
  offer: Offer,
  salt: string | undefined,
  defaultStopTokenIds: readonly number[],
  compile: (spec: NonNullable<Offer["constraint"]>) => NonNullable<SubmitRequest["constraint"]>,
): SubmitRequest {
  const s = offer.sampling;
  return {
    requestId: runtimeId(offer.requestId, offer.attempt),
    salt,
    prompt: offer.prompt,
    maxTokens: offer.maxTokens,
    temperature: s.temperature ?? 1,
    topP: s.topP ?? 1,
    topK: s.topK ?? 0,
    minP: s.minP ?? 0,
    seed: s.seed,
    rules: logitsRules(s),
    stopTokenIds: offer.stopTokenIds ?? defaultStopTokenIds,
    priority: offer.priority ?? 0,
    ...(offer.logprobs === undefined ? {} : { logprobs: offer.logprobs }),
    ...(offer.promptLogprobs === undefined ? {} : { promptLogprobs: offer.promptLogprobs }),
    ...(offer.constraint === undefined ? {} : { constraint: compile(offer.constraint) }),
  };
}

/** The decline reason for a runtime refusal's HTTP-like status. */
export function declineReason(status: number): Decline["reason"] {
  return status === 503 ? "draining" : status === 429 ? "pages_short" : "context_too_long";
}

/** A fresh attempt; to prefill: the prompt less what is resident here or, by the router's plan, restored. */
export function newAttempt(
  offer: Offer,
  generation: RuntimeGeneration,
  salt: string | undefined,
  sharedPages: number,
  pageTokens: number,
): RunningAttempt {
  return {
    requestId: offer.requestId,
    attempt: offer.attempt,
    generation,
    prompt: offer.prompt,
    salt,
    queuedTokens: Math.max(
      0,
      offer.prompt.length - Math.max(sharedPages * pageTokens, offer.plan.cachedTokens),
    ),
    acceptedAt: performance.now(),
    fenced: false,
    firstTokenAt: null,
    sent: 0,
    pending: [],
    pendingLogprobs: offer.logprobs === undefined ? null : [],
    promptLogprobs: null,
    generated: [],
    flushScheduled: false,
  };
}

/** A measured TTFT split by the router's terms; prefill is the rest (never below 0). */
export function measuredTerms(
  ttftMs: number,
  t: RequestTiming,
): { queueMs: number; fetchMs: number; prefillMs: number } {
  const queueMs = Math.max(0, Math.min(ttftMs, t.queueMs ?? 0));
  const fetchMs = Math.max(0, Math.min(ttftMs - queueMs, t.fetchMs));
  return { queueMs, fetchMs, prefillMs: Math.max(0, ttftMs - queueMs - fetchMs) };
}
