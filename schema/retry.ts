import { sleep } from "./abort.ts";

/**
 * Retry and backoff — the one helper for every room (schema imports nothing
 * of ours, so everyone may import it).
 */

/** Exponential backoff: the wait after the n-th consecutive failure (n ≥ 1) is min(capMs, baseMs · 2^(n−1)). */
export interface Backoff {
  readonly baseMs: number;
  /** No single wait is longer. */
  readonly capMs: number;
}

/** Bounded retries: at most maxAttempts tries of one operation, with backoff between them. */
export interface RetryPolicy extends Backoff {
  /** Attempts in all, the first included (≥ 1). */
  readonly maxAttempts: number;
}

/**
 * The wait after `failures` consecutive failures (≥ 1). Deterministic, so the
 * worst case of a retried call is known: Σ waits + maxAttempts × one attempt.
 */
export function backoffMs(b: Backoff, failures: number): number {
  if (!(failures >= 1)) throw new RangeError(`backoff: failures must be ≥ 1, got ${failures}`);
  return Math.min(b.capMs, b.baseMs * 2 ** (failures - 1));
}

/** Worst-case time a policy spends waiting between its attempts. */
export function totalBackoffMs(p: RetryPolicy): number {
  let sum = 0;
  for (let n = 1; n < p.maxAttempts; n++) sum += backoffMs(p, n);
  return sum;
}

export interface RetryOptions {
  readonly policy: RetryPolicy;
  /** Whether another attempt could succeed; an error it refuses is thrown as it is. */
  readonly retryable: (err: unknown) => boolean;
  /** Cuts a wait short (the attempt after it runs at once and should see the signal itself). */
  readonly signal?: AbortSignal;
  /** Told before each wait: the attempt that failed (1-based), the wait, its error. */
  readonly onRetry?: (attempt: number, delayMs: number, err: unknown) => void;
  /** What to throw when the last attempt failed with a retryable error (default: that error). */
  readonly exhausted?: (last: unknown, attempts: number) => unknown;
}

/** Runs `attempt` (given its 1-based number) until it succeeds, fails for good, or policy.maxAttempts ran. */
export async function retry<T>(attempt: (n: number) => Promise<T>, o: RetryOptions): Promise<T> {
  const max = o.policy.maxAttempts;
  if (!Number.isInteger(max) || max < 1)
    throw new RangeError(`retry: maxAttempts must be an integer ≥ 1, got ${max}`);
  for (let n = 1; ; n++) {
    try {
      return await attempt(n);
    } catch (err) {
      if (!o.retryable(err)) throw err;
      if (n >= max) throw o.exhausted ? o.exhausted(err, n) : err;
      const delayMs = backoffMs(o.policy, n);
      o.onRetry?.(n, delayMs, err);
      await sleep(delayMs, o.signal);
    }
  }
}
