import { parentPort } from "node:worker_threads";

/**
 * A thread for test/controller/api/thread-pool.test.ts, on the pool's
 * contract: a job `{ sleepMs }` blocks the thread that long and answers its
 * thread id; `{ fail }` answers an error; `{ crash }` exits the thread.
 */
const port = parentPort!;
const cell = new Int32Array(new SharedArrayBuffer(4));

port.on(
  "message",
  ({ id, job }: { id: number; job: { sleepMs?: number; fail?: string; crash?: boolean } }) => {
    if (job.crash) process.exit(3);
    if (job.fail) {
      port.postMessage({ id, error: job.fail });
      return;
    }
    Atomics.wait(cell, 0, 0, job.sleepMs ?? 0);
    port.postMessage({ id, ok: job.sleepMs ?? 0 });
  },
);
