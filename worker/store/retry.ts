import { type RetryPolicy, retry } from "../../schema/retry.ts";
import type { StoreReporter } from "./chunk.ts";
import { describe, StoreClosedError, StoreUnavailableError, type TierName } from "./errors.ts";

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
 * Runs `attempt` under the policy (schema/retry.ts). Each attempt gets a
 * signal that aborts at its deadline (or on close); a non-retryable error is
 * thrown as it is, an exhausted one as StoreUnavailableError carrying the
 * last cause, and none starts once the store is closing.
 */
export function withRetries<T>(ctx: RetryContext, attempt: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const closed = () => new StoreClosedError(`${ctx.tier}: ${ctx.op}: the store was closed`);
  return retry(
    async (n) => {
      if (ctx.closing.aborted) throw closed();
      const ac = new AbortController();
      const timer = setTimeout(
        () => ac.abort(new AttemptTimeoutError(`attempt ${n} ran past its ${ctx.attemptMs} ms deadline`)),
        ctx.attemptMs,
      );
      const onClose = () => ac.abort(closed());
      ctx.closing.addEventListener("abort", onClose, { once: true });
      try {
        return await attempt(ac.signal);
      } catch (err) {
        // An abort surfaces as the SDK's own AbortError; the reason says why.
        throw ac.signal.aborted ? ac.signal.reason : err;
      } finally {
        clearTimeout(timer);
        ctx.closing.removeEventListener("abort", onClose);
      }
    },
    {
      policy: ctx.policy,
      retryable: (err) => !(err instanceof StoreClosedError) && ctx.retryable(err),
      signal: ctx.closing,
      onRetry: (n, delayMs, err) =>
        ctx.report({ kind: "retry", tier: ctx.tier, op: ctx.op, attempt: n, delayMs, error: describe(err) }),
      exhausted: (last, attempts) => new StoreUnavailableError(ctx.tier, ctx.op, attempts, last),
    },
  );
}
