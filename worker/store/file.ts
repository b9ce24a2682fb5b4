import type { FileHandle } from "node:fs/promises";
import { mkdir, open, readdir, rename, stat, unlink } from "node:fs/promises";
import { join } from "node:path";
import type { ContentId } from "../../schema/ids.ts";
import {
  type ChunkInfo,
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
import { CorruptChunkError, StoreClosedError, StoreUnavailableError } from "./errors.ts";

export interface FileTierOptions {
  /** Root directory; created when missing. */
  readonly dir: string;
  readonly maxObjectBytes: number;
  /** Bytes per read while hashing; reads of the next piece overlap hashing of this one. */
  readonly readPieceBytes?: number;
  readonly report?: StoreReporter;
}

const ID_NAME = /^[0-9a-f]{64}$/;
/** Temp files older than this at open are leftovers of a crash. */
const STALE_TEMP_MS = 10 * 60_000;
/** First read covers the header and the largest metadata, so the frame is known after one read. */
const MIN_PIECE = HEADER_BYTES + MAX_META_BYTES;

/**
 * The local file tier. Layout under `dir`:
 *
 *   objects/ab/cd/<id>   one framed object per chunk (chunk.ts framing), sharded
 *                        by the id's first two bytes: ≤ 65,536 directories, so a
 *                        million chunks make ~16 entries per directory
 *   tmp/                 writes in progress
 *   corrupt/<id>         the last object of that id that failed verification
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
  private readonly pieceBytes: number;
  private readonly report: StoreReporter;
  private readonly counters = new TierCounters();
  private objects = 0;
  private storedBytes = 0;
  /** Shard directories known to exist: saves a mkdir per put. */
  private readonly shards = new Set<string>();
  /** Puts in flight by id: concurrent puts of one chunk become one write. */
  private readonly writing = new Map<ContentId, Promise<void>>();
  private tempSeq = 0;
  private closed = false;

  private constructor(opts: FileTierOptions) {
    this.dir = opts.dir;
    this.maxObjectBytes = opts.maxObjectBytes;
    this.pieceBytes = Math.max(MIN_PIECE, opts.readPieceBytes ?? 4 << 20);
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
    for await (const info of tier.list()) {
      tier.objects++;
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

  private async write(chunk: VerifiedChunk): Promise<void> {
    const header = encodeHeader(chunk.metaJson, chunk.bytes.byteLength);
    const total = HEADER_BYTES + chunk.metaJson.byteLength + chunk.bytes.byteLength;
    const final = this.pathOf(chunk.id);
    // Content-addressed and immutable: an object of the right size is this
    // chunk (a corrupt one is found and quarantined by the next get).
    const existing = await stat(final).catch(() => undefined);
    if (existing !== undefined && existing.size === total) {
      this.counters.puts++;
      return;
    }
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
    if (existing !== undefined) this.storedBytes -= existing.size;
    else this.objects++;
    this.storedBytes += total;
    this.counters.puts++;
  }

  async get(id: unknown): Promise<VerifiedChunk | undefined> {
    this.open();
    const cid = checkId(id);
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
      const chunk = await this.readVerified(cid, fh);
      this.counters.hits++;
      return chunk;
    } catch (err) {
      if (!(err instanceof CorruptChunkError)) throw new StoreUnavailableError("file", `get ${cid}`, 1, err);
      await this.quarantine(cid);
      this.counters.corrupt++;
      this.report({ kind: "corrupt", tier: "file", id: cid, reason: err.reason });
      throw err;
    } finally {
      await fh.close();
    }
  }

  /**
   * Reads the whole object into one buffer in pieces of `pieceBytes`. While
   * piece k+1 is read (libuv thread pool), piece k's payload is hashed on this
   * thread, so a get costs about max(read, hash), not read + hash.
   */
  private async readVerified(id: ContentId, fh: FileHandle): Promise<VerifiedChunk> {
    const { size } = await fh.stat();
    const buf = Buffer.allocUnsafe(size);
    let filled = await readFully(fh, buf, 0, Math.min(size, this.pieceBytes));
    const frame = parseHeader("file", id, buf, size);
    if (filled < frame.payloadOffset) throw new CorruptChunkError("file", id, "truncated while reading");
    const metaJson = Buffer.from(buf.subarray(HEADER_BYTES, frame.payloadOffset));
    const meta = parseMeta("file", id, metaJson);
    const hash = contentHasher(metaJson);
    let hashed = frame.payloadOffset;
    while (filled < size) {
      const next = readFully(fh, buf, filled, Math.min(size - filled, this.pieceBytes));
      hash.update(buf.subarray(hashed, filled));
      hashed = filled;
      const got = await next;
      if (got === 0)
        throw new CorruptChunkError("file", id, `truncated while reading at byte ${filled} of ${size}`);
      filled += got;
    }
    hash.update(buf.subarray(hashed, filled));
    checkDigest("file", id, hash);
    return VerifiedChunk.trusted(id, buf.subarray(frame.payloadOffset), meta, metaJson);
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
    this.objects--;
    this.storedBytes -= st.size;
    return true;
  }

  async *list(): AsyncIterable<ChunkInfo> {
    const root = join(this.dir, "objects");
    for (const a of (await readdir(root)).sort()) {
      for (const b of (await readdir(join(root, a)).catch(() => [] as string[])).sort()) {
        for (const name of (await readdir(join(root, a, b)).catch(() => [] as string[])).sort()) {
          if (!ID_NAME.test(name)) continue;
          const st = await stat(join(root, a, b, name)).catch(() => undefined);
          if (st !== undefined) yield { id: name as ContentId, storedBytes: st.size };
        }
      }
    }
  }

  stats(): TierStats {
    return {
      tier: "file",
      objects: this.objects,
      bytes: this.storedBytes,
      capacityBytes: null,
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
      this.objects--;
      this.storedBytes -= st.size;
    }
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

/** Reads exactly `len` bytes at `pos` (= buffer offset) unless the file ends first; returns bytes read. */
async function readFully(fh: FileHandle, buf: Buffer, pos: number, len: number): Promise<number> {
  let got = 0;
  while (got < len) {
    const { bytesRead } = await fh.read(buf, pos + got, len - got, pos + got);
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
