import type { FileHandle } from "node:fs/promises";
import { crc32 } from "node:zlib";
import { CatalogLogError, type WriterCommit } from "./log.ts";

/**
 * The embedded log's file: its frame format, the scan that reads it back and
 * the journal that appends to it.
 *
 * File format (little-endian), a sequence of frames:
 *
 *     u32 payloadLength | u32 crc32(type ‖ payload) | u8 type | payload
 *
 *   type 1 (proposal): payload = the proposal bytes
 *   type 2 (commit):   payload = f64 proposalsConsumed | u32 nTx | u32 nRej
 *                                 | (u32 len | bytes) × (nTx + nRej)
 *
 * A commit is one frame, so it is atomic on disk. The first frame that is
 * short or fails its checksum is a torn tail (a crash mid-write).
 */

export const FRAME_HEADER_BYTES = 9;
export const TYPE_PROPOSAL = 1;
export const TYPE_COMMIT = 2;
/** A commit frame may carry a whole writer batch; bound it so one frame stays readable in one allocation. */
export const MAX_FRAME_BYTES = 256 * 1024 * 1024;

export function frame(type: number, payload: Buffer): Buffer {
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

export function encodeCommit(consumed: number, c: WriterCommit): Buffer {
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

export interface DecodedCommit {
  readonly consumed: number;
  readonly tx: Uint8Array[];
  readonly rejections: Uint8Array[];
}

export function decodeCommit(p: Buffer): DecodedCommit {
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

export interface ScannedFrame {
  /** Byte offset of the frame's header. */
  readonly at: number;
  /** One past its last byte. */
  readonly end: number;
  readonly type: number;
  readonly payload: Buffer;
}

/**
 * The complete, checksummed frames of `bytes` in order; stops at the first
 * frame that is short, fails its checksum or has an unknown type (a torn
 * tail starts there: `validEnd` of the last frame yielded).
 */
export function* scanFrames(bytes: Buffer): Generator<ScannedFrame> {
  let at = 0;
  while (at + FRAME_HEADER_BYTES <= bytes.length) {
    const len = bytes.readUInt32LE(at);
    const end = at + FRAME_HEADER_BYTES + len;
    if (len > MAX_FRAME_BYTES || end > bytes.length) return;
    if (crc32(bytes.subarray(at + 8, end)) !== bytes.readUInt32LE(at + 4)) return;
    const type = bytes.readUInt8(at + 8);
    if (type !== TYPE_PROPOSAL && type !== TYPE_COMMIT) return;
    yield { at, end, type, payload: bytes.subarray(at + FRAME_HEADER_BYTES, end) };
    at = end;
  }
}

/**
 * A commit that does not follow from the frames before it: it consumes
 * fewer proposals than an earlier commit did, or more than precede it. Only
 * two processes appending to one file produce it (each commits at its own,
 * stale, idea of the proposal offset); `continuum catalog repair` keeps the
 * consistent part.
 */
export class InconsistentLogError extends CatalogLogError {
  constructor(
    readonly path: string,
    /** Byte offset of the inconsistent commit frame. */
    readonly at: number,
    message: string,
  ) {
    super(message);
  }
}

/** The streams a file holds, as replayed. */
export interface ReplayedLog {
  readonly proposals: Uint8Array[];
  readonly tx: Uint8Array[];
  readonly rejections: Uint8Array[];
  /** Proposals consumed by the last commit. */
  readonly consumed: number;
  /** Byte length of the valid prefix (a torn tail starts there). */
  readonly validEnd: number;
}

/**
 * Replays a file's frames. Invariant checked per commit: it consumes
 * proposals that precede it, and no fewer than the commit before it did.
 */
export function replayFile(bytes: Buffer, path: string): ReplayedLog {
  const proposals: Uint8Array[] = [];
  const tx: Uint8Array[] = [];
  const rejections: Uint8Array[] = [];
  let consumed = 0;
  let validEnd = 0;
  for (const f of scanFrames(bytes)) {
    if (f.type === TYPE_PROPOSAL) {
      proposals.push(new Uint8Array(f.payload));
    } else {
      const c = decodeCommit(f.payload);
      if (!(c.consumed >= consumed && c.consumed <= proposals.length)) {
        throw new InconsistentLogError(
          path,
          f.at,
          `${path}: commit at byte ${f.at} consumes up to ${c.consumed}, but ${proposals.length} proposals precede it (consumed ${consumed}): ` +
            "a second process appended to this log (it committed at a stale proposal offset); " +
            "`continuum catalog repair` keeps the consistent part and re-queues the proposals after it",
        );
      }
      consumed = c.consumed;
      tx.push(...c.tx);
      rejections.push(...c.rejections);
    }
    validEnd = f.end;
  }
  return { proposals, tx, rejections, consumed, validEnd };
}

/** Append-only file with group commit: append() resolves once its bytes are fsync'd. */
export class Journal {
  private queue: Array<{ frame: Buffer; done: () => void; fail: (e: Error) => void }> = [];
  private flushing: Promise<void> | undefined;
  /** Set when the file changed under this process: nothing more may be appended. */
  private fenced: Error | undefined;
  /** A write failed part-way: the bytes past `size` are a torn frame, cut before the next write. */
  private torn = false;

  constructor(
    private readonly file: FileHandle,
    private readonly path: string,
    private size: number,
  ) {}

  append(frame: Buffer): Promise<void> {
    if (this.fenced) return Promise.reject(this.fenced);
    return new Promise((done, fail) => {
      this.queue.push({ frame, done, fail });
      this.flushing ??= this.flush();
    });
  }

  /**
   * One write + fsync per group. A failed write (a full disk, an I/O error)
   * fails its group only: the torn bytes it may have left are truncated
   * before the next group is written, so the journal recovers once the
   * cause is gone. A file whose size is not what this process wrote was
   * appended to by another process: the journal stops for good (its later
   * commits would carry a stale proposal offset).
   */
  private async flush(): Promise<void> {
    try {
      while (this.queue.length > 0 && this.fenced === undefined) {
        const group = this.queue;
        this.queue = [];
        try {
          await this.checkOwnership();
          if (this.torn) {
            await this.file.truncate(this.size);
            this.torn = false;
          }
          const bytes = Buffer.concat(group.map((g) => g.frame));
          this.torn = true;
          // The file is opened for append: each write lands at the end; a short write is continued.
          for (let off = 0; off < bytes.length; ) {
            const { bytesWritten } = await this.file.write(bytes, off, bytes.length - off);
            off += bytesWritten;
          }
          await this.file.datasync();
          this.torn = false;
          this.size += bytes.length;
          for (const g of group) g.done();
        } catch (err) {
          const e =
            err instanceof CatalogLogError
              ? err
              : new CatalogLogError(`embedded log write failed: ${(err as Error).message}`);
          for (const g of group) g.fail(e);
        }
      }
      if (this.fenced) for (const g of this.queue.splice(0)) g.fail(this.fenced);
    } finally {
      this.flushing = undefined;
    }
  }

  private async checkOwnership(): Promise<void> {
    const { size } = await this.file.stat();
    if (size === this.size || (this.torn && size > this.size)) return;
    this.fenced = new CatalogLogError(
      `${this.path} changed under this process (${this.size} bytes written here, ${size} on disk): another process appended to it; this one stops writing the log`,
    );
    throw this.fenced;
  }

  async close(): Promise<void> {
    while (this.flushing) await this.flushing;
    await this.file.close();
  }
}
