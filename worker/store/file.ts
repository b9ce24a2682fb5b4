import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import type { FileHandle } from "node:fs/promises";
import { mkdir, open, readdir, rename, stat, unlink } from "node:fs/promises";
import { join } from "node:path";
import type { ContentId } from "../../schema/ids.ts";
import {
  type ChunkInfo,
  type ChunkMeta,
  type ChunkTier,
  checkDigest,
  checkId,
  contentHasher,
  encodeHeader,
  HEADER_BYTES,
  MAX_META_BYTES,
  parseHeader,
  parseMeta,
  type StoreReporter,
  stderrReporter,
  TierCounters,
  type TierStats,
  VerifiedChunk,
} from "./chunk.ts";
import {
  CorruptChunkError,
  FileFullError,
  InvalidChunkError,
  StoreClosedError,
  StoreUnavailableError,
} from "./errors.ts";

export interface FileTierOptions {
  /** Root directory; created when missing. */
  readonly dir: string;
  readonly maxObjectBytes: number;
  /**
   * Bound on the bytes stored (frames included), writes in flight counted:
   * a put that would pass it is refused (FileFullError). Nothing is evicted
   * here: without S3 these files are the only durable copies.
   */
  readonly maxBytes: number;
  /** Bytes per read while hashing; reads of the next piece overlap hashing of this one. */
  readonly readPieceBytes?: number;
  /** Objects up to this size are read with blocking calls (see readSmallSync); 0 turns that off. */
  readonly syncReadMaxBytes?: number;
  readonly report?: StoreReporter;
}

const ID_NAME = /^[0-9a-f]{64}$/;
/** Temp files older than this at open are leftovers of a crash. */
const STALE_TEMP_MS = 10 * 60_000;
/** First read covers the header and the largest metadata, so the frame is known after one read. */
const MIN_PIECE = HEADER_BYTES + MAX_META_BYTES;
/** Payload reads in flight at once while hashing (each of pieceBytes): memory is the object's own buffer. */
const READ_AHEAD = 2;

/**
 * The local file tier. Layout under `dir`:
 *
 *   objects/ab/cd/<id>   one framed object per chunk (chunk.ts framing), sharded
 *                        by the id's first two bytes: ≤ 65,536 directories, so a
 *                        million chunks make ~16 entries per directory
 *   tmp/                 writes in progress
 *   corrupt/<id>         the last object of that id that failed verification
 *
 * Invariant: storedBytes + reservedBytes ≤ maxBytes, except where the files
 * found at open already held more (then every put is refused until deletes
 * make room).
 *
 * A put is atomic: write a temp file, fsync it, rename it into place, fsync
 * the directory. A reader sees the whole object or none. A get reads the file
 * into one buffer, hashing each piece while the next is read, and returns the
 * payload as a view of that buffer (no copy).
 */
export class FileTier implements ChunkTier {
  readonly tier = "file" as const;
  readonly dir: string;
  readonly maxObjectBytes: number;
  readonly maxBytes: number;
  private readonly pieceBytes: number;
  private readonly syncReadMaxBytes: number;
  /** Warm buffer the blocking small-object reads go through (syncReadMaxBytes long, made on first use). */
  private scratch: Buffer | undefined;
  private readonly report: StoreReporter;
  private readonly counters = new TierCounters();
  /** Objects held, id → stored bytes, least recently used first (one entry per object). */
  private readonly recency = new Map<ContentId, number>();
  private storedBytes = 0;
  /** Bytes of writes in flight, taken before they start (the bound counts them). */
  private reservedBytes = 0;
  /** Shard directories known to exist: saves a mkdir per put. */
  private readonly shards = new Set<string>();
  /** Puts in flight by id: concurrent puts of one chunk become one write. */
  private readonly writing = new Map<ContentId, Promise<void>>();
  private tempSeq = 0;
  private closed = false;

  private constructor(opts: FileTierOptions) {
    this.dir = opts.dir;
    this.maxObjectBytes = opts.maxObjectBytes;
    if (!Number.isSafeInteger(opts.maxBytes) || opts.maxBytes < 1)
      throw new RangeError(`file tier: maxBytes must be a positive integer, got ${opts.maxBytes}`);
    this.maxBytes = opts.maxBytes;
    this.pieceBytes = Math.max(MIN_PIECE, opts.readPieceBytes ?? 2 << 20);
    this.syncReadMaxBytes = opts.syncReadMaxBytes ?? 1 << 20;
    this.report = opts.report ?? stderrReporter;
  }

  /** Creates the layout, removes stale temp files and counts what is stored. */
  static async open(opts: FileTierOptions): Promise<FileTier> {
    const tier = new FileTier(opts);
    await mkdir(join(tier.dir, "objects"), { recursive: true });
    await mkdir(join(tier.dir, "tmp"), { recursive: true });
    await mkdir(join(tier.dir, "corrupt"), { recursive: true });
    const now = Date.now();
    for (const name of await readdir(join(tier.dir, "tmp"))) {
      const p = join(tier.dir, "tmp", name);
      const st = await stat(p).catch(() => undefined);
      if (st !== undefined && now - st.mtimeMs > STALE_TEMP_MS) await unlink(p).catch(() => undefined);
    }
    // Recency starts as the files' modification order: oldest written, first to go.
    const found: { id: ContentId; storedBytes: number; mtimeMs: number }[] = [];
    for await (const info of tier.scan()) found.push(info);
    found.sort((x, y) => x.mtimeMs - y.mtimeMs);
    for (const info of found) {
      tier.recency.set(info.id, info.storedBytes);
      tier.storedBytes += info.storedBytes;
    }
    return tier;
  }

  pathOf(id: ContentId): string {
    return join(this.dir, "objects", id.slice(0, 2), id.slice(2, 4), id);
  }

  async put(id: unknown, bytes: unknown, meta: unknown): Promise<void> {
    this.open();
    await this.putVerified(VerifiedChunk.check(id, bytes, meta, this));
  }

  async putVerified(chunk: VerifiedChunk): Promise<void> {
    this.open();
    const inFlight = this.writing.get(chunk.id);
    if (inFlight !== undefined) return inFlight;
    const p = this.write(chunk).finally(() => this.writing.delete(chunk.id));
    this.writing.set(chunk.id, p);
    return p;
  }

  /** Objects held, least recently written or read first: what a reclaimer deletes first. */
  *coldest(): IterableIterator<{ readonly id: ContentId; readonly storedBytes: number }> {
    for (const [id, storedBytes] of this.recency) yield { id, storedBytes };
  }

  /** Bytes a put may still take before store.dir.maxBytes, writes in flight counted. */
  freeBytes(): number {
    return Math.max(0, this.maxBytes - this.storedBytes - this.reservedBytes);
  }

  private async write(chunk: VerifiedChunk): Promise<void> {
    const total = HEADER_BYTES + chunk.metaJson.byteLength + chunk.bytes.byteLength;
    const final = this.pathOf(chunk.id);
    // Content-addressed and immutable: an object of the right size is this
    // chunk (a corrupt one is found and quarantined by the next get).
    const existing = await stat(final).catch(() => undefined);
    if (existing !== undefined && existing.size === total) {
      this.counters.puts++;
      return;
    }
    const grows = total - (existing?.size ?? 0);
    if (this.storedBytes + this.reservedBytes + grows > this.maxBytes) {
      throw new FileFullError(total, this.storedBytes + this.reservedBytes, this.maxBytes);
    }
    this.reservedBytes += grows;
    try {
      await this.writeNew(chunk, final, total);
    } finally {
      this.reservedBytes -= grows;
    }
    if (existing !== undefined) this.storedBytes -= existing.size;
    this.storedBytes += total;
    this.recency.delete(chunk.id);
    this.recency.set(chunk.id, total);
    this.counters.puts++;
  }

  private async writeNew(chunk: VerifiedChunk, final: string, total: number): Promise<void> {
    const header = encodeHeader(chunk.metaJson, chunk.bytes.byteLength);
    const tmp = join(this.dir, "tmp", `${chunk.id}.${process.pid}.${this.tempSeq++}.tmp`);
    try {
      await this.ensureShard(chunk.id);
      const fh = await open(tmp, "wx");
      try {
        const { bytesWritten } = await fh.writev([header, chunk.metaJson, chunk.bytes]);
        if (bytesWritten !== total) throw new Error(`short write: ${bytesWritten} of ${total} bytes`);
        await fh.sync();
      } finally {
        await fh.close();
      }
      await rename(tmp, final);
      await syncDir(join(this.dir, "objects", chunk.id.slice(0, 2), chunk.id.slice(2, 4)));
    } catch (err) {
      await unlink(tmp).catch(() => undefined);
      throw new StoreUnavailableError("file", `put ${chunk.id}`, 1, err);
    }
  }

  async get(id: unknown): Promise<VerifiedChunk | undefined> {
    const got = await this.read(id, undefined);
    return got === undefined ? undefined : VerifiedChunk.trusted(got.id, got.bytes, got.meta, got.metaJson);
  }

  /**
   * Reads a chunk's payload into `dest` (a reused staging buffer: no fresh
   * allocation, whose page faults cost as much as the hash on a VM) and
   * returns its metadata and length; undefined when absent. `dest` holds
   * verified bytes only if this resolves: on CorruptChunkError its contents
   * are undefined. Throws InvalidChunkError when `dest` is too small.
   */
  async readInto(id: unknown, dest: Uint8Array): Promise<{ meta: ChunkMeta; bytes: number } | undefined> {
    const got = await this.read(id, dest);
    return got === undefined ? undefined : { meta: got.meta, bytes: got.bytes.byteLength };
  }

  private async read(
    id: unknown,
    dest: Uint8Array | undefined,
  ): Promise<{ id: ContentId; bytes: Uint8Array; meta: ChunkMeta; metaJson: Buffer } | undefined> {
    this.open();
    const cid = checkId(id);
    try {
      const small = this.readSmallSync(cid, dest);
      if (small === "absent") {
        this.counters.misses++;
        return undefined;
      }
      if (small !== "large") {
        this.touched(cid);
        return small;
      }
    } catch (err) {
      return this.readFailed(cid, err);
    }
    let fh: FileHandle;
    try {
      fh = await open(this.pathOf(cid), "r");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") {
        this.counters.misses++;
        return undefined;
      }
      throw new StoreUnavailableError("file", `get ${cid}`, 1, err);
    }
    try {
      const got = await this.readVerified(cid, fh, dest);
      this.touched(cid);
      return got;
    } catch (err) {
      return this.readFailed(cid, err);
    } finally {
      // Nothing more is read through fh; closing beside the caller saves a
      // thread-pool round trip per get (a close error on a read-only fd
      // cannot lose data).
      fh.close().catch(() => undefined);
    }
  }

  /**
   * Reads and verifies one object: first the header and metadata (one small
   * read), then the payload straight into its destination in pieces of
   * `pieceBytes`, up to READ_AHEAD reads in flight on the libuv pool while
   * this thread hashes the pieces already in, in order. A get then costs
   * about max(read, hash) rather than read + hash.
   */
  private async readVerified(
    id: ContentId,
    fh: FileHandle,
    dest: Uint8Array | undefined,
  ): Promise<{ id: ContentId; bytes: Uint8Array; meta: ChunkMeta; metaJson: Buffer }> {
    const { size } = await fh.stat();
    if (size <= this.pieceBytes) return this.readSmall(id, fh, size, dest);
    const head = Buffer.allocUnsafe(Math.min(size, MIN_PIECE));
    const headLen = await readFully(fh, head, 0, head.byteLength, 0);
    const frame = parseHeader("file", id, head, size);
    if (headLen < Math.min(size, frame.payloadOffset))
      throw new CorruptChunkError("file", id, "truncated while reading");
    const metaJson = Buffer.from(head.subarray(HEADER_BYTES, frame.payloadOffset));
    const meta = parseMeta("file", id, metaJson);
    if (dest !== undefined && dest.byteLength < frame.payloadLen) {
      throw new InvalidChunkError(
        `chunk ${id}: destination of ${dest.byteLength} bytes is smaller than its ${frame.payloadLen}`,
      );
    }
    // out[i] holds file byte payloadOffset + i.
    const out = dest?.subarray(0, frame.payloadLen) ?? Buffer.allocUnsafe(frame.payloadLen);
    const inHead = head.subarray(frame.payloadOffset, headLen);
    out.set(inHead, 0);
    const hash = contentHasher(metaJson);
    let filled = inHead.byteLength;
    let hashed = 0;
    const ahead: { start: number; len: number; done: Promise<number> }[] = [];
    let issued = filled;
    for (;;) {
      while (ahead.length < READ_AHEAD && issued < out.byteLength) {
        const len = Math.min(this.pieceBytes, out.byteLength - issued);
        ahead.push({
          start: issued,
          len,
          done: readFully(fh, out, issued, len, frame.payloadOffset + issued),
        });
        issued += len;
      }
      if (hashed < filled) {
        hash.update(out.subarray(hashed, filled));
        hashed = filled;
      }
      const next = ahead.shift();
      if (next === undefined) break;
      const got = await next.done;
      if (got !== next.len) {
        await Promise.allSettled(ahead.map((r) => r.done));
        throw new CorruptChunkError(
          "file",
          id,
          `truncated while reading at byte ${frame.payloadOffset + next.start + got} of ${size}`,
        );
      }
      filled = next.start + got;
    }
    checkDigest("file", id, hash);
    return { id, bytes: out, meta, metaJson };
  }

  private async readFailed(id: ContentId, err: unknown): Promise<never> {
    if (err instanceof InvalidChunkError) throw err;
    if (!(err instanceof CorruptChunkError)) throw new StoreUnavailableError("file", `get ${id}`, 1, err);
    await this.quarantine(id);
    this.counters.corrupt++;
    this.report({ kind: "corrupt", tier: "file", id, reason: err.reason });
    throw err;
  }

  /**
   * Objects up to syncReadMaxBytes are read with blocking calls: the read
   * blocks this thread no longer than hashing the same bytes does (which it
   * must anyway), and saves three thread-pool round trips (open, stat, read)
   * that cost more than the read itself for small chunks on a busy machine.
   * "large" when the object is bigger (the async path takes over).
   */
  private readSmallSync(
    id: ContentId,
    dest: Uint8Array | undefined,
  ): { id: ContentId; bytes: Uint8Array; meta: ChunkMeta; metaJson: Buffer } | "absent" | "large" {
    let fd: number;
    try {
      fd = openSync(this.pathOf(id), "r");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return "absent";
      throw err;
    }
    try {
      const { size } = fstatSync(fd);
      if (size > this.syncReadMaxBytes) return "large";
      // Read into the tier's one warm scratch buffer (safe to share: nothing
      // between here and the copy out yields), then copy the verified payload
      // out: into `dest`, or a fresh buffer for get().
      this.scratch ??= Buffer.allocUnsafe(this.syncReadMaxBytes);
      const whole = this.scratch.subarray(0, size);
      let got = 0;
      while (got < size) {
        const n = readSync(fd, whole, got, size - got, got);
        if (n === 0) break;
        got += n;
      }
      const verified = this.verifyWhole(id, whole.subarray(0, got), dest);
      return dest === undefined ? { ...verified, bytes: Buffer.from(verified.bytes) } : verified;
    } finally {
      closeSync(fd);
    }
  }

  /** Verifies a whole framed object held in memory; get() returns the payload as a view of it. */
  private verifyWhole(
    id: ContentId,
    whole: Buffer,
    dest: Uint8Array | undefined,
  ): { id: ContentId; bytes: Uint8Array; meta: ChunkMeta; metaJson: Buffer } {
    const frame = parseHeader("file", id, whole, whole.byteLength);
    const metaJson = Buffer.from(whole.subarray(HEADER_BYTES, frame.payloadOffset));
    const meta = parseMeta("file", id, metaJson);
    const payload = whole.subarray(frame.payloadOffset);
    checkDigest("file", id, contentHasher(metaJson).update(payload));
    if (dest === undefined) return { id, bytes: payload, meta, metaJson };
    if (dest.byteLength < payload.byteLength) {
      throw new InvalidChunkError(
        `chunk ${id}: destination of ${dest.byteLength} bytes is smaller than its ${payload.byteLength}`,
      );
    }
    dest.set(payload, 0);
    return { id, bytes: dest.subarray(0, payload.byteLength), meta, metaJson };
  }

  /**
   * An object of at most one piece: one read of the whole file, then one hash
   * (nothing to overlap).
   */
  private async readSmall(
    id: ContentId,
    fh: FileHandle,
    size: number,
    dest: Uint8Array | undefined,
  ): Promise<{ id: ContentId; bytes: Uint8Array; meta: ChunkMeta; metaJson: Buffer }> {
    const whole = Buffer.allocUnsafe(size);
    const got = await readFully(fh, whole, 0, size, 0);
    return this.verifyWhole(id, whole.subarray(0, got), dest);
  }

  async has(id: unknown): Promise<boolean> {
    this.open();
    return (await stat(this.pathOf(checkId(id))).catch(() => undefined)) !== undefined;
  }

  async delete(id: unknown): Promise<boolean> {
    this.open();
    const cid = checkId(id);
    const p = this.pathOf(cid);
    const st = await stat(p).catch(() => undefined);
    if (st === undefined) return false;
    try {
      await unlink(p);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return false;
      throw new StoreUnavailableError("file", `delete ${cid}`, 1, err);
    }
    this.recency.delete(cid);
    this.storedBytes -= st.size;
    return true;
  }

  async *list(): AsyncIterable<ChunkInfo> {
    for await (const { id, storedBytes } of this.scan()) yield { id, storedBytes };
  }

  private async *scan(): AsyncIterable<{ id: ContentId; storedBytes: number; mtimeMs: number }> {
    const root = join(this.dir, "objects");
    for (const a of (await readdir(root)).sort()) {
      for (const b of (await readdir(join(root, a)).catch(() => [] as string[])).sort()) {
        for (const name of (await readdir(join(root, a, b)).catch(() => [] as string[])).sort()) {
          if (!ID_NAME.test(name)) continue;
          const st = await stat(join(root, a, b, name)).catch(() => undefined);
          if (st !== undefined) yield { id: name as ContentId, storedBytes: st.size, mtimeMs: st.mtimeMs };
        }
      }
    }
  }

  stats(): TierStats {
    return {
      tier: "file",
      objects: this.recency.size,
      bytes: this.storedBytes,
      capacityBytes: this.maxBytes,
      ...this.counters,
    };
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.allSettled([...this.writing.values()]);
  }

  /** Moves a failed object aside (kept for inspection) so the id reads as absent and can be rewritten. */
  private async quarantine(id: ContentId): Promise<void> {
    const from = this.pathOf(id);
    const st = await stat(from).catch(() => undefined);
    try {
      await rename(from, join(this.dir, "corrupt", id));
    } catch {
      await unlink(from).catch(() => undefined);
    }
    if (st !== undefined) {
      this.recency.delete(id);
      this.storedBytes -= st.size;
    }
  }

  /** A verified read: counted, and the object is now the most recently used. */
  private touched(id: ContentId): void {
    this.counters.hits++;
    const bytes = this.recency.get(id);
    if (bytes === undefined) return;
    this.recency.delete(id);
    this.recency.set(id, bytes);
  }

  private async ensureShard(id: ContentId): Promise<void> {
    const shard = `${id.slice(0, 2)}/${id.slice(2, 4)}`;
    if (this.shards.has(shard)) return;
    await mkdir(join(this.dir, "objects", id.slice(0, 2), id.slice(2, 4)), { recursive: true });
    this.shards.add(shard);
  }

  private open(): void {
    if (this.closed) throw new StoreClosedError("file tier is closed");
  }
}

/** Reads `len` bytes of the file at `filePos` into buf[at…] unless the file ends first; returns bytes read. */
async function readFully(
  fh: FileHandle,
  buf: Uint8Array,
  at: number,
  len: number,
  filePos: number,
): Promise<number> {
  let got = 0;
  while (got < len) {
    const { bytesRead } = await fh.read(buf, at + got, len - got, filePos + got);
    if (bytesRead === 0) break;
    got += bytesRead;
  }
  return got;
}

/** fsync a directory so a rename into it survives a crash. */
async function syncDir(dir: string): Promise<void> {
  const fh = await open(dir, "r");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}
