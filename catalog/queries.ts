import type { Tier } from "../schema/catalog.ts";
import { catalogNodeId } from "../schema/identity.ts";
import type { ModelFingerprint, NodeId, PrefixHash } from "../schema/ids.ts";
import type { CatalogDb } from "./db.ts";
import type { TxReport } from "./replica.ts";

/**
 * Prepared catalog queries for the hot path. Each reads the db's indexes
 * (unique node id → chunk entity, chunk → replicas) or an aggregate kept
 * current from tx reports; none runs a Datalog `q`. test/catalog checks each
 * against the equivalent Datalog query on random catalogs.
 */

/** Catalog node ids of a planned chain (one sha256 per node). */
export function chainNodeIds(
  fingerprint: ModelFingerprint,
  chain: readonly { readonly hash: PrefixHash }[],
): NodeId[] {
  const out: NodeId[] = new Array(chain.length);
  for (let i = 0; i < chain.length; i++) out[i] = catalogNodeId(fingerprint, chain[i]!.hash);
  return out;
}

export interface PublishedPrefix {
  /** Chain nodes published from the start: nodes[0..length) are, nodes[length] is not. */
  readonly length: number;
  /** Chunk entity ids of those nodes. */
  readonly chunks: readonly number[];
}

/** Longest published exact prefix of a chain given as node ids (root first). */
export function longestPublishedPrefix(db: CatalogDb, nodes: readonly NodeId[]): PublishedPrefix {
  const chunks: number[] = [];
  for (const node of nodes) {
    const c = db.eidOf("chunk/node", node);
    if (c === undefined) break;
    chunks.push(c);
  }
  return { length: chunks.length, chunks };
}

/**
 * Longest published exact prefix of a planned chain (root first) for a model,
 * by prefix hash: the model's prefix index answers without computing node ids.
 * Equal to `longestPublishedPrefix(db, chainNodeIds(fingerprint, chain))`.
 */
export function longestPublishedPrefixOfChain(
  db: CatalogDb,
  fingerprint: ModelFingerprint,
  chain: readonly { readonly hash: PrefixHash }[],
): PublishedPrefix {
  const chunks: number[] = [];
  const model = db.eidOf("model/fingerprint", fingerprint);
  if (model === undefined) return { length: 0, chunks };
  for (const node of chain) {
    const c = db.chunkOf(model, node.hash);
    if (c === undefined) break;
    chunks.push(c);
  }
  return { length: chunks.length, chunks };
}

export interface ReadyReplica {
  readonly worker: string;
  readonly tier: Tier;
  readonly verifiedAt: number;
}

/** Ready replicas of one chunk entity, sorted by worker then tier. */
export function readyReplicasOfChunk(db: CatalogDb, chunk: number): ReadyReplica[] {
  const out: ReadyReplica[] = [];
  for (const r of db.replicasOf(chunk)) {
    if (db.get(r, "replica/state") !== "ready") continue;
    out.push({
      worker: db.get(db.get(r, "replica/worker") as number, "worker/id") as string,
      tier: db.get(r, "replica/tier") as Tier,
      verifiedAt: db.get(r, "replica/verified-at") as number,
    });
  }
  return out.sort((a, b) =>
    a.worker < b.worker ? -1 : a.worker > b.worker ? 1 : a.tier < b.tier ? -1 : a.tier > b.tier ? 1 : 0,
  );
}

/** Ready replicas of a set of nodes: node → its ready copies (unpublished nodes map to []). */
export function readyReplicas(db: CatalogDb, nodes: readonly NodeId[]): Map<NodeId, ReadyReplica[]> {
  const out = new Map<NodeId, ReadyReplica[]>();
  for (const node of nodes) {
    const c = db.eidOf("chunk/node", node);
    out.set(node, c === undefined ? [] : readyReplicasOfChunk(db, c));
  }
  return out;
}

/**
 * What each worker can restore of a chain, by tier: worker → tier → how many
 * leading chunks (from the root) it holds ready in that tier. The router
 * turns each into a restore candidate.
 */
export function readyPrefixByWorkerTier(
  db: CatalogDb,
  prefix: PublishedPrefix,
): Map<string, Map<Tier, number>> {
  const out = new Map<string, Map<Tier, number>>();
  for (let i = 0; i < prefix.chunks.length; i++) {
    let any = false;
    for (const r of db.replicasOf(prefix.chunks[i]!)) {
      if (db.get(r, "replica/state") !== "ready") continue;
      const worker = db.get(db.get(r, "replica/worker") as number, "worker/id") as string;
      const tier = db.get(r, "replica/tier") as Tier;
      let byTier = out.get(worker);
      if (byTier === undefined) {
        if (i > 0) continue; // a run must start at the root
        byTier = new Map();
        out.set(worker, byTier);
      }
      // Extend a run only if it is unbroken: it covered exactly chunks [0, i).
      if ((byTier.get(tier) ?? 0) === i) {
        byTier.set(tier, i + 1);
        any = true;
      }
    }
    if (!any) break;
  }
  return out;
}

// ------------------------------------------------------------ demand and reuse

export interface SeriesFilter {
  /** Window [from, to) in ms since the epoch. */
  readonly from: number;
  readonly to: number;
  readonly tenant?: string;
  /** Model fingerprint. */
  readonly model?: string;
}

export interface DemandRow {
  /** Bucket start, ms since the epoch. */
  readonly bucket: number;
  readonly tenant: string;
  readonly model: string;
  /** Sum of demand counts observed in the bucket. */
  readonly count: number;
}

export interface ReuseRow {
  readonly bucket: number;
  readonly tenant: string;
  readonly model: string;
  /** Routing decisions recorded (first attempt and retries). */
  readonly decisions: number;
  /** Decisions whose choice reused cached state (source ≠ recompute). */
  readonly reused: number;
  /** Sum of tokens reused. */
  readonly cachedTokens: number;
}

interface Agg {
  count: number;
  decisions: number;
  reused: number;
  cachedTokens: number;
}

/**
 * Demand and reuse aggregated by time bucket, tenant and model, kept current
 * from a replica's tx reports. Demand and decision entities are written once,
 * so each is added exactly when its creating tx is reported.
 *
 * Memory: one aggregate per (bucket, tenant, model) seen; with the default
 * one-minute buckets a day of 100 tenants × 4 models is 576,000 entries.
 */
export class DemandIndex {
  /** bucket → "tenant\0model" → aggregate. */
  private readonly buckets = new Map<number, Map<string, Agg>>();

  constructor(
    private readonly db: CatalogDb,
    readonly bucketMs = 60_000,
  ) {
    if (!Number.isSafeInteger(bucketMs) || bucketMs <= 0)
      throw new RangeError(`bucketMs must be a positive integer, got ${bucketMs}`);
    for (const e of db.holders("demand/count")) this.add(e);
    for (const e of db.holders("decision/key")) this.add(e);
  }

  /** Feed with a replica's reports: `replica.listen((r) => index.onReports(r))`. */
  onReports(reports: readonly TxReport[]): void {
    for (const { tx } of reports) {
      for (const [e, a, , added] of tx.datoms) {
        if (added && (a === "demand/count" || a === "decision/key")) this.add(e);
      }
    }
  }

  private add(e: number): void {
    const db = this.db;
    const isDemand = db.get(e, "demand/count") !== undefined;
    const time = db.get(e, isDemand ? "demand/time" : "decision/time") as number;
    const tenant = db.get(e, isDemand ? "demand/tenant" : "decision/tenant") as string;
    const modelEid = db.get(e, isDemand ? "demand/model" : "decision/model") as number;
    const model = db.get(modelEid, "model/fingerprint") as string;
    const bucket = Math.floor(time / this.bucketMs) * this.bucketMs;
    let b = this.buckets.get(bucket);
    if (b === undefined) {
      b = new Map();
      this.buckets.set(bucket, b);
    }
    const key = `${tenant}\u0000${model}`;
    let agg = b.get(key);
    if (agg === undefined) {
      agg = { count: 0, decisions: 0, reused: 0, cachedTokens: 0 };
      b.set(key, agg);
    }
    if (isDemand) {
      agg.count += db.get(e, "demand/count") as number;
    } else {
      agg.decisions += 1;
      if (db.get(e, "decision/source") !== "recompute") agg.reused += 1;
      agg.cachedTokens += db.get(e, "decision/cached-tokens") as number;
    }
  }

  /** Aggregates of buckets starting in [from, to), sorted by bucket, tenant, model. */
  private rows(f: SeriesFilter): { bucket: number; tenant: string; model: string; agg: Agg }[] {
    const out: { bucket: number; tenant: string; model: string; agg: Agg }[] = [];
    for (const [bucket, b] of this.buckets) {
      if (bucket < f.from || bucket >= f.to) continue;
      for (const [key, agg] of b) {
        const sep = key.indexOf("\u0000");
        const tenant = key.slice(0, sep);
        const model = key.slice(sep + 1);
        if (f.tenant !== undefined && tenant !== f.tenant) continue;
        if (f.model !== undefined && model !== f.model) continue;
        out.push({ bucket, tenant, model, agg });
      }
    }
    return out.sort((x, y) =>
      x.bucket !== y.bucket
        ? x.bucket - y.bucket
        : x.tenant !== y.tenant
          ? x.tenant < y.tenant
            ? -1
            : 1
          : x.model < y.model
            ? -1
            : x.model > y.model
              ? 1
              : 0,
    );
  }

  /** Demand per bucket, tenant and model (buckets with no demand are left out). */
  demand(f: SeriesFilter): DemandRow[] {
    return this.rows(f)
      .filter((r) => r.agg.count > 0)
      .map((r) => ({ bucket: r.bucket, tenant: r.tenant, model: r.model, count: r.agg.count }));
  }

  /** Reuse per bucket, tenant and model (buckets with no decisions are left out). */
  reuse(f: SeriesFilter): ReuseRow[] {
    return this.rows(f)
      .filter((r) => r.agg.decisions > 0)
      .map((r) => ({
        bucket: r.bucket,
        tenant: r.tenant,
        model: r.model,
        decisions: r.agg.decisions,
        reused: r.agg.reused,
        cachedTokens: r.agg.cachedTokens,
      }));
  }
}
