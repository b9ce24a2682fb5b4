import type { NodeId } from "../../schema/ids.ts";

/**
 * Prefix popularity for placement (pure values; time is passed in).
 *
 * Demand facts (`demand.observed`: a node, a tenant, a window's end and a
 * count) are folded into one exponentially decayed score per node:
 *
 *   score(t) = Σ count_i × 2^(−(t − time_i) / halfLifeMs)
 *
 * kept as (score, asOf) and decayed when read or added to, so a node costs
 * one entry however many facts name it. Bound: at most `maxNodes` nodes; past
 * it the lowest-scored node is dropped (the coldest prefix is the one
 * placement can do without).
 *
 * `chainDemand` credits each node's score to its ancestors as well: a
 * request that reached node n reached every chunk before it, so a parent's
 * demand is its own plus its children's (the policy's monotone demand).
 */
export class DecayedDemand {
  private readonly scores = new Map<NodeId, { score: number; asOf: number }>();

  constructor(
    readonly halfLifeMs: number,
    readonly maxNodes: number,
  ) {
    if (!(halfLifeMs > 0)) throw new RangeError(`halfLifeMs must be > 0, got ${halfLifeMs}`);
    if (!Number.isSafeInteger(maxNodes) || maxNodes < 1)
      throw new RangeError(`maxNodes must be an integer ≥ 1, got ${maxNodes}`);
  }

  get size(): number {
    return this.scores.size;
  }

  private decayed(e: { score: number; asOf: number }, t: number): number {
    // A fact from the future (another process's clock) counts at full weight, never more.
    return e.score * 2 ** (-Math.max(0, t - e.asOf) / this.halfLifeMs);
  }

  /** Adds `count` requests observed at `timeMs`. */
  add(node: NodeId, count: number, timeMs: number): void {
    if (!(count > 0) || !Number.isFinite(timeMs)) return;
    const e = this.scores.get(node);
    if (e === undefined) {
      if (this.scores.size >= this.maxNodes) this.dropColdest(timeMs);
      this.scores.set(node, { score: count, asOf: timeMs });
      return;
    }
    const t = Math.max(e.asOf, timeMs);
    e.score = this.decayed(e, t) + count * 2 ** (-(t - timeMs) / this.halfLifeMs);
    e.asOf = t;
  }

  /** Every node's score at `nowMs`; scores below `floor` are left out. */
  at(nowMs: number, floor = 0): Map<NodeId, number> {
    const out = new Map<NodeId, number>();
    for (const [node, e] of this.scores) {
      const s = this.decayed(e, nowMs);
      if (s >= floor) out.set(node, s);
    }
    return out;
  }

  private dropColdest(nowMs: number): void {
    let victim: NodeId | null = null;
    let low = Number.POSITIVE_INFINITY;
    for (const [node, e] of this.scores) {
      const s = this.decayed(e, nowMs);
      if (s < low || (s === low && victim !== null && node < victim)) {
        low = s;
        victim = node;
      }
    }
    if (victim !== null) this.scores.delete(victim);
  }
}

/**
 * Demand of every chunk on the chains of `direct`'s nodes: each node's score
 * added to it and to each ancestor (`parentOf` walks the catalog's parent
 * links; null at a root or where a parent is unknown). Bounded: a walk stops
 * after `maxDepth` ancestors.
 */
export function chainDemand(
  direct: ReadonlyMap<NodeId, number>,
  parentOf: (node: NodeId) => NodeId | null,
  maxDepth = 1 << 16,
): Map<NodeId, number> {
  const out = new Map<NodeId, number>();
  for (const [node, score] of direct) {
    let at: NodeId | null = node;
    for (let d = 0; at !== null && d <= maxDepth; d++) {
      out.set(at, (out.get(at) ?? 0) + score);
      at = parentOf(at);
    }
  }
  return out;
}
