import type { NodeId } from "../../schema/ids.ts";

/**
 * What prefetch should do about this worker's placements (pure).
 *
 * For each placement addressed to this worker, by what the catalog and the
 * local tiers say now:
 *   desired, not held in its tier here        → fetch it (ahead of demand);
 *   desired, held                              → keep it (RAM: pinned);
 *   withdrawn, a RAM copy held                 → unpin it: LRU may evict it;
 *   withdrawn, an SSD copy prefetch fetched    → delete it, but only when
 *       another durable copy is ready elsewhere (S3, or another worker's
 *       SSD); the last durable copy is kept whatever demand says.
 * RAM copies never count as durable (a restart loses them); copies this
 * worker made itself (its checkpoints) are never deleted here.
 */

export type PlacedTier = "ram" | "ssd";

export interface WorkerPlacement {
  readonly node: NodeId;
  readonly tier: PlacedTier;
  readonly desired: boolean;
}

export interface LocalState {
  /** This worker holds a ready copy of the node in the tier (its catalog replica and its store agree). */
  holds(node: NodeId, tier: PlacedTier): boolean;
  /** This process fetched the node's copy in the tier (so it may delete it). */
  fetched(node: NodeId, tier: PlacedTier): boolean;
  /** A durable copy other than this worker's SSD is ready: S3, or another worker's SSD. */
  durableElsewhere(node: NodeId): boolean;
}

export type PrefetchStep =
  | { readonly kind: "fetch"; readonly node: NodeId; readonly tier: PlacedTier }
  | { readonly kind: "pin"; readonly node: NodeId }
  | { readonly kind: "unpin"; readonly node: NodeId }
  | { readonly kind: "delete"; readonly node: NodeId }
  | { readonly kind: "keep-last"; readonly node: NodeId };

/** The steps for `placements`, in node then tier order (deterministic). */
export function planPrefetch(placements: readonly WorkerPlacement[], local: LocalState): PrefetchStep[] {
  const out: PrefetchStep[] = [];
  const sorted = [...placements].sort((a, b) =>
    a.node !== b.node ? (a.node < b.node ? -1 : 1) : a.tier < b.tier ? -1 : a.tier > b.tier ? 1 : 0,
  );
  for (const p of sorted) {
    const held = local.holds(p.node, p.tier);
    if (p.desired) {
      if (!held) out.push({ kind: "fetch", node: p.node, tier: p.tier });
      else if (p.tier === "ram") out.push({ kind: "pin", node: p.node });
      continue;
    }
    if (!held) continue;
    if (p.tier === "ram") {
      out.push({ kind: "unpin", node: p.node });
      continue;
    }
    if (!local.fetched(p.node, "ssd")) continue;
    out.push(
      local.durableElsewhere(p.node) ? { kind: "delete", node: p.node } : { kind: "keep-last", node: p.node },
    );
  }
  return out;
}
