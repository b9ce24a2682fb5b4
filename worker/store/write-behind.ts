import type { ContentId } from "../../schema/ids.ts";
import type { StoreReporter, VerifiedChunk } from "./chunk.ts";
import { describe, StoreClosedError, WriteBehindTimeoutError } from "./errors.ts";

export interface WriteBehindOptions {
  /** Jobs held at once (reserved, queued or uploading). */
  readonly capacity: number;
  /** Payload bytes held at once; one job larger than this still runs alone. */
  readonly maxBytes: number;
  /** Uploads running at once. */
  readonly concurrency: number;
  /** How long a required write waits for room. */
  readonly requiredWaitMs: number;
  /** The upload (the S3 tier's put, with its own bounded retries). */
  readonly upload: (chunk: VerifiedChunk) => Promise<void>;
  readonly report: StoreReporter;
}

export type Durability = "optional" | "required";

/** Room taken in the queue before the local writes, so a refusal changes nothing. */
export interface Reservation {
  /** Hands the chunk to the uploaders; resolves when the upload succeeded. */
  commit(chunk: VerifiedChunk): Promise<void>;
  /** Gives the room back (the local write failed). */
  release(): void;
}

export interface WriteBehindStats {
  /** Jobs reserved, queued or uploading. */
  readonly depth: number;
  readonly capacity: number;
  readonly bytes: number;
  readonly maxBytes: number;
  readonly uploading: number;
  /** Required writes waiting for room. */
  readonly waiting: number;
  readonly uploaded: number;
  readonly failed: number;
  readonly refused: number;
  readonly timedOut: number;
}

export interface DrainReport {
  readonly uploaded: number;
  readonly failed: readonly { readonly id: ContentId; readonly error: string }[];
}

interface Job {
  readonly chunk: VerifiedChunk;
  readonly durable: Promise<void>;
  resolve(): void;
  reject(err: unknown): void;
}

interface Waiter {
  readonly bytes: number;
  readonly grant: () => void;
  readonly fail: (err: Error) => void;
}

/**
 * The bounded write-behind queue to the remote tier.
 *
 * Invariants: depth = reserved + queued + uploading ≤ capacity, and
 * bytes ≤ maxBytes unless depth = 1 (a single oversized job may run alone).
 * An optional write that finds no room is refused at once; a required one
 * waits in FIFO order up to requiredWaitMs, then fails with
 * WriteBehindTimeoutError. Either way nothing was written.
 */
export class WriteBehindQueue {
  private readonly opts: WriteBehindOptions;
  private depth = 0;
  private bytes = 0;
  private readonly queued: Job[] = [];
  private readonly waiters: Waiter[] = [];
  /** Jobs not yet finished, by id: a second put of a pending chunk shares its job. */
  private readonly pending = new Map<ContentId, Job>();
  private uploading = 0;
  private uploaded = 0;
  private failed = 0;
  private refused = 0;
  private timedOut = 0;
  private closed = false;

  constructor(opts: WriteBehindOptions) {
    if (opts.capacity < 1 || opts.concurrency < 1 || opts.maxBytes < 1) {
      throw new RangeError("write-behind: capacity, concurrency and maxBytes must be ≥ 1");
    }
    this.opts = opts;
  }

  /** The durable promise of a chunk already pending, if any. */
  pendingFor(id: ContentId): Promise<void> | undefined {
    return this.pending.get(id)?.durable;
  }

  /**
   * Room for one job of `bytes`. Optional: a Reservation or a refusal reason
   * at once. Required: waits for room up to requiredWaitMs.
   */
  async reserve(bytes: number, durability: Durability): Promise<Reservation | { refused: string }> {
    if (this.closed) throw new StoreClosedError("write-behind queue is closed");
    if (this.waiters.length === 0 && this.fits(bytes)) return this.take(bytes);
    if (durability === "optional") {
      this.refused++;
      return {
        refused: `write-behind queue full (${this.depth}/${this.opts.capacity} jobs, ${this.bytes} bytes)`,
      };
    }
    await new Promise<void>((resolve, reject) => {
      const waiter: Waiter = {
        bytes,
        grant: () => {
          clearTimeout(timer);
          resolve();
        },
        fail: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      };
      const timer = setTimeout(() => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        this.timedOut++;
        reject(new WriteBehindTimeoutError(this.opts.requiredWaitMs, this.depth, this.opts.capacity));
      }, this.opts.requiredWaitMs);
      this.waiters.push(waiter);
    });
    // `grant` already counted this job in depth and bytes (see wake).
    return this.reservation(bytes);
  }

  /** Resolves when every job pending now has finished; lists the failures among them. */
  async drain(): Promise<DrainReport> {
    const jobs = [...this.pending.values()];
    const results = await Promise.allSettled(jobs.map((j) => j.durable));
    const failed: { id: ContentId; error: string }[] = [];
    results.forEach((r, i) => {
      if (r.status === "rejected") failed.push({ id: jobs[i]!.chunk.id, error: describe(r.reason) });
    });
    return { uploaded: jobs.length - failed.length, failed };
  }

  /** Drops a queued (not yet uploading) job; returns whether one was dropped. */
  cancel(id: ContentId): boolean {
    const i = this.queued.findIndex((j) => j.chunk.id === id);
    if (i < 0) return false;
    const [job] = this.queued.splice(i, 1);
    this.pending.delete(id);
    this.free(job!.chunk.bytes.byteLength);
    job!.reject(new StoreClosedError(`write-behind of ${id} was cancelled (the chunk was deleted)`));
    return true;
  }

  stats(): WriteBehindStats {
    return {
      depth: this.depth,
      capacity: this.opts.capacity,
      bytes: this.bytes,
      maxBytes: this.opts.maxBytes,
      uploading: this.uploading,
      waiting: this.waiters.length,
      uploaded: this.uploaded,
      failed: this.failed,
      refused: this.refused,
      timedOut: this.timedOut,
    };
  }

  /** Accepts nothing more; waiting writes fail; jobs already accepted are finished. */
  async close(): Promise<DrainReport> {
    this.closed = true;
    for (const w of this.waiters.splice(0))
      w.fail(new StoreClosedError("write-behind queue closed while waiting for room"));
    return this.drain();
  }

  private fits(bytes: number): boolean {
    return this.depth < this.opts.capacity && (this.depth === 0 || this.bytes + bytes <= this.opts.maxBytes);
  }

  private take(bytes: number): Reservation {
    this.depth++;
    this.bytes += bytes;
    return this.reservation(bytes);
  }

  private reservation(bytes: number): Reservation {
    let used = false;
    return {
      commit: (chunk) => {
        if (used) throw new Error("write-behind: reservation used twice");
        used = true;
        return this.enqueue(chunk, bytes);
      },
      release: () => {
        if (used) return;
        used = true;
        this.free(bytes);
      },
    };
  }

  private enqueue(chunk: VerifiedChunk, bytes: number): Promise<void> {
    const existing = this.pending.get(chunk.id);
    if (existing !== undefined) {
      this.free(bytes);
      return existing.durable;
    }
    let resolve!: () => void;
    let reject!: (err: unknown) => void;
    const durable = new Promise<void>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    // A caller may ignore `durable`; failures are reported and counted anyway.
    durable.catch(() => undefined);
    const job: Job = { chunk, durable, resolve, reject };
    this.pending.set(chunk.id, job);
    this.queued.push(job);
    this.pump();
    return durable;
  }

  private pump(): void {
    while (this.uploading < this.opts.concurrency && this.queued.length > 0) {
      const job = this.queued.shift()!;
      this.uploading++;
      this.opts
        .upload(job.chunk)
        .then(
          () => {
            this.uploaded++;
            job.resolve();
          },
          (err) => {
            this.failed++;
            this.opts.report({ kind: "write-behind-failed", id: job.chunk.id, error: describe(err) });
            job.reject(err);
          },
        )
        .finally(() => {
          this.uploading--;
          this.pending.delete(job.chunk.id);
          this.free(job.chunk.bytes.byteLength);
          this.pump();
        });
    }
  }

  private free(bytes: number): void {
    this.depth--;
    this.bytes -= bytes;
    if (this.depth < 0 || this.bytes < 0)
      throw new Error(`write-behind invariant: depth ${this.depth}, bytes ${this.bytes}`);
    this.wake();
  }

  /** Grants room to waiters in FIFO order; stops at the first that does not fit (no overtaking). */
  private wake(): void {
    while (this.waiters.length > 0 && this.fits(this.waiters[0]!.bytes)) {
      const w = this.waiters.shift()!;
      this.depth++;
      this.bytes += w.bytes;
      w.grant();
    }
  }
}
