import type { NodeId, WorkerId } from "../../schema/ids.ts";

/**
 * Desired placement (pure): which published prefixes should be held in
 * which workers' RAM or SSD, so that the next request for a hot prefix finds
 * it one local read away on more than one worker, instead of an S3 fetch (or
 * a recompute) on its token path.
 *
 * Inputs are plain values: the published chunks with their parent links,
 * sizes and demand (decayed requests whose chain reached the chunk: a
 * parent's demand includes its children's, so demand never grows along a
 * chain), the workers that may hold copies with their byte budgets per tier,
 * and the placements now desired. Output: the desired set and the
 * `placement.set` changes that turn the current set into it. Same input,
 * same output: a plan can be replayed from the catalog.
 *
 * The policy, in steps:
 *  1. Chunks with demand ≥ minDemand, ranked by demand (descending), then
 *     depth (a parent before its child), then node id.
 *  2. Replicas wanted: k = min(maxReplicas, workers, 1 + ⌊share × workers ×
 *     spread⌋), share = demand / Σ demand of the roots. A child never gets
 *     more replicas than its parent (its demand is at most the parent's).
 *  3. A chunk goes only to workers that hold its parent in the new plan (a
 *     placed run always starts at the root: a restore reads a prefix, so a
 *     chunk without its parent saves nothing). Among those, workers that hold
 *     it now come first (no churn), then workers with no local copy of it
 *     (the worker that computed a chunk already holds it in RAM/SSD, so a
 *     placement there adds no second home), then the most budget left, then
 *     worker id.
 *  4. Tier: RAM while the worker's RAM budget has room, else SSD while its
 *     SSD budget has room, else the worker is skipped for it.
 *  5. Changes: every current desired placement not in the plan is withdrawn
 *     (desired false), every planned one not desired now is set; withdrawals
 *     first (they free the budget the additions use on the worker), at most
 *     maxChanges in all, in rank order.
 *
 * Withdrawal only lets a worker evict its copy; it never deletes the last
 * durable one (the worker's prefetch keeps copies the catalog shows nowhere
 * else: worker/prefetch/).
 */

export type PlacedTier = "ram" | "ssd";

export interface PlacementChunk {
  readonly node: NodeId;
  /** The parent chunk's node (null at the root of a chain). */
  readonly parent: NodeId | null;
  /** Stored bytes of the chunk. */
  readonly bytes: number;
  /** Decayed demand: requests whose chain reached this chunk (≥ its children's). */
  readonly demand: number;
  /** Workers holding a ready RAM or SSD replica of it now (placed or not). */
  readonly localHolders: readonly WorkerId[];
}

export interface PlacementWorker {
  readonly workerId: WorkerId;
  /** Bytes of placed chunks this worker may hold, per tier. */
  readonly budgetBytes: Readonly<Record<PlacedTier, number>>;
}

export interface Placement {
  readonly node: NodeId;
  readonly workerId: WorkerId;
  readonly tier: PlacedTier;
}

export interface PlacementPolicy {
  /** Chunks with less demand are not placed. */
  readonly minDemand: number;
  /** Copies of one chunk at most (on distinct workers). */
  readonly maxReplicas: number;
  /** Replicas grow with a chunk's demand share × workers × spread (step 2). */
  readonly spread: number;
  /** placement.set changes per plan at most. */
  readonly maxChanges: number;
}

export const defaultPlacementPolicy: PlacementPolicy = {
  minDemand: 2,
  maxReplicas: 4,
  spread: 2,
  maxChanges: 256,
};

export interface PlacementInput {
  readonly chunks: readonly PlacementChunk[];
  readonly workers: readonly PlacementWorker[];
  /** Placements desired now (placement/desired true). */
  readonly current: readonly Placement[];
  readonly policy: PlacementPolicy;
}

export interface PlacementChange extends Placement {
  readonly desired: boolean;
}

export interface PlacementPlan {
  /** The desired placements, in rank order. */
  readonly desired: readonly Placement[];
  /** What to propose: withdrawals, then additions, at most maxChanges. */
  readonly changes: readonly PlacementChange[];
  /** Changes left for a later plan by maxChanges. */
  readonly deferred: number;
}

/** Bound on chunks one plan ranks (a catalog can hold millions; the hot set is small). */
export const MAX_PLANNED_CHUNKS = 65_536;

function checkPolicy(p: PlacementPolicy): void {
  if (!(p.minDemand >= 0)) throw new RangeError(`minDemand must be ≥ 0, got ${p.minDemand}`);
  if (!Number.isSafeInteger(p.maxReplicas) || p.maxReplicas < 1)
    throw new RangeError(`maxReplicas must be an integer ≥ 1, got ${p.maxReplicas}`);
  if (!(p.spread >= 0 && Number.isFinite(p.spread)))
    throw new RangeError(`spread must be a finite number ≥ 0, got ${p.spread}`);
  if (!Number.isSafeInteger(p.maxChanges) || p.maxChanges < 0)
    throw new RangeError(`maxChanges must be an integer ≥ 0, got ${p.maxChanges}`);
}

const key = (node: NodeId, worker: WorkerId, tier: PlacedTier) => `${node}|${worker}|${tier}`;

/** Chain depth of each chunk (0 at the root); a chunk whose parent is not in the input is a root here. */
function depths(chunks: ReadonlyMap<NodeId, PlacementChunk>): Map<NodeId, number> {
  const out = new Map<NodeId, number>();
  const depthOf = (node: NodeId): number => {
    const known = out.get(node);
    if (known !== undefined) return known;
    // Walk up iteratively (chains can be thousands of chunks deep), then fill in on the way down.
    const path: NodeId[] = [];
    let at: NodeId | null = node;
    let base = -1;
    while (at !== null) {
      const d = out.get(at);
      if (d !== undefined) {
        base = d;
        break;
      }
      path.push(at);
      if (path.length > chunks.size) throw new Error(`placement: the parent links of ${node} form a cycle`);
      const parent: NodeId | null = chunks.get(at)?.parent ?? null;
      at = parent !== null && chunks.has(parent) ? parent : null;
    }
    for (let i = path.length - 1; i >= 0; i--) out.set(path[i]!, ++base);
    return out.get(node)!;
  };
  for (const n of chunks.keys()) depthOf(n);
  return out;
}

export function planPlacements(input: PlacementInput): PlacementPlan {
  const { policy } = input;
  checkPolicy(policy);
  if (input.chunks.length > MAX_PLANNED_CHUNKS)
    throw new RangeError(
      `placement: ${input.chunks.length} chunks exceed the bound of ${MAX_PLANNED_CHUNKS}`,
    );
  const byNode = new Map<NodeId, PlacementChunk>();
  for (const c of input.chunks) {
    if (!(c.demand >= 0) || !(c.bytes >= 0))
      throw new RangeError(`placement: chunk ${c.node} has bad values`);
    byNode.set(c.node, c);
  }
  const depth = depths(byNode);
  const workers = [...input.workers].sort((a, b) => (a.workerId < b.workerId ? -1 : 1));
  const W = workers.length;

  // 1. Rank.
  const ranked = input.chunks
    .filter((c) => c.demand >= policy.minDemand && c.demand > 0)
    .sort(
      (a, b) =>
        b.demand - a.demand ||
        depth.get(a.node)! - depth.get(b.node)! ||
        (a.node < b.node ? -1 : a.node > b.node ? 1 : 0),
    );
  let rootDemand = 0;
  for (const c of ranked) if (depth.get(c.node) === 0) rootDemand += c.demand;

  const now = new Set(input.current.map((p) => key(p.node, p.workerId, p.tier)));
  const holdsNow = (node: NodeId, w: WorkerId) =>
    now.has(key(node, w, "ram")) || now.has(key(node, w, "ssd"));
  const left = new Map(workers.map((w) => [w.workerId, { ...w.budgetBytes }]));
  /** node → workers holding it in the new plan. */
  const placed = new Map<NodeId, Set<WorkerId>>();
  const desired: Placement[] = [];

  for (const c of ranked) {
    // 2. Replicas wanted.
    const share = rootDemand > 0 ? c.demand / rootDemand : 0;
    const k = Math.min(policy.maxReplicas, W, 1 + Math.floor(share * W * policy.spread));
    // 3. Where: holders of the parent (any worker at a root).
    const parent = c.parent !== null && byNode.has(c.parent) ? c.parent : null;
    const eligible =
      parent === null ? workers : workers.filter((w) => placed.get(parent)?.has(w.workerId) ?? false);
    const order = [...eligible].sort((a, b) => {
      const ha = holdsNow(c.node, a.workerId) ? 0 : 1;
      const hb = holdsNow(c.node, b.workerId) ? 0 : 1;
      if (ha !== hb) return ha - hb;
      const ca = c.localHolders.includes(a.workerId) ? 1 : 0;
      const cb = c.localHolders.includes(b.workerId) ? 1 : 0;
      if (ca !== cb) return ca - cb;
      const la = left.get(a.workerId)!;
      const lb = left.get(b.workerId)!;
      const ra = la.ram + la.ssd;
      const rb = lb.ram + lb.ssd;
      if (ra !== rb) return rb - ra;
      return a.workerId < b.workerId ? -1 : 1;
    });
    const holders = new Set<WorkerId>();
    for (const w of order) {
      if (holders.size >= k) break;
      // 4. Tier.
      const budget = left.get(w.workerId)!;
      const tier: PlacedTier | null = budget.ram >= c.bytes ? "ram" : budget.ssd >= c.bytes ? "ssd" : null;
      if (tier === null) continue;
      budget[tier] -= c.bytes;
      holders.add(w.workerId);
      desired.push({ node: c.node, workerId: w.workerId, tier });
    }
    if (holders.size > 0) placed.set(c.node, holders);
  }

  // 5. Changes.
  const want = new Set(desired.map((p) => key(p.node, p.workerId, p.tier)));
  const withdrawals: PlacementChange[] = input.current
    .filter((p) => !want.has(key(p.node, p.workerId, p.tier)))
    .sort((a, b) => compareKeys(a, b))
    .map((p) => ({ ...p, desired: false }));
  const additions: PlacementChange[] = desired
    .filter((p) => !now.has(key(p.node, p.workerId, p.tier)))
    .map((p) => ({ ...p, desired: true }));
  const all = [...withdrawals, ...additions];
  const changes = all.slice(0, policy.maxChanges);
  return { desired, changes, deferred: all.length - changes.length };
}

function compareKeys(a: Placement, b: Placement): number {
  if (a.node !== b.node) return a.node < b.node ? -1 : 1;
  if (a.workerId !== b.workerId) return a.workerId < b.workerId ? -1 : 1;
  return a.tier < b.tier ? -1 : a.tier > b.tier ? 1 : 0;
}
