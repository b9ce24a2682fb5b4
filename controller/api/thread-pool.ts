import type { Worker } from "node:worker_threads";
import { startTsThread } from "../../schema/threads.ts";

/**
 * A fixed number of worker threads running one module, each doing one job at
 * a time, with a bounded FIFO of jobs waiting for a thread: work that would
 * hold the event loop for seconds (tokenizing megabytes) runs beside it.
 *
 * The module's contract: it receives `{ id, job }` messages on parentPort
 * and answers each with `{ id, ok: result }` or `{ id, error: message }`.
 * Threads start on first use; one that dies (a crash, its heap limit) fails
 * its job with ThreadFailedError and is replaced by the next job. Bounds:
 * `threads` jobs run, `maxQueued` wait; one more is refused (PoolFullError).
 */

export class PoolFullError extends Error {
  override readonly name = "PoolFullError";
}
/** The thread running the job died before answering. */
export class ThreadFailedError extends Error {
  override readonly name = "ThreadFailedError";
}
/** The job's own failure, as the module reported it. */
export class JobError extends Error {
  override readonly name = "JobError";
}

export interface ThreadPoolOptions {
  /** The module each thread runs. */
  readonly entry: URL;
  /** Handed to each thread (workerData.data). */
  readonly data: unknown;
  readonly threads: number;
  readonly maxQueued: number;
  /** For messages: what the pool does ("tokenizer"). */
  readonly name: string;
  readonly maxHeapMb?: number;
}

interface Job<Req, Res> {
  readonly id: number;
  readonly job: Req;
  readonly resolve: (r: Res) => void;
  readonly reject: (e: Error) => void;
}

interface Slot<Req, Res> {
  worker: Worker | null;
  running: Job<Req, Res> | null;
}

type Reply<Res> = { readonly id: number; readonly ok: Res } | { readonly id: number; readonly error: string };

export class ThreadPool<Req, Res> {
  private readonly slots: Slot<Req, Res>[];
  private readonly queue: Job<Req, Res>[] = [];
  private nextId = 1;
  private closed = false;

  constructor(private readonly opts: ThreadPoolOptions) {
    if (!Number.isInteger(opts.threads) || opts.threads < 1)
      throw new RangeError(`${opts.name}: threads ≥ 1`);
    if (!Number.isInteger(opts.maxQueued) || opts.maxQueued < 0)
      throw new RangeError(`${opts.name}: maxQueued ≥ 0`);
    this.slots = Array.from({ length: opts.threads }, () => ({ worker: null, running: null }));
  }

  /** Threads in the pool (jobs that run at once). */
  get threads(): number {
    return this.opts.threads;
  }

  /** Jobs running and waiting now. */
  get depth(): number {
    return this.queue.length + this.slots.filter((s) => s.running !== null).length;
  }

  run(job: Req): Promise<Res> {
    if (this.closed) return Promise.reject(new ThreadFailedError(`the ${this.opts.name} pool is closed`));
    const free = this.slots.find((s) => s.running === null);
    if (free === undefined && this.queue.length >= this.opts.maxQueued)
      return Promise.reject(
        new PoolFullError(
          `the ${this.opts.name} has ${this.opts.threads} jobs running and ${this.queue.length} waiting`,
        ),
      );
    return new Promise<Res>((resolve, reject) => {
      this.queue.push({ id: this.nextId++, job, resolve, reject });
      this.pump();
    });
  }

  private pump(): void {
    for (const slot of this.slots) {
      if (slot.running !== null) continue;
      const job = this.queue.shift();
      if (job === undefined) return;
      slot.running = job;
      this.worker(slot).postMessage({ id: job.id, job: job.job });
    }
  }

  private worker(slot: Slot<Req, Res>): Worker {
    if (slot.worker) return slot.worker;
    const w = startTsThread(this.opts.entry, this.opts.data, {
      ...(this.opts.maxHeapMb ? { resourceLimits: { maxOldGenerationSizeMb: this.opts.maxHeapMb } } : {}),
    });
    w.on("message", (m: Reply<Res>) => {
      const job = slot.running;
      if (job === null || job.id !== m.id) return;
      slot.running = null;
      if ("ok" in m) job.resolve(m.ok);
      else job.reject(new JobError(m.error));
      this.pump();
    });
    const lost = (why: string) => {
      if (slot.worker !== w) return;
      slot.worker = null;
      const job = slot.running;
      slot.running = null;
      job?.reject(new ThreadFailedError(`a ${this.opts.name} thread stopped: ${why}`));
      if (!this.closed) this.pump();
    };
    w.on("error", (err) => lost(err.message));
    w.on("exit", (code) => lost(`exit code ${code}`));
    slot.worker = w;
    return w;
  }

  /** Fails waiting and running jobs and stops every thread. */
  async close(): Promise<void> {
    this.closed = true;
    for (const job of this.queue.splice(0))
      job.reject(new ThreadFailedError(`the ${this.opts.name} pool is closed`));
    await Promise.all(
      this.slots.map(async (slot) => {
        const w = slot.worker;
        slot.worker = null;
        slot.running?.reject(new ThreadFailedError(`the ${this.opts.name} pool is closed`));
        slot.running = null;
        await w?.terminate();
      }),
    );
  }
}
