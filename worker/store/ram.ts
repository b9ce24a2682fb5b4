import type { ContentId } from "../../schema/ids.ts";
import {
  type ChunkInfo,
  type ChunkTier,
  checkDigest,
  checkId,
  contentHasher,
  type StoreReporter,
  stderrReporter,
  TierCounters,
  type TierStats,
  VerifiedChunk,
} from "./chunk.ts";
import { CorruptChunkError, ObjectTooLargeError, RamFullError, StoreClosedError } from "./errors.ts";

export interface RamTierOptions {
  /** LRU bound on payload bytes held. */
  readonly maxBytes: number;
  /** Largest single object; defaults to maxBytes. */
  readonly maxObjectBytes?: number;
  readonly report?: StoreReporter;
}

/**
 * The RAM tier: an LRU bounded in payload bytes. Invariant: `bytesHeld` is the
 * sum of held payload sizes and never exceeds `maxBytes` after a put returns.
 *
 * Put keeps a private copy (a caller may reuse its buffer); get verifies the
 * content hash (memory can be scribbled on) and hands out a fresh copy, so a
 * caller writing into what it got never corrupts the cache.
 */
export class RamTier implements ChunkTier {
  readonly tier = "ram" as const;
  readonly maxBytes: number;
  readonly maxObjectBytes: number;
  private readonly report: StoreReporter;
  /** Map iteration order is the LRU order: first = least recently used. */
  private readonly entries = new Map<ContentId, VerifiedChunk>();
  private bytesHeld = 0;
  /** Held entries eviction passes over (placed chunks: worker/prefetch/), and their bytes. */
  private readonly pinned = new Set<ContentId>();
  private pinnedBytes = 0;
  /** Gets served from a pinned entry. */
  private pinnedHits = 0;
  private readonly counters = new TierCounters();
  private closed = false;

  constructor(opts: RamTierOptions) {
    if (!Number.isSafeInteger(opts.maxBytes) || opts.maxBytes < 0) {
      throw new RangeError(`ram tier: maxBytes must be a non-negative integer, got ${opts.maxBytes}`);
    }
    this.maxBytes = opts.maxBytes;
    this.maxObjectBytes = Math.min(opts.maxObjectBytes ?? opts.maxBytes, opts.maxBytes);
    this.report = opts.report ?? stderrReporter;
  }

  /** Whether an object of this size could be held at all. */
  fits(bytes: number): boolean {
    return bytes <= this.maxObjectBytes;
  }

  async put(id: unknown, bytes: unknown, meta: unknown): Promise<void> {
    this.open();
    await this.putVerified(VerifiedChunk.check(id, bytes, meta, this));
  }

  async putVerified(chunk: VerifiedChunk): Promise<void> {
    this.open();
    const size = chunk.bytes.byteLength;
    if (size > this.maxObjectBytes) throw new ObjectTooLargeError("ram", size, this.maxObjectBytes);
    const wasPinned = this.pinned.has(chunk.id);
    if (
      this.pinnedBytes - (wasPinned ? this.entries.get(chunk.id)!.bytes.byteLength : 0) + size >
      this.maxBytes
    )
      throw new RamFullError(size, this.pinnedBytes, this.maxBytes);
    this.remove(chunk.id);
    // Evict least recently used unpinned entries until the new object fits:
    // bytesHeld + size ≤ maxBytes (reachable: pinned bytes + size ≤ maxBytes, checked above).
    for (const [victim, held] of this.entries) {
      if (this.bytesHeld + size <= this.maxBytes) break;
      if (this.pinned.has(victim)) continue;
      this.entries.delete(victim);
      this.bytesHeld -= held.bytes.byteLength;
      this.counters.evictions++;
    }
    this.entries.set(chunk.id, chunk.withBytes(Uint8Array.prototype.slice.call(chunk.bytes)));
    this.bytesHeld += size;
    if (wasPinned) {
      this.pinned.add(chunk.id);
      this.pinnedBytes += size;
    }
    this.counters.puts++;
    if (this.bytesHeld > this.maxBytes)
      throw new Error(`ram tier invariant: ${this.bytesHeld} > ${this.maxBytes}`);
  }

  async get(id: unknown): Promise<VerifiedChunk | undefined> {
    this.open();
    const cid = checkId(id);
    const held = this.entries.get(cid);
    if (held === undefined) {
      this.counters.misses++;
      return undefined;
    }
    try {
      checkDigest("ram", cid, contentHasher(held.metaJson).update(held.bytes));
    } catch (err) {
      // Drop it so the next put (or a promotion) replaces it with good bytes.
      this.remove(cid);
      this.counters.corrupt++;
      if (err instanceof CorruptChunkError)
        this.report({ kind: "corrupt", tier: "ram", id: cid, reason: err.reason });
      throw err;
    }
    // Touch: move to the most recently used end.
    this.entries.delete(cid);
    this.entries.set(cid, held);
    this.counters.hits++;
    if (this.pinned.has(cid)) this.pinnedHits++;
    return held.withBytes(Uint8Array.prototype.slice.call(held.bytes));
  }

  async has(id: unknown): Promise<boolean> {
    this.open();
    return this.entries.has(checkId(id));
  }

  async delete(id: unknown): Promise<boolean> {
    this.open();
    return this.remove(checkId(id));
  }

  async *list(): AsyncIterable<ChunkInfo> {
    this.open();
    for (const [id, held] of [...this.entries]) yield { id, storedBytes: held.bytes.byteLength };
  }

  /**
   * Keeps a held entry out of LRU eviction until unpinned (or deleted); false
   * when it is not held. Pinned bytes never exceed maxBytes: a put that would
   * need a pinned entry's room fails with RamFullError instead.
   */
  pin(id: ContentId): boolean {
    const held = this.entries.get(id);
    if (held === undefined) return false;
    if (!this.pinned.has(id)) {
      this.pinned.add(id);
      this.pinnedBytes += held.bytes.byteLength;
    }
    return true;
  }

  /** Lets a pinned entry be evicted again (least recently used first, as any other). */
  unpin(id: ContentId): void {
    if (!this.pinned.delete(id)) return;
    this.pinnedBytes -= this.entries.get(id)!.bytes.byteLength;
  }

  /** Whether the tier holds `id` now (no verification, no LRU touch). */
  isHeld(id: ContentId): boolean {
    return this.entries.has(id);
  }

  isPinned(id: ContentId): boolean {
    return this.pinned.has(id);
  }

  /** Pinned entries: their count, bytes, and the gets they served. */
  pinStats(): { readonly entries: number; readonly bytes: number; readonly hits: number } {
    return { entries: this.pinned.size, bytes: this.pinnedBytes, hits: this.pinnedHits };
  }

  stats(): TierStats {
    return {
      tier: "ram",
      objects: this.entries.size,
      bytes: this.bytesHeld,
      capacityBytes: this.maxBytes,
      ...this.counters,
    };
  }

  async close(): Promise<void> {
    this.closed = true;
    this.entries.clear();
    this.bytesHeld = 0;
    this.pinned.clear();
    this.pinnedBytes = 0;
  }

  /**
   * Test hook for fault injection: the bytes the tier holds for `id` (not a
   * copy), so a test can scribble on them and see the next get refuse.
   */
  heldBytesForTest(id: ContentId): Uint8Array | undefined {
    return this.entries.get(id)?.bytes;
  }

  private remove(id: ContentId): boolean {
    const held = this.entries.get(id);
    if (held === undefined) return false;
    this.entries.delete(id);
    this.bytesHeld -= held.bytes.byteLength;
    if (this.pinned.delete(id)) this.pinnedBytes -= held.bytes.byteLength;
    return true;
  }

  private open(): void {
    if (this.closed) throw new StoreClosedError("ram tier is closed");
  }
}
