import type { CatalogDb } from "../../catalog/db.ts";
import { readyReplicasOfChunk } from "../../catalog/queries.ts";
import type { ContentId, NodeId } from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import type { CatalogLink } from "../checkpoint/catalog-link.ts";
import type { FileTier } from "../store/file.ts";

export interface FileReclaimerOptions {
  readonly file: FileTier;
  readonly catalog: CatalogLink;
  readonly logger: Logger;
  /** Free bytes the files keep, so a checkpoint finds room without waiting for a round. */
  readonly headroomBytes: number;
  readonly intervalMs: number;
  readonly maxScan: number;
  readonly maxDelete: number;
}

export interface ReclaimCandidate {
  readonly id: ContentId;
  readonly storedBytes: number;
}

/**
 * The objects to delete so that `needBytes` come free: coldest first, only
 * those `droppable` allows, at most `maxDelete`. Fewer (or none) when the
 * droppable ones do not add up; the caller tries again next round.
 */
export function pickReclaim(
  coldest: readonly ReclaimCandidate[],
  needBytes: number,
  droppable: (id: ContentId) => boolean,
  maxDelete: number,
): ReclaimCandidate[] {
  const out: ReclaimCandidate[] = [];
  let freed = 0;
  for (const c of coldest) {
    if (freed >= needBytes || out.length >= maxDelete) break;
    if (!droppable(c.id)) continue;
    out.push(c);
    freed += c.storedBytes;
  }
  return out;
}

export interface ReclaimStats {
  readonly rounds: number;
  readonly deleted: number;
  readonly deletedBytes: number;
  /** Rounds that found nothing droppable among the coldest maxScan objects. */
  readonly stuck: number;
}

const MAX_BACKOFF_TICKS = 40;

/**
 * Makes room in the chunk files (store.dir.maxBytes) when S3 is on: the
 * files are then a cache of S3, and their least recently used chunks that S3
 * holds ready are deleted, their SSD replica withdrawn first. A chunk S3 does
 * not hold ready (its upload pending, or S3 off) is never deleted here: the
 * files may be its only durable copy. Nor is one placed on this worker's SSD
 * (the placement authority wants it there; prefetch would fetch it again).
 *
 * Bounds: one round at a time, every intervalMs while fewer than headroomBytes
 * are free; a round looks at the maxScan coldest objects (one pass over the
 * catalog's chunks to find theirs) and deletes at most maxDelete of them. A
 * round that finds nothing droppable doubles the wait before the next, up to
 * MAX_BACKOFF_TICKS intervals, so full files of pending uploads cost little.
 */
export class FileReclaimer {
  private readonly timer: NodeJS.Timeout;
  private running: Promise<void> | null = null;
  private stopped = false;
  /** Ticks to pass over after rounds that found nothing droppable; stuckStreak of them in a row. */
  private skipTicks = 0;
  private stuckStreak = 0;
  private readonly counters = { rounds: 0, deleted: 0, deletedBytes: 0, stuck: 0 };

  constructor(private readonly opts: FileReclaimerOptions) {
    for (const k of ["headroomBytes", "intervalMs", "maxScan", "maxDelete"] as const) {
      const v = opts[k];
      if (!Number.isSafeInteger(v) || v < 1)
        throw new RangeError(`file reclaimer: ${k} must be a positive integer, got ${v}`);
    }
    this.timer = setInterval(() => this.tick(), opts.intervalMs);
    this.timer.unref();
  }

  stats(): ReclaimStats {
    return { ...this.counters };
  }

  /** Runs a round now if the files are short of headroom (and none is running); resolves when it ends. */
  tick(): Promise<void> {
    if (this.running !== null) return this.running;
    if (this.stopped || this.opts.file.freeBytes() >= this.opts.headroomBytes) return Promise.resolve();
    if (this.skipTicks > 0) {
      this.skipTicks--;
      return Promise.resolve();
    }
    this.running = this.round()
      .catch((err) =>
        this.opts.logger.log("warn", "store.reclaim_failed", { message: (err as Error).message }),
      )
      .finally(() => {
        this.running = null;
      });
    return this.running;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await this.running;
  }

  private async round(): Promise<void> {
    const { file, catalog } = this.opts;
    this.counters.rounds++;
    const coldest: ReclaimCandidate[] = [];
    for (const c of file.coldest()) {
      if (coldest.length >= this.opts.maxScan) break;
      coldest.push(c);
    }
    const chunks = chunksByContent(catalog.db, new Set(coldest.map((c) => c.id)));
    const placed = placedOnMySsd(catalog.db, catalog.id.workerId);
    const droppable = (id: ContentId): boolean => {
      const c = chunks.get(id);
      return (
        c !== undefined && !placed.has(c) && readyReplicasOfChunk(catalog.db, c).some((r) => r.tier === "s3")
      );
    };
    const need = this.opts.headroomBytes - file.freeBytes();
    const victims = pickReclaim(coldest, need, droppable, this.opts.maxDelete);
    if (victims.length === 0) {
      this.counters.stuck++;
      this.stuckStreak++;
      this.skipTicks = Math.min(MAX_BACKOFF_TICKS, 2 ** this.stuckStreak - 1);
      return;
    }
    this.stuckStreak = 0;
    // Withdrawn first, so nobody plans on the copy (a reader racing it finds it missing and falls back).
    const me = catalog.id.workerId;
    const withdraw = victims
      .map((v) => catalog.db.get(chunks.get(v.id)!, "chunk/node") as NodeId)
      .filter((node) => catalog.holdsReady(node, "ssd"))
      .map((node) => ({
        op: "replica.removed" as const,
        node,
        worker: me,
        tier: "ssd" as const,
        verifiedAt: Date.now(),
      }));
    if (withdraw.length > 0) await catalog.propose(withdraw);
    let bytes = 0;
    for (const v of victims) {
      if (!(await file.delete(v.id))) continue;
      this.counters.deleted++;
      bytes += v.storedBytes;
    }
    this.counters.deletedBytes += bytes;
    this.opts.logger.log("info", "store.reclaimed", {
      objects: victims.length,
      bytes,
      freeBytes: file.freeBytes(),
    });
  }
}

/** Chunk entities of the given content ids: one pass over the catalog's chunks. */
function chunksByContent(db: CatalogDb, ids: ReadonlySet<ContentId>): Map<ContentId, number> {
  const out = new Map<ContentId, number>();
  if (ids.size === 0) return out;
  for (const c of db.holders("chunk/content")) {
    const id = db.get(c, "chunk/content") as ContentId;
    if (ids.has(id)) out.set(id, c);
  }
  return out;
}

/** Chunks with a desired SSD placement on this worker. */
function placedOnMySsd(db: CatalogDb, workerId: string): Set<number> {
  const me = db.eidOf("worker/id", workerId);
  const out = new Set<number>();
  if (me === undefined) return out;
  for (const p of db.holders("placement/chunk")) {
    if (db.get(p, "placement/worker") !== me || db.get(p, "placement/tier") !== "ssd") continue;
    if (db.get(p, "placement/desired") === true) out.add(db.get(p, "placement/chunk") as number);
  }
  return out;
}
