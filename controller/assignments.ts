import type { Accept, CandidateRecord, Decline, Result, Tokens } from "../schema/control.ts";
import type { RequestId, WorkerId } from "../schema/ids.ts";
import type { Outstanding } from "./router.ts";

/**
 * Fenced assignments: the controller's state machine for one request (pure).
 *
 * Each offer is one attempt, named `(requestId, attempt)`; attempts strictly
 * increase. A decline, an offer or progress timeout, a failed result or the
 * loss of the worker moves to the next candidate (the driver re-routes,
 * excluding every worker already tried) with attempt + 1. A message of any
 * other attempt, or from another worker, is late: it is ignored and counted,
 * and an accept or tokens from it is answered with a cancel so that worker
 * releases its reservation.
 *
 * Exactly one attempt ever streams to the client. Once tokens of attempt k
 * were delivered, a failure of k fails the request ("lost_mid_stream",
 * "stream_gap") instead of switching to another worker: a second worker
 * would regenerate from the prompt, and with sampling its tokens need not
 * continue the ones already sent. Resuming would need the partial
 * continuation checkpointed and the sampler state carried over; until then a
 * clear failure beats a silent splice.
 *
 * Every request ends: at most `maxAttempts` offers, and at `arrival +
 * requestDeadlineMs` the next tick fails whatever is still open.
 */

export interface AssignmentLimits {
  /** Offers per request (each one attempt). */
  readonly maxAttempts: number;
  /** Offer sent → accept (or first tokens) received. */
  readonly offerTimeoutMs: number;
  /** Accept → first tokens, and between tokens frames. */
  readonly progressTimeoutMs: number;
  /** Arrival → completed or failed, whatever happens. */
  readonly requestDeadlineMs: number;
}

export const defaultAssignmentLimits: AssignmentLimits = {
  maxAttempts: 4,
  offerTimeoutMs: 5_000,
  progressTimeoutMs: 10_000,
  requestDeadlineMs: 120_000,
};

export type Phase = "routing" | "offered" | "accepted" | "streaming" | "completed" | "failed";

export const FailureReasons = [
  "no_worker",
  "attempts_exhausted",
  "deadline",
  "lost_mid_stream",
  "stream_gap",
  "cancelled",
] as const;
export type FailureReason = (typeof FailureReasons)[number];

export interface AssignmentState {
  readonly requestId: RequestId;
  readonly arrivalMs: number;
  /** Prompt length (with cached tokens of the choice, the work still to prefill). */
  readonly promptTokens: number;
  readonly phase: Phase;
  /** The current attempt (0 before the first offer). */
  readonly attempt: number;
  /** The worker holding the current attempt; null while routing and before any offer. */
  readonly workerId: WorkerId | null;
  /** The candidate of the current attempt (prompt tokens still to prefill feed the load term). */
  readonly choice: CandidateRecord | null;
  /** Workers already offered this request; a re-route excludes them. */
  readonly tried: readonly WorkerId[];
  /** When the current phase times out (offered, accepted, streaming). */
  readonly phaseDeadlineMs: number;
  /** Tokens delivered to the client, all from `streamAttempt`. */
  readonly delivered: number;
  readonly streamAttempt: number | null;
  readonly firstTokenAtMs: number | null;
  readonly failure: FailureReason | null;
  /** Why, in words (the last attempt's failure, or the request's). */
  readonly detail: string;
  /** Messages of other attempts (or other workers) ignored. */
  readonly lateIgnored: number;
  /** Repeated messages of the current attempt ignored. */
  readonly duplicates: number;
}

export type AssignmentEvent =
  /** The router's answer for the next attempt (the driver routes when told to). */
  | { readonly type: "routed"; readonly choice: CandidateRecord | null }
  | { readonly type: "accept"; readonly msg: Accept }
  | { readonly type: "decline"; readonly msg: Decline }
  | { readonly type: "tokens"; readonly msg: Tokens }
  | { readonly type: "result"; readonly msg: Result }
  /** The worker's connection closed or its heartbeat expired. */
  | { readonly type: "worker_lost"; readonly workerId: WorkerId }
  /** Logical time passed (timeouts and the deadline are checked). */
  | { readonly type: "tick" }
  /** The client went away. */
  | { readonly type: "cancel"; readonly reason: string };

export type AssignmentCommand =
  /** Route again for `attempt`, excluding `exclude`; answer with a `routed` event. */
  | { readonly type: "route"; readonly attempt: number; readonly exclude: readonly WorkerId[] }
  | {
      readonly type: "offer";
      readonly workerId: WorkerId;
      readonly attempt: number;
      readonly choice: CandidateRecord;
    }
  | {
      readonly type: "cancel";
      readonly workerId: WorkerId;
      readonly attempt: number;
      readonly reason: string;
    }
  /** Stream tokens to the client (index: position of tokens[0] in the output). */
  | {
      readonly type: "deliver";
      readonly attempt: number;
      readonly index: number;
      readonly tokens: readonly number[];
      /** One per token, when the offer asked for log-probabilities. */
      readonly logprobs?: Tokens["logprobs"];
      /** On the first delivery of a request that scores its prompt. */
      readonly promptLogprobs?: Tokens["promptLogprobs"];
    }
  | {
      readonly type: "finish";
      readonly outcome: "completed" | "failed";
      readonly reason: FailureReason | null;
      readonly detail: string;
    };

export interface Step {
  readonly state: AssignmentState;
  readonly commands: AssignmentCommand[];
}

export function isTerminal(s: AssignmentState): boolean {
  return s.phase === "completed" || s.phase === "failed";
}

/** A new request: the driver is told to route attempt 1. */
export function startAssignment(requestId: RequestId, promptTokens: number, nowMs: number): Step {
  const state: AssignmentState = {
    requestId,
    arrivalMs: nowMs,
    promptTokens,
    phase: "routing",
    attempt: 0,
    workerId: null,
    choice: null,
    tried: [],
    phaseDeadlineMs: Number.POSITIVE_INFINITY,
    delivered: 0,
    streamAttempt: null,
    firstTokenAtMs: null,
    failure: null,
    detail: "",
    lateIgnored: 0,
    duplicates: 0,
  };
  return { state, commands: [{ type: "route", attempt: 1, exclude: [] }] };
}

function fail(
  s: AssignmentState,
  reason: FailureReason,
  detail: string,
  commands: AssignmentCommand[],
): Step {
  if (s.workerId !== null && (s.phase === "offered" || s.phase === "accepted" || s.phase === "streaming")) {
    commands.push({ type: "cancel", workerId: s.workerId, attempt: s.attempt, reason });
  }
  commands.push({ type: "finish", outcome: "failed", reason, detail });
  return { state: { ...s, phase: "failed", failure: reason, detail }, commands };
}

/**
 * The current attempt failed. Before any token reached the client the request
 * moves on (cancel the old attempt, re-route excluding every tried worker);
 * after, it fails: tokens of two attempts are never spliced.
 */
function attemptFailed(
  s: AssignmentState,
  limits: AssignmentLimits,
  detail: string,
  cancelOld: boolean,
): Step {
  const commands: AssignmentCommand[] = [];
  if (s.delivered > 0) return fail(s, "lost_mid_stream", detail, commands);
  if (cancelOld && s.workerId !== null) {
    commands.push({ type: "cancel", workerId: s.workerId, attempt: s.attempt, reason: detail });
  }
  if (s.attempt >= limits.maxAttempts) {
    return fail(
      { ...s, workerId: null },
      "attempts_exhausted",
      `${s.attempt} attempts; last: ${detail}`,
      commands,
    );
  }
  commands.push({ type: "route", attempt: s.attempt + 1, exclude: s.tried });
  return {
    state: {
      ...s,
      phase: "routing",
      workerId: null,
      choice: null,
      phaseDeadlineMs: Number.POSITIVE_INFINITY,
      detail,
    },
    commands,
  };
}

type AttemptMessage = Accept | Decline | Tokens | Result;

/** Ignores a message that is not of the current attempt; an accept or tokens from it gets a cancel back. */
function late(s: AssignmentState, type: AssignmentEvent["type"], msg: AttemptMessage): Step {
  const commands: AssignmentCommand[] = [];
  if (type === "accept" || type === "tokens") {
    commands.push({
      type: "cancel",
      workerId: msg.workerId,
      attempt: msg.attempt,
      reason: "fenced: stale attempt",
    });
  }
  return { state: { ...s, lateIgnored: s.lateIgnored + 1 }, commands };
}

function duplicate(s: AssignmentState): Step {
  return { state: { ...s, duplicates: s.duplicates + 1 }, commands: [] };
}

/** Applies one event at logical time `nowMs`. */
export function stepAssignment(
  s: AssignmentState,
  event: AssignmentEvent,
  nowMs: number,
  limits: AssignmentLimits,
): Step {
  switch (event.type) {
    case "routed": {
      if (s.phase !== "routing") return { state: s, commands: [] };
      const attempt = s.attempt + 1;
      if (event.choice === null) {
        const reason: FailureReason = s.tried.length === 0 ? "no_worker" : "attempts_exhausted";
        const detail =
          s.tried.length === 0
            ? "no live worker can serve this request"
            : `no candidate left after ${s.tried.length} worker(s)${s.detail ? `; last: ${s.detail}` : ""}`;
        return fail(s, reason, detail, []);
      }
      const w = event.choice.workerId;
      if (s.tried.includes(w)) throw new Error(`router offered ${w} again for ${s.requestId}`);
      return {
        state: {
          ...s,
          phase: "offered",
          attempt,
          workerId: w,
          choice: event.choice,
          tried: [...s.tried, w],
          phaseDeadlineMs: nowMs + limits.offerTimeoutMs,
        },
        commands: [{ type: "offer", workerId: w, attempt, choice: event.choice }],
      };
    }

    case "accept":
    case "decline":
    case "tokens":
    case "result": {
      const msg = event.msg;
      if (msg.requestId !== s.requestId) {
        throw new Error(`message for ${msg.requestId} applied to ${s.requestId}`);
      }
      if (isTerminal(s)) {
        // A repeat of the attempt that completed is a duplicate; anything else is late
        // (and an accept or tokens from it is cancelled so the worker stops and releases).
        if (s.phase === "completed" && msg.attempt === s.attempt && msg.workerId === s.workerId)
          return duplicate(s);
        return late(s, event.type, msg);
      }
      if (msg.attempt !== s.attempt || msg.workerId !== s.workerId) return late(s, event.type, msg);
      return onCurrent(s, event, nowMs, limits);
    }

    case "worker_lost": {
      if (s.workerId !== event.workerId || isTerminal(s) || s.phase === "routing")
        return { state: s, commands: [] };
      return attemptFailed(s, limits, `worker ${event.workerId} lost`, true);
    }

    case "tick": {
      if (isTerminal(s)) return { state: s, commands: [] };
      if (nowMs >= s.arrivalMs + limits.requestDeadlineMs) {
        return fail(s, "deadline", `not finished within ${limits.requestDeadlineMs} ms`, []);
      }
      if (nowMs >= s.phaseDeadlineMs) {
        const what = s.phase === "offered" ? "no accept" : "no progress";
        return attemptFailed(s, limits, `${what} from ${s.workerId} within the timeout`, true);
      }
      return { state: s, commands: [] };
    }

    case "cancel": {
      if (isTerminal(s)) return { state: s, commands: [] };
      return fail(s, "cancelled", event.reason, []);
    }
  }
}

function onCurrent(
  s: AssignmentState,
  event: Extract<AssignmentEvent, { type: "accept" | "decline" | "tokens" | "result" }>,
  nowMs: number,
  limits: AssignmentLimits,
): Step {
  switch (event.type) {
    case "accept":
      if (s.phase !== "offered") return duplicate(s);
      return {
        state: { ...s, phase: "accepted", phaseDeadlineMs: nowMs + limits.progressTimeoutMs },
        commands: [],
      };

    case "decline":
      // A decline after an accept or tokens of the same attempt is a worker bug; ignore it.
      if (s.phase !== "offered") return duplicate(s);
      return attemptFailed(
        s,
        limits,
        `${s.workerId} declined: ${event.msg.reason} (${event.msg.detail})`,
        false,
      );

    case "tokens": {
      const { index, tokens } = event.msg;
      const end = index + tokens.length;
      if (end <= s.delivered) return duplicate(s);
      if (index > s.delivered) {
        // A frame was lost: the stream of this attempt can no longer be completed in order.
        if (s.delivered > 0) {
          return fail(s, "stream_gap", `tokens ${s.delivered}..${index} of attempt ${s.attempt} lost`, []);
        }
        return attemptFailed(s, limits, `first tokens of attempt ${s.attempt} lost`, true);
      }
      const fresh = tokens.slice(s.delivered - index);
      const lp = event.msg.logprobs;
      const scores = event.msg.promptLogprobs;
      const extras = {
        ...(lp === undefined ? {} : { logprobs: lp.slice(s.delivered - index) }),
        ...(scores === undefined || s.delivered > 0 ? {} : { promptLogprobs: scores }),
      };
      return {
        state: {
          ...s,
          phase: "streaming",
          delivered: end,
          streamAttempt: s.attempt,
          firstTokenAtMs: s.firstTokenAtMs ?? nowMs,
          phaseDeadlineMs: nowMs + limits.progressTimeoutMs,
        },
        commands: [{ type: "deliver", attempt: s.attempt, index: s.delivered, tokens: fresh, ...extras }],
      };
    }

    case "result": {
      const r = event.msg;
      if (r.outcome === "failed") {
        return attemptFailed(s, limits, `${s.workerId} failed: ${r.reason}`, false);
      }
      if (r.tokensTotal !== s.delivered) {
        if (s.delivered > 0) {
          return fail(s, "stream_gap", `completed with ${r.tokensTotal} tokens, ${s.delivered} arrived`, []);
        }
        return attemptFailed(s, limits, `attempt ${s.attempt} completed but its tokens were lost`, false);
      }
      return {
        state: { ...s, phase: "completed", phaseDeadlineMs: Number.POSITIVE_INFINITY },
        commands: [{ type: "finish", outcome: "completed", reason: null, detail: r.finishReason }],
      };
    }
  }
}

/** An attempt's prompt tokens still to prefill as its worker last reported them (undefined: not reported). */
export type PrefillRemaining = (
  workerId: WorkerId,
  requestId: RequestId,
  attempt: number,
) => number | undefined;

/**
 * The controller's own count of outstanding work per worker: attempts offered
 * or accepted whose first token has not arrived (with the prompt tokens they
 * still have to prefill: the worker's last report where it gave one, never
 * more than the routing estimate) and attempts streaming. Feeds the router's
 * load terms.
 */
export function outstandingByWorker(
  states: Iterable<AssignmentState>,
  remaining: PrefillRemaining = () => undefined,
): Map<WorkerId, Outstanding> {
  const out = new Map<WorkerId, { requests: number; tokens: number; running: number }>();
  for (const s of states) {
    if (s.workerId === null || s.choice === null) continue;
    const waiting = s.phase === "offered" || s.phase === "accepted";
    if (!waiting && s.phase !== "streaming") continue;
    const o = out.get(s.workerId) ?? { requests: 0, tokens: 0, running: 0 };
    if (waiting) {
      o.requests += 1;
      const routed = Math.max(0, s.promptTokens - s.choice.cachedTokens);
      const reported = remaining(s.workerId, s.requestId, s.attempt);
      o.tokens += reported === undefined ? routed : Math.min(routed, reported);
    } else {
      o.running += 1;
    }
    out.set(s.workerId, o);
  }
  return out;
}
