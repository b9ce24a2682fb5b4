import type { ContentId } from "../../schema/ids.ts";
import {
  type ChunkInfo,
  type ChunkTier,
  checkId,
  type StoreReporter,
  stderrReporter,
  type TierStats,
  VerifiedChunk,
} from "./chunk.ts";
import { CorruptChunkError, describe, FileFullError, StoreClosedError, StoreError } from "./errors.ts";
import type { FileTier } from "./file.ts";
import type { RamTier } from "./ram.ts";
import type { S3Tier } from "./s3.ts";
import {
  type DrainReport,
  type Durability,
  WriteBehindQueue,
  type WriteBehindStats,
} from "./write-behind.ts";

export interface TieredStoreOptions {
  readonly ram?: RamTier;
  readonly file?: FileTier;
  readonly s3?: S3Tier;
  /** Largest chunk the store accepts at all. */
  readonly maxObjectBytes: number;
  /** Write-behind bounds (used when an S3 tier is present). */
  readonly writeBehind: {
    readonly capacity: number;
    readonly maxBytes: number;
    readonly concurrency: number;
    readonly requiredWaitMs: number;
  };
  /** Promotions to the file tier running beside gets at once; more are skipped. */
  readonly maxPromotions?: number;
  readonly report?: StoreReporter;
}

export type PutResult =
  | {
      readonly status: "stored";
      /** "queued": S3 write-behind pending; "none": no S3 tier, the local tiers are the durable ones. */
      readonly remote: "queued" | "none";
      /** The chunk files hold it. False when they are full (store.dir.maxBytes) and S3 is to hold it instead. */
      readonly files: boolean;
      /** Resolves once the most durable tier holds the chunk; rejects if its upload failed for good. */
      readonly durable: Promise<void>;
    }
  | { readonly status: "refused"; readonly reason: string };

export interface StoreStats {
  readonly tiers: readonly TierStats[];
  readonly writeBehind: WriteBehindStats | null;
  readonly promotions: number;
}

/**
 * The chunk store: RAM → local files → S3.
 *
 * put: validate once (hash), take room in the write-behind queue (optional
 * writes are refused at once when it is full, required ones wait with a
 * timeout), write the file tier then RAM, hand the chunk to the uploaders.
 * A refused or failed put leaves every tier as it was.
 *
 * get: read-through, fastest tier first. A corrupt object is reported by its
 * tier and the next tier is tried; a hit in a slower tier is promoted to the
 * faster ones (RAM at once, file in the background).
 */
export class TieredChunkStore {
  private readonly ram: RamTier | undefined;
  private readonly file: FileTier | undefined;
  private readonly s3: S3Tier | undefined;
  private readonly order: readonly ChunkTier[];
  private readonly queue: WriteBehindQueue | undefined;
  private readonly maxObjectBytes: number;
  private readonly maxPromotions: number;
  private readonly report: StoreReporter;
  private readonly promoting = new Set<Promise<void>>();
  private readonly puts = new Set<Promise<unknown>>();
  private promotions = 0;
  private closed = false;

  constructor(opts: TieredStoreOptions) {
    this.ram = opts.ram;
    this.file = opts.file;
    this.s3 = opts.s3;
    this.order = [opts.ram, opts.file, opts.s3].filter((t): t is NonNullable<typeof t> => t !== undefined);
    if (this.order.length === 0) throw new RangeError("tiered store: configure at least one tier");
    this.maxObjectBytes = opts.maxObjectBytes;
    this.maxPromotions = opts.maxPromotions ?? 8;
    this.report = opts.report ?? stderrReporter;
    const s3 = opts.s3;
    if (s3 !== undefined) {
      this.queue = new WriteBehindQueue({
        ...opts.writeBehind,
        upload: (chunk) => s3.putVerified(chunk),
        report: this.report,
      });
    }
  }

  async put(
    id: unknown,
    bytes: unknown,
    meta: unknown,
    durability: Durability = "required",
  ): Promise<PutResult> {
    this.open();
    const chunk = VerifiedChunk.check(id, bytes, meta, {
      tier: "store",
      maxObjectBytes: this.maxObjectBytes,
    });
    const p = this.putChecked(chunk, durability);
    this.puts.add(p);
    const done = () => this.puts.delete(p);
    p.then(done, done);
    return p;
  }

  private async putChecked(chunk: VerifiedChunk, durability: Durability): Promise<PutResult> {
    const pending = this.queue?.pendingFor(chunk.id);
    const slot =
      pending === undefined && this.queue !== undefined
        ? await this.queue.reserve(chunk.bytes.byteLength, durability)
        : undefined;
    if (slot !== undefined && "refused" in slot) return { status: "refused", reason: slot.refused };
    const toS3 = pending !== undefined || slot !== undefined;
    let files: boolean;
    try {
      files = this.file !== undefined && (await this.putFiles(chunk, toS3));
      if (this.ram?.fits(chunk.bytes.byteLength)) await this.ram.putVerified(chunk);
    } catch (err) {
      slot?.release();
      // Full files and no S3 to hold the chunk: refused like a full queue, the caller skips it.
      if (err instanceof FileFullError) return { status: "refused", reason: err.message };
      throw err;
    }
    if (pending !== undefined) return { status: "stored", remote: "queued", files, durable: pending };
    if (slot !== undefined) return { status: "stored", remote: "queued", files, durable: slot.commit(chunk) };
    return { status: "stored", remote: "none", files, durable: Promise.resolve() };
  }

  /** Writes the chunk files; full files are passed over (false) only when S3 is to hold the chunk. */
  private async putFiles(chunk: VerifiedChunk, toS3: boolean): Promise<boolean> {
    try {
      await this.file!.putVerified(chunk);
      return true;
    } catch (err) {
      if (toS3 && err instanceof FileFullError) return false;
      throw err;
    }
  }

  /** The verified chunk from the fastest tier that holds a good copy; undefined when none holds it. */
  async get(id: unknown): Promise<VerifiedChunk | undefined> {
    this.open();
    const cid = checkId(id);
    let corrupt: CorruptChunkError | undefined;
    let unavailable: StoreError | undefined;
    for (let i = 0; i < this.order.length; i++) {
      const tier = this.order[i]!;
      let chunk: VerifiedChunk | undefined;
      try {
        chunk = await tier.get(cid);
      } catch (err) {
        // The tier reported a corrupt object itself; other failures are reported here.
        if (err instanceof CorruptChunkError) corrupt = err;
        else if (err instanceof StoreError && !(err instanceof StoreClosedError)) {
          unavailable = err;
          this.report({ kind: "tier-failed", tier: tier.tier, op: "get", id: cid, error: describe(err) });
        } else throw err;
        continue;
      }
      if (chunk === undefined) continue;
      await this.promote(chunk, i);
      return chunk;
    }
    // Absent everywhere we could look: say why if some tier could not answer.
    if (unavailable !== undefined) throw unavailable;
    if (corrupt !== undefined) throw corrupt;
    return undefined;
  }

  async has(id: unknown): Promise<boolean> {
    this.open();
    const cid = checkId(id);
    for (const tier of this.order) if (await tier.has(cid)) return true;
    return false;
  }

  /** Removes the chunk from every tier (a queued upload is dropped, one in flight finishes first). */
  async delete(id: unknown): Promise<boolean> {
    this.open();
    const cid = checkId(id);
    if (this.queue !== undefined && !this.queue.cancel(cid)) {
      await this.queue.pendingFor(cid)?.catch(() => undefined);
    }
    let existed = false;
    for (const tier of this.order) existed = (await tier.delete(cid)) || existed;
    return existed;
  }

  /** Every chunk id in any tier, once, with the size in the first tier that lists it. */
  async *list(): AsyncIterable<ChunkInfo> {
    this.open();
    const seen = new Set<ContentId>();
    for (const tier of this.order) {
      for await (const info of tier.list()) {
        if (seen.has(info.id)) continue;
        seen.add(info.id);
        yield info;
      }
    }
  }

  /**
   * Waits until every write-behind job accepted so far has finished. Checkpoint
   * publishes a chunk only after this (or the put's `durable`) resolved without
   * listing it as failed.
   */
  async drain(): Promise<DrainReport> {
    await Promise.allSettled([...this.puts]);
    return this.queue?.drain() ?? { uploaded: 0, failed: [] };
  }

  stats(): StoreStats {
    return {
      tiers: this.order.map((t) => t.stats()),
      writeBehind: this.queue?.stats() ?? null,
      promotions: this.promotions,
    };
  }

  /** Accepts nothing more, finishes accepted puts and uploads, then closes every tier. */
  async close(): Promise<DrainReport> {
    if (this.closed) return { uploaded: 0, failed: [] };
    this.closed = true;
    await Promise.allSettled([...this.puts]);
    const report = (await this.queue?.close()) ?? { uploaded: 0, failed: [] };
    await Promise.allSettled([...this.promoting]);
    await Promise.allSettled(this.order.map((t) => t.close()));
    return report;
  }

  /**
   * Copies a chunk found in tier `found` into the faster tiers. RAM is filled
   * at once; the file write (an fsync) runs beside the caller, at most
   * maxPromotions at a time. Failures are reported, never thrown: the caller
   * already has verified bytes.
   */
  private async promote(chunk: VerifiedChunk, found: number): Promise<void> {
    const faster = this.order.slice(0, found);
    for (const tier of faster) {
      if (tier === this.ram) {
        if (!this.ram.fits(chunk.bytes.byteLength)) continue;
        await this.ram.putVerified(chunk).catch((err) => this.promoteFailed(tier, chunk.id, err));
        this.promotions++;
      } else if (tier === this.file) {
        // Full files (store.dir.maxBytes) take no promotions: the chunk stays where it was found.
        if (this.promoting.size >= this.maxPromotions || this.file.freeBytes() < chunk.bytes.byteLength)
          continue;
        const file = this.file;
        const p = file
          .putVerified(chunk)
          .then(() => {
            this.promotions++;
          })
          .catch((err) => this.promoteFailed(file, chunk.id, err))
          .finally(() => this.promoting.delete(p));
        this.promoting.add(p);
      }
    }
  }

  private promoteFailed(tier: ChunkTier, id: ContentId, err: unknown): void {
    this.report({ kind: "promote-failed", tier: tier.tier, id, error: describe(err) });
  }

  private open(): void {
    if (this.closed) throw new StoreClosedError("chunk store is closed");
  }
}
