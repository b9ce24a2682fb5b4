import type { CatalogDb } from "../../catalog/db.ts";
import { readyReplicasOfChunk } from "../../catalog/queries.ts";
import type { TxReport } from "../../catalog/replica.ts";
import { ContentId, type ModelFingerprint, type NodeId, type PrefixHash } from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import type { CatalogLink } from "../checkpoint/catalog-link.ts";
import { type ChunkDescriptor, metaMismatch } from "../checkpoint/chunk-format.ts";
import { fetchPeerChunk } from "../peer/client.ts";
import type { VerifiedChunk } from "../store/chunk.ts";
import type { ChunkTiers } from "../store/chunk-tiers.ts";
import { FileFullError } from "../store/errors.ts";
import { type LocalState, type PlacedTier, planPrefetch, type WorkerPlacement } from "./plan.ts";

/**
 * Prefetch: this worker follows its catalog replica and, for the placements
 * addressed to it (`placement.set` facts of the placement authority), pulls
 * the chunks into its RAM or SSD ahead of demand, verifies them (content id,
 * then the chunk's catalog metadata), stores them and publishes its ready
 * replicas, so a later request restores them from local memory instead of
 * fetching on its token path. Withdrawn placements are unpinned (RAM) or
 * deleted (SSD copies it fetched) — never the last durable copy
 * (worker/prefetch/plan.ts).
 *
 * Never on the token path: jobs run one at a time beside the runtime loop,
 * and a job starts only while `busy()` is false (the runtime holds no
 * request: a fetch, its verification and its store take CPU the steps would
 * otherwise have), or after `maxDeferMs`, whichever is first. Bounds, each
 * skipping (and logging) a placement rather than delaying anything:
 *   - at most `maxQueued` jobs wait (queue_full);
 *   - pinned RAM bytes ≤ ramBytes and fetched SSD bytes ≤ ssdBytes
 *     (store_full);
 *   - one fetch per source with a `fetchTimeoutMs` deadline, then the next
 *     source; no source left: no_source.
 * A skipped placement is planned again on the next placement or replica
 * change in the catalog, or after `retryMs`.
 */

export interface PrefetcherOptions {
  readonly tiers: ChunkTiers;
  readonly catalog: CatalogLink;
  /** Bearer secret for peer reads (auth.clusterSecret); empty: peers are not a source. */
  readonly peerSecret: string;
  readonly maxQueued: number;
  readonly ramBytes: number;
  readonly ssdBytes: number;
  readonly fetchTimeoutMs: number;
  readonly maxDeferMs: number;
  /** Placements skipped or not yet readable (an S3 upload still in flight) are tried again this often. */
  readonly retryMs: number;
  /** True while the runtime holds a request (waiting, prefilling or decoding). */
  readonly busy: () => boolean;
  readonly logger: Logger;
}

export type SkipReason = "queue_full" | "store_full" | "no_source" | "failed";

export interface PrefetchStats {
  readonly queued: number;
  readonly fetched: Readonly<Record<PlacedTier, number>>;
  readonly fetchedBytes: number;
  readonly skipped: Readonly<Record<SkipReason, number>>;
  readonly unpinned: number;
  readonly deleted: number;
  readonly keptLast: number;
  /** Reads served from pinned (placed) RAM copies: restores and peer reads that needed no fetch. */
  readonly hits: number;
  readonly pinnedBytes: number;
  readonly ssdBytes: number;
}

interface Job {
  readonly node: NodeId;
  readonly tier: PlacedTier;
  readonly queuedAt: number;
}

const DEFER_POLL_MS = 25;

export class Prefetcher {
  private readonly queue: Job[] = [];
  private readonly queuedKeys = new Set<string>();
  /** Copies this process fetched: node → tiers, and the SSD bytes they hold. */
  private readonly fetchedCopies = new Map<NodeId, { tiers: Set<PlacedTier>; bytes: number }>();
  private ssdUsed = 0;
  private running: Promise<void> | null = null;
  private reconcileScheduled = false;
  private stopped = false;
  private readonly unlisten: () => void;
  private readonly retry: NodeJS.Timeout;
  private readonly keptLastLogged = new Set<NodeId>();
  private readonly counters = {
    queued: 0,
    fetched: { ram: 0, ssd: 0 } as Record<PlacedTier, number>,
    fetchedBytes: 0,
    skipped: { queue_full: 0, store_full: 0, no_source: 0, failed: 0 } as Record<SkipReason, number>,
    unpinned: 0,
    deleted: 0,
    keptLast: 0,
  };

  constructor(private readonly opts: PrefetcherOptions) {
    if (!Number.isSafeInteger(opts.maxQueued) || opts.maxQueued < 1)
      throw new RangeError(`prefetch maxQueued must be an integer ≥ 1, got ${opts.maxQueued}`);
    this.unlisten = opts.catalog.replica.listen((reports) => this.onReports(reports));
    this.retry = setInterval(() => this.scheduleReconcile(), opts.retryMs);
    this.scheduleReconcile();
  }

  stats(): PrefetchStats {
    const pins = this.opts.tiers.ram?.pinStats() ?? { entries: 0, bytes: 0, hits: 0 };
    return {
      ...structuredClone(this.counters),
      hits: pins.hits,
      pinnedBytes: pins.bytes,
      ssdBytes: this.ssdUsed,
    };
  }

  /** Resolves once the queue is empty and no job runs (tests, shutdown). */
  async idle(): Promise<void> {
    while (this.running !== null || this.reconcileScheduled) {
      await (this.running ?? new Promise((r) => setImmediate(r)));
    }
  }

  /** Stops following the catalog; the job in flight finishes, queued ones are dropped. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.unlisten();
    clearInterval(this.retry);
    this.queue.length = 0;
    this.queuedKeys.clear();
    await this.running;
  }

  private onReports(reports: readonly TxReport[]): void {
    for (const { tx } of reports)
      for (const d of tx.datoms)
        if (d[1].startsWith("placement/") || d[1] === "replica/state") {
          this.scheduleReconcile();
          return;
        }
  }

  private scheduleReconcile(): void {
    if (this.reconcileScheduled || this.stopped) return;
    this.reconcileScheduled = true;
    setImmediate(() => {
      this.reconcileScheduled = false;
      if (this.stopped) return;
      try {
        this.reconcile();
      } catch (err) {
        this.opts.logger.log("error", "prefetch.reconcile_failed", { message: (err as Error).message });
      }
    });
  }

  // ---- what to do ------------------------------------------------------------

  private get db(): CatalogDb {
    return this.opts.catalog.db;
  }

  /** This worker's placements (desired or withdrawn), from the replica. */
  private placements(): WorkerPlacement[] {
    const db = this.db;
    const me = db.eidOf("worker/id", this.opts.catalog.id.workerId);
    if (me === undefined) return [];
    const out: WorkerPlacement[] = [];
    for (const p of db.holders("placement/chunk")) {
      if (db.get(p, "placement/worker") !== me) continue;
      const tier = db.get(p, "placement/tier");
      if (tier !== "ram" && tier !== "ssd") continue;
      out.push({
        node: db.get(db.get(p, "placement/chunk") as number, "chunk/node") as NodeId,
        tier,
        desired: db.get(p, "placement/desired") === true,
      });
    }
    return out;
  }

  private contentOf(node: NodeId): ContentId | undefined {
    const c = this.db.eidOf("chunk/node", node);
    return c === undefined ? undefined : ContentId(this.db.get(c, "chunk/content"));
  }

  private local(): LocalState {
    const ram = this.opts.tiers.ram;
    const cat = this.opts.catalog;
    // Held: the catalog shows the copy ready, or this process stored it and its
    // replica.ready is on its way (not yet applied here); a RAM copy must also
    // still be in the tier (an unpinned one may have been evicted).
    return {
      holds: (node, tier) => {
        const mine = this.fetchedCopies.get(node)?.tiers.has(tier) ?? false;
        if (!mine && !cat.holdsReady(node, tier)) return false;
        if (tier === "ssd") return true;
        const id = this.contentOf(node);
        return ram !== undefined && id !== undefined && ram.isHeld(id);
      },
      fetched: (node, tier) => this.fetchedCopies.get(node)?.tiers.has(tier) ?? false,
      durableElsewhere: (node) => {
        const c = this.db.eidOf("chunk/node", node);
        if (c === undefined) return false;
        const me = cat.id.workerId;
        return readyReplicasOfChunk(this.db, c).some(
          (r) => r.tier === "s3" || (r.tier === "ssd" && r.worker !== me),
        );
      },
    };
  }

  private reconcile(): void {
    const ram = this.opts.tiers.ram;
    for (const step of planPrefetch(this.placements(), this.local())) {
      const id = this.contentOf(step.node);
      if (id === undefined) continue;
      switch (step.kind) {
        case "fetch":
          this.enqueue(step.node, step.tier);
          break;
        case "pin":
          if (ram && !ram.isPinned(id)) this.pinWithinBudget(step.node, id);
          break;
        case "unpin":
          if (ram?.isPinned(id)) {
            ram.unpin(id);
            this.counters.unpinned++;
            this.opts.logger.log("info", "prefetch.unpinned", { node: step.node });
          }
          break;
        case "delete":
          void this.deleteCopy(step.node, id);
          break;
        case "keep-last":
          if (!this.keptLastLogged.has(step.node)) {
            this.keptLastLogged.add(step.node);
            this.counters.keptLast++;
            this.opts.logger.log("info", "prefetch.kept_last_copy", { node: step.node });
          }
          break;
      }
    }
  }

  private skip(node: NodeId, tier: PlacedTier, reason: SkipReason, detail: string): void {
    this.counters.skipped[reason]++;
    this.opts.logger.log("info", "prefetch.skipped", { node, tier, reason, detail });
  }

  private enqueue(node: NodeId, tier: PlacedTier): void {
    const k = `${node}|${tier}`;
    if (this.queuedKeys.has(k)) return;
    if (this.queue.length >= this.opts.maxQueued) {
      this.skip(node, tier, "queue_full", `${this.queue.length} prefetches queued`);
      return;
    }
    this.queue.push({ node, tier, queuedAt: performance.now() });
    this.queuedKeys.add(k);
    this.counters.queued++;
    this.running ??= this.drain().finally(() => {
      this.running = null;
    });
  }

  // ---- doing it --------------------------------------------------------------

  private async drain(): Promise<void> {
    while (this.queue.length > 0 && !this.stopped) {
      const job = this.queue[0]!;
      // Beside the loop: wait while prompts wait to prefill, at most maxDeferMs from queueing.
      while (this.opts.busy() && performance.now() - job.queuedAt < this.opts.maxDeferMs && !this.stopped)
        await new Promise((r) => setTimeout(r, DEFER_POLL_MS));
      this.queue.shift();
      this.queuedKeys.delete(`${job.node}|${job.tier}`);
      if (this.stopped) return;
      try {
        await this.run(job);
      } catch (err) {
        this.skip(job.node, job.tier, "failed", (err as Error).message);
      }
    }
  }

  private async run(job: Job): Promise<void> {
    const { tiers, catalog } = this.opts;
    const db = this.db;
    const c = db.eidOf("chunk/node", job.node);
    const still = this.placements().find((p) => p.node === job.node && p.tier === job.tier);
    if (c === undefined || !still?.desired || this.local().holds(job.node, job.tier)) return;
    const bytes = db.get(c, "chunk/bytes") as number;
    if (job.tier === "ram") {
      if (tiers.ram === undefined) return this.skip(job.node, job.tier, "store_full", "no RAM tier");
      const pinned = tiers.ram.pinStats().bytes;
      if (pinned + bytes > this.opts.ramBytes)
        return this.skip(
          job.node,
          job.tier,
          "store_full",
          `${pinned} of ${this.opts.ramBytes} RAM bytes placed`,
        );
    } else if (this.ssdUsed + bytes > this.opts.ssdBytes) {
      return this.skip(
        job.node,
        job.tier,
        "store_full",
        `${this.ssdUsed} of ${this.opts.ssdBytes} SSD bytes placed`,
      );
    }
    // Files that cannot take an SSD placement's payload skip it before anything is fetched.
    const free = tiers.file.freeBytes();
    if (job.tier === "ssd" && free < bytes)
      return this.skip(
        job.node,
        job.tier,
        "store_full",
        `${free} bytes free in the files (store.dir.maxBytes)`,
      );
    const id = ContentId(db.get(c, "chunk/content"));
    const chunk = await this.fetch(job.node, c, id);
    if (chunk === null) return this.skip(job.node, job.tier, "no_source", "no ready copy could be read");
    const held: PlacedTier[] = [];
    const me = catalog.id.workerId;
    // The SSD copy first (durable here), unless this worker holds one already or its budget is spent.
    const ownSsd = catalog.holdsReady(job.node, "ssd");
    if (!ownSsd && (job.tier === "ssd" || this.ssdUsed + bytes <= this.opts.ssdBytes)) {
      try {
        await tiers.file.putVerified(chunk);
        this.ssdUsed += bytes;
        this.noteFetched(job.node, "ssd", bytes);
        held.push("ssd");
      } catch (err) {
        if (!(err instanceof FileFullError)) throw err;
        if (job.tier === "ssd") return this.skip(job.node, job.tier, "store_full", err.message);
      }
    }
    if (job.tier === "ram") {
      await tiers.ram!.putVerified(chunk);
      tiers.ram!.pin(id);
      this.noteFetched(job.node, "ram", 0);
      held.push("ram");
    }
    this.counters.fetched[job.tier]++;
    this.counters.fetchedBytes += bytes;
    if (held.length === 0) return;
    const verifiedAt = Date.now();
    await catalog.propose(
      held.map((tier) => ({ op: "replica.ready" as const, node: job.node, worker: me, tier, verifiedAt })),
    );
    this.opts.logger.log("info", "prefetch.stored", { node: job.node, tiers: held, bytes });
  }

  private noteFetched(node: NodeId, tier: PlacedTier, bytes: number): void {
    let e = this.fetchedCopies.get(node);
    if (e === undefined) {
      e = { tiers: new Set(), bytes: 0 };
      this.fetchedCopies.set(node, e);
    }
    e.tiers.add(tier);
    e.bytes += bytes;
  }

  private pinWithinBudget(node: NodeId, id: ContentId): void {
    const ram = this.opts.tiers.ram!;
    const c = this.db.eidOf("chunk/node", node)!;
    const bytes = this.db.get(c, "chunk/bytes") as number;
    if (ram.pinStats().bytes + bytes > this.opts.ramBytes) {
      this.skip(
        node,
        "ram",
        "store_full",
        `${ram.pinStats().bytes} of ${this.opts.ramBytes} RAM bytes placed`,
      );
      return;
    }
    ram.pin(id);
  }

  /** The chunk from the cheapest ready source: own SSD, a peer's RAM/SSD, S3; null when none gave it. */
  private async fetch(node: NodeId, c: number, id: ContentId): Promise<VerifiedChunk | null> {
    const { tiers, catalog, peerSecret } = this.opts;
    const me = catalog.id.workerId;
    const sources: { what: string; read: (signal: AbortSignal) => Promise<VerifiedChunk | undefined> }[] = [];
    if (catalog.holdsReady(node, "ssd")) sources.push({ what: "ssd", read: () => tiers.file.get(id) });
    let s3 = false;
    for (const r of readyReplicasOfChunk(this.db, c)) {
      if (r.tier === "s3") s3 = true;
      else if (r.worker !== me && (r.tier === "ram" || r.tier === "ssd") && peerSecret !== "") {
        const address = catalog.addressOf(r.worker);
        if (address !== undefined && !sources.some((s) => s.what === `peer ${r.worker}`))
          sources.push({
            what: `peer ${r.worker}`,
            read: (signal) => fetchPeerChunk(address, id, { secret: peerSecret, signal }),
          });
      }
    }
    if (s3 && tiers.s3) sources.push({ what: "s3", read: () => tiers.s3!.get(id) });
    const expected = this.descriptor(node, c);
    for (const s of sources) {
      const ac = new AbortController();
      const timer = setTimeout(() => ac.abort(), this.opts.fetchTimeoutMs);
      try {
        const got = await Promise.race([
          s.read(ac.signal),
          new Promise<never>((_, reject) =>
            ac.signal.addEventListener("abort", () =>
              reject(new Error(`no answer in ${this.opts.fetchTimeoutMs} ms`)),
            ),
          ),
        ]);
        if (got === undefined) continue;
        const wrong = metaMismatch(
          got.meta,
          expected(got.meta.parent as PrefixHash, got.meta.layers as string),
        );
        if (wrong === null) return got;
        this.opts.logger.log("warn", "prefetch.wrong_chunk", { node, source: s.what, detail: wrong });
      } catch (err) {
        this.opts.logger.log("info", "prefetch.source_failed", {
          node,
          source: s.what,
          message: (err as Error).message,
        });
      } finally {
        clearTimeout(timer);
      }
    }
    return null;
  }

  /**
   * What the catalog promises of the chunk, given the parent its verified
   * metadata names. The catalog links a chunk to its parent chunk, but a
   * chain's root has none: its parent is the tenant's salted root
   * (worker/pages/page-hashes.ts), which the catalog does not record, so at a
   * root the chunk's own parent stands: the read was verified against the
   * content id the catalog holds, which covers the metadata. So does its
   * layer mask: a prefetch moves a chunk whatever layers it holds, and the
   * restore that reads it checks the mask against the group it fills.
   */
  private descriptor(node: NodeId, c: number): (rootParent: PrefixHash, layers: string) => ChunkDescriptor {
    const db = this.db;
    const parent = db.get(c, "chunk/parent") as number | undefined;
    const linked = parent === undefined ? undefined : (db.get(parent, "chunk/prefix") as PrefixHash);
    return (rootParent, layers) => ({
      node,
      prefix: db.get(c, "chunk/prefix") as PrefixHash,
      parent: linked ?? rootParent,
      fingerprint: this.opts.catalog.id.fingerprint as ModelFingerprint,
      start: db.get(c, "chunk/start") as number,
      tokens: db.get(c, "chunk/tokens") as number,
      layout: db.get(c, "chunk/layout") as string,
      layers,
      bytes: db.get(c, "chunk/bytes") as number,
    });
  }

  /**
   * Deletes an SSD copy this process fetched, once another durable copy is
   * ready (checked again here), its replica withdrawn first so nobody plans
   * on it (a reader racing the withdrawal finds it missing and falls back).
   */
  private async deleteCopy(node: NodeId, id: ContentId): Promise<void> {
    const e = this.fetchedCopies.get(node);
    if (e === undefined || !e.tiers.has("ssd") || !this.local().durableElsewhere(node)) return;
    e.tiers.delete("ssd");
    try {
      const me = this.opts.catalog.id.workerId;
      await this.opts.catalog.propose([
        { op: "replica.removed", node, worker: me, tier: "ssd", verifiedAt: Date.now() },
      ]);
      await this.opts.tiers.file.delete(id);
      this.ssdUsed -= e.bytes;
      e.bytes = 0;
      this.counters.deleted++;
      this.opts.logger.log("info", "prefetch.deleted", { node });
    } catch (err) {
      this.opts.logger.log("warn", "prefetch.delete_failed", { node, message: (err as Error).message });
    }
  }
}
