/**
 * Waiting that an AbortSignal can cut short — the one helper for every room
 * (schema imports nothing of ours, so everyone may import it).
 *
 * Invariant: a call leaves no listener on `signal` once its promise settles.
 * A long-lived signal (a writer's "stopping", a store's "closing") sees
 * thousands of waits over a process's life; a listener left per wait is a
 * leak that Node reports as MaxListenersExceededWarning after eleven.
 */

/**
 * Resolves after `ms`, or at once when `signal` aborts (it never rejects: a
 * caller that must stop checks `signal.aborted` after it).
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  if (signal === undefined) return new Promise((resolve) => setTimeout(resolve, ms));
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

/**
 * Settles as `work` does, or rejects with `signal.reason` when the signal
 * aborts first (at once when it already has). `work` itself is not stopped:
 * this only stops waiting for it.
 */
export function abortable<T>(work: Promise<T>, signal?: AbortSignal): Promise<T> {
  if (signal === undefined) return work;
  if (signal.aborted) {
    work.catch(() => undefined);
    return Promise.reject(signal.reason);
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      work.catch(() => undefined);
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    work.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (err) => {
        signal.removeEventListener("abort", onAbort);
        reject(err);
      },
    );
  });
}
