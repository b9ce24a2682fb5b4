import { sleep } from "../../schema/abort.ts";
import type { StoreReporter } from "./chunk.ts";
import { describe, StoreClosedError, StoreUnavailableError, type TierName } from "./errors.ts";

/** Bounded retries with exponential backoff. */
export interface RetryPolicy {
  /** Attempts in all, the first included (≥ 1). */
  readonly maxAttempts: number;
  /** Delay before the second attempt; doubles after each. */
  readonly baseMs: number;
  /** No single delay is longer. */
  readonly capMs: number;
}

/**
 * Delay before attempt `attempt + 1` after `attempt` failed (attempt ≥ 1):
 * min(capMs, baseMs × 2^(attempt−1)). Deterministic, so the worst case of a
 * call is known: Σ delays + maxAttempts × per-attempt deadline.
 */
export function backoffMs(policy: RetryPolicy, attempt: number): number {
  return Math.min(policy.capMs, policy.baseMs * 2 ** (attempt - 1));
}

/** Worst-case time spent sleeping between attempts. */
export function totalBackoffMs(policy: RetryPolicy): number {
  let sum = 0;
  for (let a = 1; a < policy.maxAttempts; a++) sum += backoffMs(policy, a);
  return sum;
}

/** Thrown by an attempt that ran past its deadline. */
export class AttemptTimeoutError extends Error {
  override readonly name = "AttemptTimeoutError";
}

export interface RetryContext {
  readonly tier: TierName;
  readonly op: string;
  readonly policy: RetryPolicy;
  /** Deadline of one attempt (ms). */
  readonly attemptMs: number;
  /** Aborted when the owner closes: sleeps and attempts end at once. */
  readonly closing: AbortSignal;
  readonly report: StoreReporter;
  /** Whether another attempt could succeed (network trouble, 5xx, timeouts). */
  readonly retryable: (err: unknown) => boolean;
}

/**
 * Runs `attempt` up to policy.maxAttempts times. Each attempt gets a signal
 * that aborts at its deadline (or on close); a non-retryable error is thrown
 * as it is, an exhausted one as StoreUnavailableError carrying the last cause.
 */
export async function withRetries<T>(
  ctx: RetryContext,
  attempt: (signal: AbortSignal) => Promise<T>,
): Promise<T> {
  let last: unknown;
  for (let n = 1; n <= ctx.policy.maxAttempts; n++) {
    if (ctx.closing.aborted) throw new StoreClosedError(`${ctx.tier}: ${ctx.op}: the store was closed`);
    const ac = new AbortController();
    const timer = setTimeout(
      () => ac.abort(new AttemptTimeoutError(`attempt ${n} ran past its ${ctx.attemptMs} ms deadline`)),
      ctx.attemptMs,
    );
    const onClose = () => ac.abort(new StoreClosedError(`${ctx.tier}: ${ctx.op}: the store was closed`));
    ctx.closing.addEventListener("abort", onClose, { once: true });
    try {
      return await attempt(ac.signal);
    } catch (err) {
      // An abort surfaces as the SDK's own AbortError; the reason says why.
      last = ac.signal.aborted ? ac.signal.reason : err;
      if (last instanceof StoreClosedError) throw last;
      if (!ctx.retryable(last) || n === ctx.policy.maxAttempts) {
        if (!ctx.retryable(last)) throw last;
        break;
      }
      const delayMs = backoffMs(ctx.policy, n);
      ctx.report({ kind: "retry", tier: ctx.tier, op: ctx.op, attempt: n, delayMs, error: describe(last) });
      await sleep(delayMs, ctx.closing);
    } finally {
      clearTimeout(timer);
      ctx.closing.removeEventListener("abort", onClose);
    }
  }
  throw new StoreUnavailableError(ctx.tier, ctx.op, ctx.policy.maxAttempts, last);
}
