import { longestPublishedPrefix, readyReplicasOfChunk } from "../../catalog/queries.ts";
import type { Engine } from "../../native/engine.ts";
import type { CatalogOp, Tier } from "../../schema/catalog.ts";
import { type ChainNode, catalogNodeId, prefixChain } from "../../schema/identity.ts";
import type { ContentId, NodeId, PageId } from "../../schema/ids.ts";
import { TokenCount } from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import type { RestoreTier } from "../calibration/calibration.ts";
import type { CatalogLink } from "../checkpoint/catalog-link.ts";
import {
  CHUNK_FORMAT,
  type ChunkDescriptor,
  type KvGeometry,
  metaMismatch,
  unpackChunk,
} from "../checkpoint/chunk-format.ts";
import { type GroupChunks, groupChain, groupChunksOf } from "../checkpoint/group-chunks.ts";
import type { LayerGroups } from "../model/layout.ts";
import type { PrefixRestorer, RestoreRequest, RestoreTicket } from "../pages/durable-hooks.ts";
import { groupHashes } from "../pages/layer-groups.ts";
import type { LoadTicket, PageManager } from "../pages/page-manager.ts";
import { fetchPeerChunk } from "../peer/client.ts";
import { residencyCosts } from "../residency/residency.ts";
import type { VerifiedChunk } from "../store/chunk.ts";
import type { ChunkTiers } from "../store/chunk-tiers.ts";
import { CorruptChunkError } from "../store/errors.ts";
import {
  type ChunkOffer,
  type GroupInput,
  type GroupLoad,
  type PlannedChunk,
  planRestore,
  type RestorePlan,
  type SourceOption,
} from "./plan.ts";

export interface RestorerOptions {
  readonly engine: Pick<Engine, "uploadPages">;
  readonly geometry: KvGeometry;
  /** The layer groups the runtime holds pages in (layerGroups): each group's chunks fill its own route. */
  readonly groups: LayerGroups;
  readonly tiers: ChunkTiers;
  readonly catalog: CatalogLink;
  readonly pageTokens: number;
  readonly chunkTokens: number;
  /** Bearer secret for peer reads (auth.clusterSecret); empty: peers are not a source. */
  readonly peerSecret: string;
  /** Deadline of one fetch from one source; past it the next source is tried. */
  readonly fetchTimeoutMs: number;
  /** Local copies of remotely fetched chunks written at once beside restores; more are skipped. */
  readonly maxKeepInFlight?: number;
  readonly logger: Logger;
}

export interface RestoreStats {
  readonly restores: number;
  readonly completed: number;
  readonly abandoned: number;
  /** Chunks read into pages by each tier, every layer group's. */
  readonly chunks: Readonly<Record<RestoreTier, number>>;
  /** Their bytes, every layer group's. */
  readonly bytes: Readonly<Record<RestoreTier, number>>;
  /**
   * Prompt rows served into pages by each tier, counted once per row (not
   * per group) when their whole restore completed (cache hits by tier): a
   * row's tier is that of the lowest group's chunk read for it; a row no
   * group read (dead for every window) counts with the restore's first chunk.
   */
  readonly tokens: Readonly<Record<RestoreTier, number>>;
  /** Fetches that failed over to the next source, by reason. */
  readonly fallbacks: { readonly missing: number; readonly corrupt: number; readonly unavailable: number };
  readonly badReplicasProposed: number;
}

/** What plan() needs of each group's route: its window and the pages its reservation holds. */
export interface RouteView {
  readonly window: number | null;
  readonly availablePages: number;
}

type FetchOutcome =
  | { readonly ok: true; readonly chunk: VerifiedChunk }
  | { readonly ok: false; readonly reason: "missing" | "corrupt" | "unavailable"; readonly detail: string };

class DeadlineError extends Error {}

const restoreTierOf = (t: Tier): RestoreTier => t;

/** A planned chunk read, verified and uploaded. */
interface Read {
  readonly chunk: PlannedChunk;
  readonly tier: Tier;
  readonly verified: VerifiedChunk;
  readonly node: NodeId;
}

/**
 * Restores a continuation's prefix from wherever it is cheapest, bit-exact,
 * into every layer group's route or none.
 *
 * begin (sync, at admission): chain the processed tokens into chunk nodes,
 * find each group's longest published prefix of its own chain (group-chunks.ts:
 * group 0 the plain chain, group g > 0 tagged with g) in this worker's catalog
 * replica, list each chunk's ready sources (this worker's RAM/SSD, peers'
 * RAM/SSD, S3) with a predicted cost from the calibrated per-byte costs, plan
 * (plan.ts: a group whose route slides reads only the chunks its window
 * reaches), and reserve the pages by beginning the load on every group's route.
 *
 * Then, beside the loop, group by group and chunk by chunk in order: fetch it
 * from its cheapest source (a deadline per source; missing or corrupt → its
 * replica is proposed bad and the next source is tried; unreachable or slow →
 * the next source), check the verified metadata is the planned chunk (its
 * group's node and layers), unpack its rows into a page-major staging span
 * (one chunk plus a carried partial page) and upload the pages it completed.
 * Only when every group's every page is uploaded are the loads completed, so
 * the page manager adds them to the routes (runnable) all at once. A chunk no
 * source can give abandons every group's load: the routes hold their
 * resident rows again and the runtime recomputes; the output is the same.
 *
 * Chunks read from a peer or S3 are then kept in the local tiers and proposed
 * as this worker's ready replicas (they were verified before any page saw them).
 */
export class Restorer implements PrefixRestorer {
  private readonly keeping = new Set<Promise<void>>();
  private counters = {
    restores: 0,
    completed: 0,
    abandoned: 0,
    chunks: { ram: 0, ssd: 0, peer: 0, s3: 0 } as Record<RestoreTier, number>,
    bytes: { ram: 0, ssd: 0, peer: 0, s3: 0 } as Record<RestoreTier, number>,
    tokens: { ram: 0, ssd: 0, peer: 0, s3: 0 } as Record<RestoreTier, number>,
    fallbacks: { missing: 0, corrupt: 0, unavailable: 0 },
    badReplicasProposed: 0,
  };
  private readonly running = new Set<Promise<boolean>>();
  /** Each group's chunks (layers, window), group 0 first. */
  readonly groups: readonly GroupChunks[];

  constructor(private readonly opts: RestorerOptions) {
    if (opts.groups.slots !== opts.geometry.slots)
      throw new RangeError(
        `restore geometry holds ${opts.geometry.slots} layers a page, the groups ${opts.groups.slots}`,
      );
    this.groups = groupChunksOf(opts.groups);
  }

  stats(): RestoreStats {
    return structuredClone(this.counters);
  }

  /**
   * The plan begin() would act on, without reserving anything (for tests and
   * the router's view); `routes`: each group's route, group 0 first.
   */
  plan(req: {
    readonly tokens: readonly number[];
    readonly salt: string | undefined;
    readonly residentTokens: number;
    readonly calibration: RestoreRequest["calibration"];
    readonly routes: readonly RouteView[];
  }): {
    plan: RestorePlan;
    /** Content ids by group, then chunk index. */
    contents: readonly (readonly ContentId[])[];
    /** Each group's chain (groupChain). */
    chains: readonly (readonly ChainNode[])[];
  } {
    const { catalog, chunkTokens: C, pageTokens: P } = this.opts;
    if (req.routes.length !== this.groups.length)
      throw new RangeError(`restore of ${req.routes.length} routes for ${this.groups.length} layer groups`);
    const db = catalog.db;
    const fp = catalog.id.fingerprint;
    const chain = prefixChain(req.tokens, C, req.salt);
    const perByte = req.calibration.restorePerByteMs;
    const chains = this.groups.map((gc) => groupChain(chain, gc.group));
    const contents: ContentId[][] = [];
    const groups = chains.map((gchain, g): GroupInput => {
      const published = longestPublishedPrefix(
        db,
        gchain.map((n) => catalogNodeId(fp, n.hash)),
      );
      const ids: ContentId[] = [];
      const chunks: ChunkOffer[] = [];
      for (let i = 0; i < published.length; i++) {
        const e = published.chunks[i]!;
        const bytes = db.get(e, "chunk/bytes") as number;
        ids.push(db.get(e, "chunk/content") as ContentId);
        const sources: SourceOption[] = [];
        let s3Listed = false;
        for (const r of readyReplicasOfChunk(db, e)) {
          if (r.tier === "s3") {
            if (this.opts.tiers.s3 === undefined || s3Listed) continue;
            s3Listed = true;
            sources.push({ tier: "s3", worker: r.worker, costMs: bytes * perByte.s3.value });
          } else if (r.worker === catalog.id.workerId) {
            if (r.tier === "ram" && this.opts.tiers.ram === undefined) continue;
            sources.push({ tier: r.tier, worker: r.worker, costMs: bytes * perByte[r.tier].value });
          } else if (r.tier === "ram" || r.tier === "ssd") {
            const address = catalog.addressOf(r.worker);
            if (address === undefined || this.opts.peerSecret === "") continue;
            sources.push({ tier: "peer", worker: r.worker, address, costMs: bytes * perByte.peer.value });
          }
        }
        chunks.push({ bytes, sources: dedupePeers(sources) });
      }
      contents.push(ids);
      return { window: req.routes[g]!.window, availablePages: req.routes[g]!.availablePages, chunks };
    });
    const plan = planRestore({
      processedTokens: req.tokens.length,
      residentTokens: req.residentTokens,
      pageTokens: P,
      prefillPerTokenMs: req.calibration.prefillPerTokenMs.value,
      chain: chain.map((n) => ({ start: n.start, tokens: n.count })),
      groups,
    });
    return { plan, contents, chains };
  }

  begin(req: RestoreRequest): RestoreTicket | null {
    let planned: ReturnType<Restorer["plan"]>;
    try {
      const routes = req.routes.map((r): RouteView => {
        const s = req.pages.route(r);
        return { window: s.window, availablePages: s.reservedPages };
      });
      planned = this.plan({ ...req, routes });
    } catch (err) {
      // A planning bug must not fail the loop: the request recomputes.
      this.opts.logger.log("error", "restore.plan_failed", {
        route: req.routes[0],
        message: (err as Error).message,
      });
      return null;
    }
    const { plan, contents, chains } = planned;
    if (plan.restoreTo <= req.residentTokens || plan.loads.length === 0) return null;
    const P = this.opts.pageTokens;
    const full = Math.floor(plan.restoreTo / P);
    if (req.pageHashes.length < full) {
      this.opts.logger.log("error", "restore.hashes_short", {
        route: req.routes[0],
        hashes: req.pageHashes.length,
        pages: full,
      });
      return null;
    }
    const sealed = req.pageHashes.slice(req.residentTokens / P, full);
    const costs = residencyCosts(req.calibration, P, this.opts.geometry.pageBytes(P));
    const tickets: (readonly LoadTicket[])[] = [];
    try {
      for (const load of plan.loads)
        tickets.push(
          req.pages.beginLoad(
            req.routes[load.group]!,
            TokenCount(plan.restoreTo - req.residentTokens),
            groupHashes(sealed, load.group),
            { skip: load.skipPages, cache: costs },
          ),
        );
    } catch (err) {
      // All or none: the groups whose loads began abandon them.
      this.failAll(req.pages, tickets.flat());
      this.opts.logger.log("debug", "restore.not_reserved", {
        route: req.routes[0],
        message: (err as Error).message,
      });
      return null;
    }
    this.counters.restores++;
    const done = this.stream(req, plan, tickets, chains, contents).then(
      (ok) => {
        if (ok) {
          this.counters.completed++;
          // Every full page up to restoreTo lies in published chunks: it can be restored again, cheaply
          // (a group that left pages unloaded holds its pages from its load's first on).
          for (const load of plan.loads)
            req.pages.markDurable(
              groupHashes(req.pageHashes.slice(0, full), load.group),
              costs,
              load.skipPages > 0 ? load.from / P : 0,
            );
        } else this.counters.abandoned++;
        return ok;
      },
      (err) => {
        this.opts.logger.log("error", "restore.bug", {
          route: req.routes[0],
          message: (err as Error).message,
        });
        this.failAll(req.pages, tickets.flat());
        this.counters.abandoned++;
        return false;
      },
    );
    this.running.add(done);
    done.finally(() => this.running.delete(done));
    return { restoreTo: plan.restoreTo, done };
  }

  /** Waits for restores in flight and the local copies they started. */
  async idle(): Promise<void> {
    await Promise.allSettled([...this.running]);
    await Promise.allSettled([...this.keeping]);
  }

  /** Every group's chunks into its load's pages; the loads complete together once all are uploaded. */
  private async stream(
    req: RestoreRequest,
    plan: RestorePlan,
    tickets: readonly (readonly LoadTicket[])[],
    chains: readonly (readonly ChainNode[])[],
    contents: readonly (readonly ContentId[])[],
  ): Promise<boolean> {
    const reads: Read[] = [];
    for (const [i, load] of plan.loads.entries()) {
      const ok = await this.streamGroup(
        req,
        plan.restoreTo,
        load,
        tickets[i]!,
        chains[load.group]!,
        contents[load.group]!,
        reads,
      );
      if (!ok) {
        this.failAll(req.pages, tickets.flat());
        return false;
      }
    }
    for (const t of tickets.flat()) req.pages.completeLoad(t);
    this.countRows(req.residentTokens, plan.restoreTo, reads);
    for (const r of reads) if (r.tier === "peer" || r.tier === "s3") this.keepLocal(r.verified, r.node);
    return true;
  }

  /** One group's chunks, fetched in order and their pages uploaded; false when a chunk or an upload failed. */
  private async streamGroup(
    req: RestoreRequest,
    end: number,
    load: GroupLoad,
    tickets: readonly LoadTicket[],
    chain: readonly ChainNode[],
    contents: readonly ContentId[],
    reads: Read[],
  ): Promise<boolean> {
    const { geometry: g, pageTokens: P, catalog } = this.opts;
    const gc = this.groups[load.group]!;
    const pageBytes = g.pageBytes(P);
    const base = load.from;
    /** Bytes of the first not-yet-uploaded page, when the previous chunk ended inside it. */
    let carry: Uint8Array | null = null;
    let nextPage = 0;
    for (const c of load.chunks) {
      const node = chain[c.index]!;
      const expected: ChunkDescriptor = {
        node: catalogNodeId(catalog.id.fingerprint, node.hash),
        prefix: node.hash,
        parent: node.parent,
        fingerprint: catalog.id.fingerprint,
        start: c.start,
        tokens: c.tokens,
        layout: catalog.id.layout,
        layers: gc.mask,
        bytes: c.bytes,
      };
      const t0 = performance.now();
      const got = await this.fetchAny(expected, contents[c.index]!, c.sources);
      if (got === null) return false;
      const from = Math.max(c.start, base);
      const to = c.start + c.tokens;
      const firstPage = Math.floor((from - base) / P);
      const lastPage = Math.ceil((to - base) / P) - 1;
      if (firstPage !== nextPage)
        throw new Error(`restore: chunk at ${c.start} begins in page ${firstPage}, expected ${nextPage}`);
      const staging = new Uint8Array((lastPage - firstPage + 1) * pageBytes);
      if (carry !== null) staging.set(carry, 0);
      unpackChunk(
        g,
        got.chunk.bytes,
        c.start,
        c.tokens,
        { bytes: staging, firstPageRow: base + firstPage * P, pageTokens: P },
        from,
        to - from,
        gc.held,
      );
      // A page is complete when its last row is written, or when it is the load's last page.
      const complete = to === end ? lastPage - firstPage + 1 : Math.floor((to - base) / P) - firstPage;
      if (complete > 0) {
        const batch = tickets.slice(firstPage, firstPage + complete);
        try {
          await this.opts.engine.uploadPages(
            batch.map((t) => t.page as PageId),
            staging.subarray(0, complete * pageBytes),
          );
        } catch (err) {
          this.opts.logger.log("warn", "restore.upload_failed", {
            route: req.routes[load.group],
            message: (err as Error).message,
          });
          return false;
        }
      }
      carry = complete <= lastPage - firstPage ? staging.slice(complete * pageBytes) : null;
      nextPage = firstPage + complete;
      const rt = restoreTierOf(got.tier);
      this.counters.chunks[rt]++;
      this.counters.bytes[rt] += c.bytes;
      req.record({ kind: "restore", tier: rt, bytes: c.bytes, deviceMs: performance.now() - t0, queueMs: 0 });
      reads.push({ chunk: c, tier: got.tier, verified: got.chunk, node: expected.node });
    }
    if (nextPage !== tickets.length)
      throw new Error(
        `restore: ${tickets.length - nextPage} pages of group ${load.group} were never uploaded`,
      );
    return true;
  }

  /** The restored rows [resident, restoreTo) by tier, once each (RestoreStats.tokens). */
  private countRows(resident: number, restoreTo: number, reads: readonly Read[]): void {
    if (reads.length === 0) return;
    const tierOf = new Map<number, Tier>();
    for (const r of reads) if (!tierOf.has(r.chunk.index)) tierOf.set(r.chunk.index, r.tier);
    const fallback = reads[0]!.tier;
    const C = this.opts.chunkTokens;
    for (let i = Math.floor(resident / C); i * C < restoreTo; i++) {
      const rows = Math.min((i + 1) * C, restoreTo) - Math.max(i * C, resident);
      if (rows > 0) this.counters.tokens[restoreTierOf(tierOf.get(i) ?? fallback)] += rows;
    }
  }

  /** Tries each source in order; null when none gave the planned chunk. */
  private async fetchAny(
    expected: ChunkDescriptor,
    id: ContentId,
    sources: readonly SourceOption[],
  ): Promise<{ chunk: VerifiedChunk; tier: Tier } | null> {
    for (const s of sources) {
      const out = await this.fetchOne(s, id);
      if (out.ok) {
        const wrong = metaMismatch(out.chunk.meta, expected);
        if (wrong === null) return { chunk: out.chunk, tier: s.tier };
        await this.noteBad(expected.node, s, "corrupt", wrong);
        continue;
      }
      if (out.reason === "unavailable") {
        this.counters.fallbacks.unavailable++;
        this.opts.logger.log("info", "restore.source_unavailable", {
          tier: s.tier,
          worker: s.worker,
          detail: out.detail,
        });
        continue;
      }
      await this.noteBad(expected.node, s, out.reason, out.detail);
    }
    return null;
  }

  private async fetchOne(s: SourceOption, id: ContentId): Promise<FetchOutcome> {
    const { tiers, fetchTimeoutMs } = this.opts;
    const ac = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        ac.abort();
        reject(new DeadlineError(`no answer within ${fetchTimeoutMs} ms`));
      }, fetchTimeoutMs);
    });
    const read = (): Promise<VerifiedChunk | undefined> => {
      switch (s.tier) {
        case "ram":
          return tiers.ram!.get(id);
        case "ssd":
          return tiers.file.get(id);
        case "s3":
          return tiers.s3!.get(id);
        case "peer":
          return fetchPeerChunk(s.address!, id, { secret: this.opts.peerSecret, signal: ac.signal });
      }
    };
    const attempt = read();
    try {
      const chunk = await Promise.race([attempt, deadline]);
      if (chunk === undefined)
        return { ok: false, reason: "missing", detail: `${s.tier} of ${s.worker} does not hold ${id}` };
      return { ok: true, chunk };
    } catch (err) {
      attempt.catch(() => undefined);
      if (err instanceof CorruptChunkError) return { ok: false, reason: "corrupt", detail: err.message };
      return { ok: false, reason: "unavailable", detail: (err as Error).message };
    } finally {
      clearTimeout(timer);
    }
  }

  /** A replica that is missing or fails verification is proposed bad so no one plans on it again. */
  private async noteBad(
    node: NodeId,
    s: SourceOption,
    reason: "missing" | "corrupt",
    detail: string,
  ): Promise<void> {
    this.counters.fallbacks[reason]++;
    this.opts.logger.log("warn", "restore.bad_replica", {
      node,
      tier: s.tier,
      worker: s.worker,
      reason,
      detail,
    });
    // The catalog names the tier the copy lives in: a peer's copy is its RAM or SSD replica.
    const tiers: Tier[] = s.tier === "peer" ? ["ram", "ssd"] : [s.tier];
    const ops: CatalogOp[] = [];
    for (const tier of tiers) {
      const holds = this.readyOn(node, s.worker, tier);
      if (holds) ops.push({ op: "replica.bad", node, worker: s.worker, tier, verifiedAt: Date.now() });
    }
    if (ops.length === 0) return;
    try {
      await this.opts.catalog.propose(ops);
      this.counters.badReplicasProposed += ops.length;
    } catch (err) {
      this.opts.logger.log("warn", "restore.bad_not_proposed", { node, message: (err as Error).message });
    }
  }

  private readyOn(node: NodeId, worker: string, tier: Tier): boolean {
    const db = this.opts.catalog.db;
    const c = db.eidOf("chunk/node", node);
    if (c === undefined) return false;
    return readyReplicasOfChunk(db, c).some((r) => r.worker === worker && r.tier === tier);
  }

  /** Keeps a remotely fetched, verified chunk locally and proposes this worker's replicas of it. */
  private keepLocal(chunk: VerifiedChunk, node: NodeId): void {
    if (this.keeping.size >= (this.opts.maxKeepInFlight ?? 8)) return;
    if (chunk.meta.format !== CHUNK_FORMAT) return;
    const p = (async () => {
      const held = await this.opts.tiers.keepLocal(chunk.withBytes(chunk.bytes.slice()));
      const me = this.opts.catalog.id.workerId;
      const verifiedAt = Date.now();
      await this.opts.catalog.propose(
        held.map((tier) => ({ op: "replica.ready" as const, node, worker: me, tier, verifiedAt })),
      );
    })()
      .catch((err) =>
        this.opts.logger.log("warn", "restore.keep_failed", { node, message: (err as Error).message }),
      )
      .finally(() => this.keeping.delete(p));
    this.keeping.add(p);
  }

  private failAll(pages: PageManager, tickets: readonly LoadTicket[]): void {
    for (const t of tickets) pages.failLoad(t);
  }
}

/** One source per peer worker: its RAM and SSD are one HTTP read (the cheaper tier's cost stands). */
function dedupePeers(sources: SourceOption[]): SourceOption[] {
  const out: SourceOption[] = [];
  const peers = new Set<string>();
  for (const s of sources) {
    if (s.tier === "peer") {
      if (peers.has(s.worker)) continue;
      peers.add(s.worker);
    }
    out.push(s);
  }
  return out;
}
