import type {
  CandidateSource,
  DroppedCandidate,
  Heartbeat,
  RestoreTier,
  StoreTier,
} from "../schema/control.ts";
import { catalogNodeId, prefixChain } from "../schema/identity.ts";
import type { ModelFingerprint, NodeId, RequestId, TokenCount, WorkerId } from "../schema/ids.ts";
import type { LiveWorker } from "./heartbeat-view.ts";

/**
 * Candidate derivation: for one request, every way each live worker could
 * produce its first token — from its resident GPU prefix, from each durable
 * prefix boundary by fastest tier class, or by recomputing. The alternatives
 * stay separate, so a resident entry that turns out stale (or is too old to
 * trust) falls back to the same worker's durable prefix instead of to
 * recompute. Pure: values in, values out.
 */

/** One prefix boundary of the request's chain: a whole chunk's node id and the tokens through it. */
export interface ChainBoundary {
  readonly nodeId: NodeId;
  /** Tokens from the sequence start through the end of this chunk. */
  readonly tokens: TokenCount;
}

export interface RouteRequest {
  readonly requestId: RequestId;
  readonly modelFingerprint: ModelFingerprint;
  /** Whole chunks of the processed prompt (all tokens but the pending last one), in order. */
  readonly chain: readonly ChainBoundary[];
  readonly promptTokens: TokenCount;
  readonly maxTokens: TokenCount;
}

/**
 * The request's chain boundaries: the prompt minus its pending last token,
 * cut into whole chunks, each named by its catalog node id. This is layer
 * group 0's chain (a model of several groups writes one chain per group,
 * worker/checkpoint/group-chunks.ts, group 0's the plain one), so for such a
 * model the estimate follows group 0's replicas and prices every layer's
 * bytes (kvBytesPerToken) over their tokens; the worker's restorer restores
 * less or recomputes when another group's needed chunk is missing.
 */
export function planChain(
  fingerprint: ModelFingerprint,
  prompt: ArrayLike<number>,
  chunkTokens: number,
  cacheSalt?: string,
): ChainBoundary[] {
  const processed = Array.prototype.slice.call(prompt, 0, Math.max(0, prompt.length - 1)) as number[];
  return prefixChain(processed, chunkTokens, cacheSalt).map((n) => ({
    nodeId: catalogNodeId(fingerprint, n.hash),
    tokens: (n.start + n.count) as TokenCount,
  }));
}

/** A ready replica of one chunk. S3 replicas belong to no worker. */
export interface ChunkReplica {
  readonly tier: StoreTier;
  readonly workerId: WorkerId | null;
}

/**
 * The catalog's answer for a request's chain (from catalog/queries.ts, passed
 * in as plain values): `replicas[i]` lists the ready replicas of chain node i
 * for each node of the longest published prefix; its length is that prefix's
 * length in nodes.
 */
export interface CatalogAnswer {
  readonly replicas: readonly (readonly ChunkReplica[])[];
}

export const noCatalogAnswer: CatalogAnswer = { replicas: [] };

export interface Candidate {
  readonly workerId: WorkerId;
  readonly source: CandidateSource;
  /** Prompt tokens already computed somewhere (0 for recompute). */
  readonly cachedTokens: TokenCount;
  /** The boundary the cached tokens end at; null for recompute. */
  readonly boundary: NodeId | null;
  /** Attention-state bytes to fetch into host memory, by source tier (all 0 for resident and recompute). */
  readonly bytesByTier: Readonly<Record<RestoreTier, number>>;
}

export interface Candidates {
  readonly candidates: Candidate[];
  /** Alternatives derived but not trusted (a resident prefix older than `residentFreshMs`). */
  readonly dropped: DroppedCandidate[];
}

const NO_BYTES: Readonly<Record<RestoreTier, number>> = Object.freeze({ ram: 0, ssd: 0, peer: 0, s3: 0 });

/** Tier classes, fastest first; class k may use any tier up to and including its own. */
const TIER_CLASSES: readonly RestoreTier[] = ["ram", "ssd", "peer", "s3"];
const TIER_RANK: Readonly<Record<RestoreTier, number>> = { ram: 0, ssd: 1, peer: 2, s3: 3 };

/** Resident node ids per heartbeat, memoized on the (immutable) heartbeat value. */
const residentSets = new WeakMap<Heartbeat, ReadonlySet<NodeId>>();

function residentSet(hb: Heartbeat): ReadonlySet<NodeId> {
  let s = residentSets.get(hb);
  if (!s) {
    s = new Set(hb.residentPrefixes.map((p) => p.nodeId));
    residentSets.set(hb, s);
  }
  return s;
}

/**
 * Index of the longest chain boundary resident on the worker, or -1.
 *
 * A heartbeat lists every resident chunk boundary, and resident pages of a
 * prefix hold all of its ancestors, so residency is monotone along a chain:
 * resident(i) ⇒ resident(j) for j < i. Binary search then needs ⌈log2 n⌉
 * lookups. Invariant: chain[lo] is resident (or lo = -1), chain[hi] is not
 * (or hi = n). If a worker's list were not prefix-closed, the answer is still
 * a resident boundary (a node id commits to its whole prefix), only perhaps
 * not the longest.
 */
export function longestResident(hb: Heartbeat, chain: readonly ChainBoundary[]): number {
  const set = residentSet(hb);
  if (set.size === 0) return -1;
  let lo = -1;
  let hi = chain.length;
  while (hi - lo > 1) {
    const mid = (lo + hi) >>> 1;
    if (set.has(chain[mid]!.nodeId)) lo = mid;
    else hi = mid;
  }
  return lo;
}

/** Per chain node: the best local tier per worker, the ram/ssd holders (for peers), and S3. */
interface ChunkSources {
  readonly local: Map<WorkerId, StoreTier>;
  readonly holders: number;
  readonly firstHolder: WorkerId | null;
  readonly s3: boolean;
}

function indexReplicas(
  answer: CatalogAnswer,
  nodes: number,
  liveHolders: ReadonlySet<WorkerId> | undefined,
): ChunkSources[] {
  const out: ChunkSources[] = [];
  const n = Math.min(nodes, answer.replicas.length);
  for (let i = 0; i < n; i++) {
    const local = new Map<WorkerId, StoreTier>();
    let s3 = false;
    for (const r of answer.replicas[i]!) {
      if (r.tier === "s3") {
        s3 = true;
        continue;
      }
      if (r.workerId === null || (liveHolders !== undefined && !liveHolders.has(r.workerId))) continue;
      const prev = local.get(r.workerId);
      if (prev === undefined || (prev === "ssd" && r.tier === "ram")) local.set(r.workerId, r.tier);
    }
    const first = local.size > 0 ? (local.keys().next().value as WorkerId) : null;
    out.push({ local, holders: local.size, firstHolder: first, s3 });
  }
  return out;
}

const NO_SOURCE = TIER_CLASSES.length;

/**
 * Rank of the fastest tier `worker` can read chunk `c` from: own RAM/SSD,
 * else a peer, else S3, else NO_SOURCE. `worker` null: one holding nothing.
 */
function bestRank(c: ChunkSources, worker: WorkerId | null, hasS3: boolean, peers: boolean): number {
  const own = worker === null ? undefined : c.local.get(worker);
  if (own !== undefined) return TIER_RANK[own];
  if (peers && (c.holders > 1 || (c.holders === 1 && c.firstHolder !== worker))) return TIER_RANK.peer;
  if (c.s3 && hasS3) return TIER_RANK.s3;
  return NO_SOURCE;
}

/** A durable tier class's prefix: its length in chain nodes and the bytes to fetch by tier. */
interface DurableClass {
  readonly source: RestoreTier;
  readonly len: number;
  readonly bytes: Readonly<Record<RestoreTier, number>>;
}

/**
 * One pass over the chain: each chunk's fastest source for `worker` (own
 * RAM/SSD, else a peer's, else S3). Class k's prefix is the leading run of
 * chunks whose fastest rank ≤ k, and its bytes are those chunks' bytes at
 * that rank: bytes[t] = Σ chunk tokens × kvBytesPerToken. Only classes
 * strictly longer than the faster class are kept.
 */
function durableClasses(
  sources: readonly ChunkSources[],
  chain: readonly ChainBoundary[],
  kvBytesPerToken: number,
  hasS3: boolean,
  worker: WorkerId | null,
  peers: boolean,
): DurableClass[] {
  const out: DurableClass[] = [];
  const bytes = { ram: 0, ssd: 0, peer: 0, s3: 0 };
  let prevLen = 0;
  let cls = 0;
  for (let len = 0; ; len++) {
    const rank = len < sources.length ? bestRank(sources[len]!, worker, hasS3, peers) : NO_SOURCE;
    // Every class faster than this chunk's source ends before it.
    for (; cls < rank && cls < TIER_CLASSES.length; cls++) {
      if (len > prevLen) {
        out.push({ source: TIER_CLASSES[cls]!, len, bytes: Object.freeze({ ...bytes }) });
        prevLen = len;
      }
    }
    if (rank === NO_SOURCE) return out;
    const chunkTokens = chain[len]!.tokens - (len === 0 ? 0 : chain[len - 1]!.tokens);
    bytes[TIER_CLASSES[rank]!] += chunkTokens * kvBytesPerToken;
  }
}

export interface DeriveOptions {
  /** Resident prefixes reported longer ago than this are not trusted (their durable alternatives stay). */
  readonly residentFreshMs: number;
  /**
   * Workers that can serve their RAM/SSD chunks right now. A replica on any
   * other worker (offline, expired) is no source at all: counting it as a
   * peer would route to a fetch that can only fail over to S3. Absent: every
   * worker in the catalog answer counts.
   */
  readonly liveHolders?: ReadonlySet<WorkerId>;
  /** Whether workers read each other's RAM/SSD chunks (worker.peerTransfer); default true. */
  readonly peers?: boolean;
}

/**
 * Derives candidates for `request` on every worker in `workers` (live
 * observations; constraints such as model or pages are the router's job):
 * - `resident`: the longest chain boundary in the worker's heartbeat;
 * - one durable candidate per tier class (ram, ssd, peer, s3) whose prefix is
 *   strictly longer than the faster class's — each chunk from the fastest
 *   tier the class allows; a chunk on another worker's RAM/SSD is `peer`, S3
 *   is reachable by every worker that reports the tier;
 * - `recompute`.
 */
export function deriveCandidates(
  request: RouteRequest,
  workers: readonly LiveWorker[],
  catalog: CatalogAnswer,
  options: DeriveOptions,
): Candidates {
  const chain = request.chain;
  const sources = indexReplicas(catalog, chain.length, options.liveHolders);
  const holders = new Set<WorkerId>();
  for (const c of sources) for (const w of c.local.keys()) holders.add(w);
  const generic = new Map<string, readonly DurableClass[]>();
  const candidates: Candidate[] = [];
  const dropped: DroppedCandidate[] = [];

  for (const { heartbeat: hb, ageMs } of workers) {
    const w = hb.workerId;
    const r = longestResident(hb, chain);
    if (r >= 0) {
      if (ageMs > options.residentFreshMs) {
        dropped.push({
          workerId: w,
          source: "resident",
          reason: "stale_resident",
          detail: `resident prefix reported ${ageMs} ms ago (trusted for ${options.residentFreshMs} ms)`,
        });
      } else {
        candidates.push({
          workerId: w,
          source: "resident",
          cachedTokens: chain[r]!.tokens,
          boundary: chain[r]!.nodeId,
          bytesByTier: NO_BYTES,
        });
      }
    }

    // A worker holding no chunk of this chain sees the same sources as every
    // other such worker (peers and S3): derive that once and share it.
    const hasS3 = hb.durableTiers.includes("s3");
    let classes: readonly DurableClass[];
    const peers = options.peers ?? true;
    if (holders.has(w)) {
      classes = durableClasses(sources, chain, hb.kvBytesPerToken, hasS3, w, peers);
    } else {
      const key = `${hasS3}|${hb.kvBytesPerToken}`;
      let shared = generic.get(key);
      if (!shared) {
        shared = durableClasses(sources, chain, hb.kvBytesPerToken, hasS3, null, peers);
        generic.set(key, shared);
      }
      classes = shared;
    }
    for (const c of classes) {
      candidates.push({
        workerId: w,
        source: c.source,
        cachedTokens: chain[c.len - 1]!.tokens,
        boundary: chain[c.len - 1]!.nodeId,
        bytesByTier: c.bytes,
      });
    }

    candidates.push({
      workerId: w,
      source: "recompute",
      cachedTokens: 0 as TokenCount,
      boundary: null,
      bytesByTier: NO_BYTES,
    });
  }
  return { candidates, dropped };
}
