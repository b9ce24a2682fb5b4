import { type ResourceLimits, Worker } from "node:worker_threads";

/**
 * Starts a worker thread running a TypeScript module (through
 * schema/thread-boot.mjs). `data` reaches the module as
 * `workerData.data`; `transfer` moves buffers instead of copying them.
 */
export function startTsThread(
  entry: URL,
  data: unknown,
  opts: { readonly resourceLimits?: ResourceLimits; readonly transfer?: readonly ArrayBuffer[] } = {},
): Worker {
  return new Worker(new URL("./thread-boot.mjs", import.meta.url), {
    workerData: { entry: entry.href, data },
    ...(opts.transfer ? { transferList: [...opts.transfer] } : {}),
    ...(opts.resourceLimits ? { resourceLimits: opts.resourceLimits } : {}),
    // The parent's flags (e.g. --initial-old-space-size) size the main heap, not a thread's.
    execArgv: [],
  });
}
