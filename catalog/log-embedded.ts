import { open } from "node:fs/promises";
import { abortable } from "../schema/abort.ts";
import { MAX_MESSAGE_BYTES } from "../schema/wire.ts";
import { encodeCommit, frame, Journal, replayFile, TYPE_COMMIT, TYPE_PROPOSAL } from "./embedded-file.ts";
import {
  CatalogLogError,
  checkOffset,
  type FullCatalogLog,
  type LogRecord,
  type Subscription as LogSubscription,
  type WriterCommit,
  type WriterLease,
} from "./log.ts";

/**
 * The embedded catalog log: the three streams in one process, optionally
 * persisted to one append-only file (its format: catalog/embedded-file.ts).
 * Same semantics as the Kafka log (the same contract suite runs against
 * both): dense offsets, a proposal acknowledged only once durable, and a
 * writer commit (transactions, rejections, consumed proposal offset) that is
 * all-or-nothing.
 *
 * Appends are group-committed: every frame queued while a write+fsync is in
 * flight goes out in the next single write+fsync; a caller is answered only
 * after its fsync. On open the file is replayed; a torn tail (a crash
 * mid-write) is truncated. Nothing acknowledged can be in a torn tail, since
 * acknowledgement follows fsync.
 *
 * One process owns the file: the process that opens it for writing holds
 * its lock (worker/store/dir-lock.ts). Should a second one append anyway,
 * the first stops writing at once (its journal sees the file grow under it),
 * and a commit at a stale proposal offset already in the file is refused on
 * replay (InconsistentLogError) — `continuum catalog repair` mends that.
 */

export interface EmbeddedLogOptions {
  /** Persist to this file; omitted = memory only. */
  readonly path?: string;
  /** Most records handed to one subscriber or writer callback (default 1,000). */
  readonly maxBatch?: number;
  /** Largest proposal accepted by propose() (default: the wire limit). */
  readonly maxProposalBytes?: number;
}

/** Wakes every waiter on the next notify(); a fresh promise per round so no wake-up is lost. */
class Signal {
  private waiters: Array<() => void> = [];
  wait(): Promise<void> {
    return new Promise((resolve) => this.waiters.push(resolve));
  }
  notify(): void {
    const ws = this.waiters;
    this.waiters = [];
    for (const w of ws) w();
  }
}

interface Subscription {
  stopped: boolean;
  done: Promise<void>;
}

export class EmbeddedLog implements FullCatalogLog {
  private readonly proposals: Uint8Array[] = [];
  private readonly tx: Uint8Array[] = [];
  private readonly rejections: Uint8Array[] = [];
  /** Offset of the first proposal no writer commit has consumed. */
  private consumed = 0;
  private readonly changed = new Signal();
  private readonly leaseReleased = new Signal();
  private lease: EmbeddedLease | undefined;
  private closed = false;
  private readonly subscriptions = new Set<Subscription>();
  private readonly maxBatch: number;
  private readonly maxProposalBytes: number;

  private constructor(
    private readonly journal: Journal | undefined,
    opts: EmbeddedLogOptions,
  ) {
    this.maxBatch = opts.maxBatch ?? 1000;
    this.maxProposalBytes = opts.maxProposalBytes ?? MAX_MESSAGE_BYTES;
    if (!Number.isInteger(this.maxBatch) || this.maxBatch < 1) {
      throw new CatalogLogError(`maxBatch must be a positive integer, got ${this.maxBatch}`);
    }
  }

  /** Opens (and for a file, recovers) the log. */
  static async open(opts: EmbeddedLogOptions = {}): Promise<EmbeddedLog> {
    if (opts.path === undefined) return new EmbeddedLog(undefined, opts);
    const file = await open(opts.path, "a+");
    try {
      const bytes = await file.readFile();
      const state = replayFile(bytes, opts.path);
      if (state.validEnd < bytes.length) await file.truncate(state.validEnd);
      const log = new EmbeddedLog(new Journal(file, opts.path, state.validEnd), opts);
      log.proposals.push(...state.proposals);
      log.tx.push(...state.tx);
      log.rejections.push(...state.rejections);
      log.consumed = state.consumed;
      return log;
    } catch (err) {
      await file.close();
      throw err;
    }
  }

  private checkOpen(what: string): void {
    if (this.closed) throw new CatalogLogError(`${what}: the embedded log is closed`);
  }

  async propose(bytes: Uint8Array): Promise<void> {
    this.checkOpen("propose");
    if (!(bytes instanceof Uint8Array)) throw new CatalogLogError("propose: bytes must be a Uint8Array");
    if (bytes.length > this.maxProposalBytes) {
      throw new CatalogLogError(
        `propose: proposal of ${bytes.length} bytes exceeds the ${this.maxProposalBytes}-byte limit`,
      );
    }
    const copy = new Uint8Array(bytes);
    if (this.journal) await this.journal.append(frame(TYPE_PROPOSAL, Buffer.from(copy)));
    this.proposals.push(copy);
    this.changed.notify();
  }

  async endOffset(): Promise<number> {
    this.checkOpen("endOffset");
    return this.tx.length;
  }

  /** Number of proposals appended (durable) so far. */
  proposalsEnd(): number {
    return this.proposals.length;
  }

  subscribe(
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
  ): Promise<LogSubscription> {
    return this.follow(this.tx, "subscribe", fromOffset, onBatch);
  }

  subscribeRejections(
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
  ): Promise<LogSubscription> {
    return this.follow(this.rejections, "subscribeRejections", fromOffset, onBatch);
  }

  private async follow(
    stream: readonly Uint8Array[],
    what: string,
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
  ): Promise<LogSubscription> {
    this.checkOpen(what);
    checkOffset(what, fromOffset);
    const sub: Subscription = { stopped: false, done: Promise.resolve() };
    const loop = async (): Promise<void> => {
      let pos = fromOffset;
      while (!sub.stopped) {
        if (pos >= stream.length) {
          await this.changed.wait();
          continue;
        }
        const end = Math.min(stream.length, pos + this.maxBatch);
        const batch: LogRecord[] = [];
        for (let o = pos; o < end; o++) batch.push({ offset: o, bytes: stream[o]! });
        await onBatch(batch);
        pos = end;
      }
    };
    sub.done = loop();
    this.subscriptions.add(sub);
    return {
      ended: sub.done,
      stop: async () => {
        sub.stopped = true;
        this.changed.notify();
        this.subscriptions.delete(sub);
        await sub.done;
      },
    };
  }

  async acquireWriter(signal?: AbortSignal): Promise<WriterLease> {
    for (;;) {
      this.checkOpen("acquireWriter");
      signal?.throwIfAborted();
      if (this.lease === undefined) {
        this.lease = new EmbeddedLease(this, this.tx.length, this.consumed);
        return this.lease;
      }
      await abortable(this.leaseReleased.wait(), signal);
    }
  }

  /** @internal for EmbeddedLease */
  nextProposals(from: number): LogRecord[] {
    const end = Math.min(this.proposals.length, from + this.maxBatch);
    const out: LogRecord[] = [];
    for (let o = from; o < end; o++) out.push({ offset: o, bytes: this.proposals[o]! });
    return out;
  }

  /** @internal for EmbeddedLease */
  waitChange(): Promise<void> {
    return this.changed.wait();
  }

  /** @internal for EmbeddedLease: durable first, then visible. */
  async commit(lease: EmbeddedLease, consumed: number, c: WriterCommit): Promise<void> {
    if (this.lease !== lease) throw new CatalogLogError("commit: this writer lease is no longer active");
    if (consumed < this.consumed || consumed > this.proposals.length) {
      throw new CatalogLogError(
        `commit: consumed offset ${consumed} outside ${this.consumed}..${this.proposals.length}`,
      );
    }
    if (this.journal) await this.journal.append(frame(TYPE_COMMIT, encodeCommit(consumed, c)));
    this.consumed = consumed;
    for (const t of c.tx) this.tx.push(new Uint8Array(t));
    for (const r of c.rejections) this.rejections.push(new Uint8Array(r));
    this.changed.notify();
  }

  /** @internal for EmbeddedLease */
  release(lease: EmbeddedLease): void {
    if (this.lease === lease) {
      this.lease = undefined;
      this.leaseReleased.notify();
    }
  }

  /** @internal wakes every waiter (a lease that is stopping). */
  nudge(): void {
    this.changed.notify();
  }

  isClosed(): boolean {
    return this.closed;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.lease?.stop();
    for (const s of this.subscriptions) s.stopped = true;
    this.changed.notify();
    await Promise.all([...this.subscriptions].map((s) => s.done));
    this.subscriptions.clear();
    this.leaseReleased.notify();
    await this.journal?.close();
  }
}

class EmbeddedLease implements WriterLease {
  private stopped = false;
  commits = 0;
  private running: Promise<void> | undefined;

  constructor(
    private readonly log: EmbeddedLog,
    readonly txEnd: number,
    readonly proposalsOffset: number,
  ) {}

  run(handler: (proposals: readonly LogRecord[]) => Promise<WriterCommit> | WriterCommit): Promise<void> {
    if (this.running) throw new CatalogLogError("run: this lease is already running");
    const loop = async (): Promise<void> => {
      let next = this.proposalsOffset;
      try {
        while (!this.stopped && !this.log.isClosed()) {
          const batch = this.log.nextProposals(next);
          if (batch.length === 0) {
            await this.log.waitChange();
            continue;
          }
          const result = await handler(batch);
          const consumed = batch[batch.length - 1]!.offset + 1;
          await this.log.commit(this, consumed, result);
          this.commits++;
          next = consumed;
        }
      } finally {
        this.log.release(this);
      }
    };
    this.running = loop();
    return this.running;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (!this.running) {
      this.log.release(this);
      return;
    }
    // Wake the loop if it is waiting for proposals.
    this.log.nudge();
    await this.running.catch(() => undefined);
  }
}
