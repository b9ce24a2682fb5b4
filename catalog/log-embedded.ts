import { type FileHandle, open } from "node:fs/promises";
import { crc32 } from "node:zlib";
import { abortable } from "../schema/abort.ts";
import { MAX_MESSAGE_BYTES } from "../schema/wire.ts";
import {
  CatalogLogError,
  checkOffset,
  type FullCatalogLog,
  type LogRecord,
  type WriterCommit,
  type WriterLease,
} from "./log.ts";

/**
 * The embedded catalog log: the three streams in one process, optionally
 * persisted to one append-only file. Same semantics as the Kafka log (the
 * same contract suite runs against both): dense offsets, a proposal
 * acknowledged only once durable, and a writer commit (transactions,
 * rejections, consumed proposal offset) that is all-or-nothing.
 *
 * File format (little-endian), a sequence of frames:
 *
 *     u32 payloadLength | u32 crc32(type ‖ payload) | u8 type | payload
 *
 *   type 1 (proposal): payload = the proposal bytes
 *   type 2 (commit):   payload = f64 proposalsConsumed | u32 nTx | u32 nRej
 *                                 | (u32 len | bytes) × (nTx + nRej)
 *
 * A commit is one frame, so it is atomic on disk. Appends are group-committed:
 * every frame queued while a write+fsync is in flight goes out in the next
 * single write+fsync; a caller is answered only after its fsync. On open the
 * file is replayed; the first frame that is short or fails its checksum is a
 * torn tail (a crash mid-write) and the file is truncated there. Nothing
 * acknowledged can be in a torn tail, since acknowledgement follows fsync.
 *
 * One process owns the file; a second process opening it is not supported.
 */

const FRAME_HEADER_BYTES = 9;
const TYPE_PROPOSAL = 1;
const TYPE_COMMIT = 2;
/** A commit frame may carry a whole writer batch; bound it so one frame stays readable in one allocation. */
const MAX_FRAME_BYTES = 256 * 1024 * 1024;

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

/** Append-only file with group commit: append() resolves once its bytes are fsync'd. */
class Journal {
  private queue: Array<{ frame: Buffer; done: () => void; fail: (e: Error) => void }> = [];
  private flushing = false;
  private failed: Error | undefined;

  constructor(
    private readonly file: FileHandle,
    private size: number,
  ) {}

  append(frame: Buffer): Promise<void> {
    if (this.failed) return Promise.reject(this.failed);
    return new Promise((done, fail) => {
      this.queue.push({ frame, done, fail });
      if (!this.flushing) void this.flush();
    });
  }

  private async flush(): Promise<void> {
    this.flushing = true;
    while (this.queue.length > 0) {
      const group = this.queue;
      this.queue = [];
      const bytes = Buffer.concat(group.map((g) => g.frame));
      try {
        await this.file.write(bytes, 0, bytes.length, this.size);
        await this.file.datasync();
        this.size += bytes.length;
        for (const g of group) g.done();
      } catch (err) {
        // A failed write may have left a partial frame: the journal is unusable
        // until reopened (recovery truncates the torn tail).
        this.failed = new CatalogLogError(`embedded log write failed: ${(err as Error).message}`);
        for (const g of [...group, ...this.queue]) g.fail(this.failed);
        this.queue = [];
      }
    }
    this.flushing = false;
  }

  async close(): Promise<void> {
    while (this.flushing) await new Promise((r) => setTimeout(r, 1));
    await this.file.close();
  }
}

function frame(type: number, payload: Buffer): Buffer {
  if (payload.length > MAX_FRAME_BYTES) {
    throw new CatalogLogError(`embedded log frame of ${payload.length} bytes exceeds ${MAX_FRAME_BYTES}`);
  }
  const out = Buffer.allocUnsafe(FRAME_HEADER_BYTES + payload.length);
  out.writeUInt32LE(payload.length, 0);
  out.writeUInt8(type, 8);
  payload.copy(out, FRAME_HEADER_BYTES);
  out.writeUInt32LE(crc32(out.subarray(8)), 4);
  return out;
}

function encodeCommit(consumed: number, c: WriterCommit): Buffer {
  const records = [...c.tx, ...c.rejections];
  let size = 16;
  for (const r of records) size += 4 + r.length;
  const out = Buffer.allocUnsafe(size);
  out.writeDoubleLE(consumed, 0);
  out.writeUInt32LE(c.tx.length, 8);
  out.writeUInt32LE(c.rejections.length, 12);
  let at = 16;
  for (const r of records) {
    out.writeUInt32LE(r.length, at);
    out.set(r, at + 4);
    at += 4 + r.length;
  }
  return out;
}

function decodeCommit(p: Buffer): { consumed: number; tx: Uint8Array[]; rejections: Uint8Array[] } {
  const consumed = p.readDoubleLE(0);
  const nTx = p.readUInt32LE(8);
  const nRej = p.readUInt32LE(12);
  const records: Uint8Array[] = [];
  let at = 16;
  for (let i = 0; i < nTx + nRej; i++) {
    const len = p.readUInt32LE(at);
    if (at + 4 + len > p.length) throw new CatalogLogError("commit frame: record overruns the frame");
    records.push(new Uint8Array(p.subarray(at + 4, at + 4 + len)));
    at += 4 + len;
  }
  if (at !== p.length) throw new CatalogLogError("commit frame: trailing bytes");
  return { consumed, tx: records.slice(0, nTx), rejections: records.slice(nTx) };
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
      const log = new EmbeddedLog(undefined, opts);
      const validEnd = log.replay(bytes, opts.path);
      if (validEnd < bytes.length) await file.truncate(validEnd);
      const withJournal = new EmbeddedLog(new Journal(file, validEnd), opts);
      withJournal.proposals.push(...log.proposals);
      withJournal.tx.push(...log.tx);
      withJournal.rejections.push(...log.rejections);
      withJournal.consumed = log.consumed;
      return withJournal;
    } catch (err) {
      await file.close();
      throw err;
    }
  }

  /** Loads frames; returns the byte length of the valid prefix (a torn tail starts there). */
  private replay(bytes: Buffer, path: string): number {
    let at = 0;
    while (at + FRAME_HEADER_BYTES <= bytes.length) {
      const len = bytes.readUInt32LE(at);
      const end = at + FRAME_HEADER_BYTES + len;
      if (len > MAX_FRAME_BYTES || end > bytes.length) break;
      if (crc32(bytes.subarray(at + 8, end)) !== bytes.readUInt32LE(at + 4)) break;
      const type = bytes.readUInt8(at + 8);
      const payload = bytes.subarray(at + FRAME_HEADER_BYTES, end);
      if (type === TYPE_PROPOSAL) {
        this.proposals.push(new Uint8Array(payload));
      } else if (type === TYPE_COMMIT) {
        const c = decodeCommit(payload);
        // Invariant: a commit consumes proposals that precede it in the file.
        if (!(c.consumed >= this.consumed && c.consumed <= this.proposals.length)) {
          throw new CatalogLogError(
            `${path}: commit at byte ${at} consumes up to ${c.consumed}, but ${this.proposals.length} proposals precede it (consumed ${this.consumed})`,
          );
        }
        this.consumed = c.consumed;
        this.tx.push(...c.tx);
        this.rejections.push(...c.rejections);
      } else {
        break;
      }
      at = end;
    }
    return at;
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
  ): Promise<{ stop(): Promise<void> }> {
    return this.follow(this.tx, "subscribe", fromOffset, onBatch);
  }

  subscribeRejections(
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
  ): Promise<{ stop(): Promise<void> }> {
    return this.follow(this.rejections, "subscribeRejections", fromOffset, onBatch);
  }

  private async follow(
    stream: readonly Uint8Array[],
    what: string,
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
  ): Promise<{ stop(): Promise<void> }> {
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
