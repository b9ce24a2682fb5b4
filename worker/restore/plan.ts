import type { Tier } from "../../schema/catalog.ts";
import { windowDeadPages } from "../pages/route.ts";

/**
 * Restore planning (pure): which prefix to restore and, for each layer
 * group, which chunks of its chain to read and from where, decided before
 * any byte moves.
 *
 * Inputs: the continuation's processed-token count (prompt minus the pending
 * token), the rows already resident (page-aligned, the same in every group),
 * the chain's chunk extents, and per layer group its route's window, its
 * reservation, and for each leading published chunk of its chain the sources
 * holding a ready copy, each with a predicted fetch cost (bytes × calibrated
 * cost per byte of its tier). A plan restores every group to the same row
 * restoreTo = end of chunk k, or none (all or none: a group's pages are
 * useless without the others'), and recomputes the rest. At restoreTo a
 * group whose route releases pages outside a window W needs only the pages
 * that window still reads (windowDeadPages); the pages before them are left
 * released and their chunks are never read. So a group needs the chunks
 * covering rows [max(resident, dead·P), restoreTo), and a k is possible only
 * when each group has a source for each chunk it needs and its pages fit its
 * reservation:
 *
 *   cost(k) = Σ_groups Σ_{needed i} min_source cost_i + (processed − end_k) · prefillPerTokenMs
 *
 * The plan takes the possible k of least cost (ties: more restored tokens);
 * none is possible, or none beats recompute: restoreTo = resident. Each
 * chosen chunk keeps all its sources, cheapest first, so a failed fetch
 * falls back to the next without planning again.
 */
export interface SourceOption {
  /** Where the bytes are read: this worker's RAM or SSD, a peer's RAM or SSD, or S3. */
  readonly tier: Tier;
  /** The worker holding the copy ("" for S3: the shared bucket). */
  readonly worker: string;
  /** Peer address host:port (peer only). */
  readonly address?: string;
  readonly costMs: number;
}

/** What the catalog holds of one chunk of a group's chain. */
export interface ChunkOffer {
  readonly bytes: number;
  /** Ready copies; none: the chunk is published but unreadable. */
  readonly sources: readonly SourceOption[];
}

export interface GroupInput {
  /** The window outside which the group's route releases pages (null: it keeps every page). */
  readonly window: number | null;
  /** Leading published chunks of the group's chain, from the root: offer i is chunk i of `chain`. */
  readonly chunks: readonly ChunkOffer[];
  /** Pages the group's load may fill: its route's reservation. */
  readonly availablePages: number;
}

export interface RestorePlanInput {
  readonly processedTokens: number;
  readonly residentTokens: number;
  readonly pageTokens: number;
  readonly prefillPerTokenMs: number;
  /** The chain's chunks from the root: chunk i covers [start, start + tokens), each starting where the last ended. */
  readonly chain: readonly { readonly start: number; readonly tokens: number }[];
  /** Layer groups, group 0 first. */
  readonly groups: readonly GroupInput[];
}

export interface PlannedChunk {
  readonly group: number;
  readonly index: number;
  readonly start: number;
  readonly tokens: number;
  readonly bytes: number;
  /** Sources, cheapest first (ties by tier order ram, ssd, peer, s3, then worker). */
  readonly sources: readonly SourceOption[];
}

/** One group's part of a restore: pages for rows [from, restoreTo), after `skipPages` released entries. */
export interface GroupLoad {
  readonly group: number;
  /** Pages after the resident ones left released (dead for the window at restoreTo): never read. */
  readonly skipPages: number;
  /** The first row written into a page (page-aligned). */
  readonly from: number;
  /** The chunks holding rows [from, restoreTo), in chain order. */
  readonly chunks: readonly PlannedChunk[];
}

export interface RestorePlan {
  /** Rows that will be in pages once the restore completes (= residentTokens when nothing is restored). */
  readonly restoreTo: number;
  /** One per group, group 0 first; empty when nothing is restored. */
  readonly loads: readonly GroupLoad[];
  readonly predictedMs: number;
  /** Cost of recomputing everything not resident, for comparison. */
  readonly recomputeMs: number;
}

const TIER_ORDER: Record<Tier, number> = { ram: 0, ssd: 1, peer: 2, s3: 3 };

function bySourceCost(a: SourceOption, b: SourceOption): number {
  return (
    a.costMs - b.costMs ||
    TIER_ORDER[a.tier] - TIER_ORDER[b.tier] ||
    (a.worker < b.worker ? -1 : a.worker > b.worker ? 1 : 0)
  );
}

export function planRestore(input: RestorePlanInput): RestorePlan {
  const { processedTokens: n, residentTokens: resident, pageTokens: P, chain } = input;
  if (resident % P !== 0) throw new RangeError(`resident rows ${resident} are not whole pages of ${P}`);
  if (resident > n) throw new RangeError(`resident rows ${resident} exceed the processed rows ${n}`);
  const ends: number[] = [];
  for (let i = 0; i < chain.length; i++) {
    const c = chain[i]!;
    if (c.start !== (i === 0 ? 0 : ends[i - 1]))
      throw new RangeError(`chunk ${i} starts at ${c.start}, not where chunk ${i - 1} ends`);
    ends.push(c.start + c.tokens);
  }
  const recomputeMs = (n - resident) * input.prefillPerTokenMs;
  const none: RestorePlan = { restoreTo: resident, loads: [], predictedMs: recomputeMs, recomputeMs };
  // Per group, over chain chunks: sources cheapest first, and prefix sums of the cheapest cost and of
  // unreadable chunks, so a k's cost and possibility over any run of chunks is O(1).
  const prep = input.groups.map((grp) => {
    const sources = chain.map((_, i) => [...(grp.chunks[i]?.sources ?? [])].sort(bySourceCost));
    const cost = [0];
    const missing = [0];
    sources.forEach((s, i) => {
      cost.push(cost[i]! + (s[0]?.costMs ?? 0));
      missing.push(missing[i]! + (s.length === 0 ? 1 : 0));
    });
    return { sources, cost, missing };
  });
  /** Group g's first page and first needed chunk for a restore to `end` rows. */
  const need = (g: number, end: number, lo: number) => {
    const dead = windowDeadPages(end, input.groups[g]!.window, P, Math.ceil(end / P));
    const firstPage = Math.max(resident / P, dead);
    let first = lo;
    while (ends[first]! <= firstPage * P) first++;
    return { firstPage, first };
  };
  let best = { k: 0, cost: recomputeMs };
  // The first needed chunk only moves right as k grows (a window's dead pages only grow).
  const lo = input.groups.map(() => 0);
  for (let k = 1; k <= chain.length && input.groups.length > 0; k++) {
    const end = ends[k - 1]!;
    if (end > n) break; // never restore the pending token's row or beyond
    if (end <= resident) continue; // already resident
    let cost = (n - end) * input.prefillPerTokenMs;
    let possible = true;
    for (let g = 0; g < input.groups.length && possible; g++) {
      const { firstPage, first } = need(g, end, lo[g]!);
      lo[g] = first;
      const p = prep[g]!;
      possible =
        Math.ceil(end / P) - firstPage <= input.groups[g]!.availablePages &&
        p.missing[k]! === p.missing[first]!;
      cost += p.cost[k]! - p.cost[first]!;
    }
    if (possible && cost <= best.cost) best = { k, cost };
  }
  if (best.k === 0) return none;
  const restoreTo = ends[best.k - 1]!;
  const loads = input.groups.map((grp, g): GroupLoad => {
    const { firstPage, first } = need(g, restoreTo, 0);
    const chunks: PlannedChunk[] = [];
    for (let i = first; i < best.k; i++)
      chunks.push({
        group: g,
        index: i,
        start: chain[i]!.start,
        tokens: chain[i]!.tokens,
        bytes: grp.chunks[i]!.bytes,
        sources: prep[g]!.sources[i]!,
      });
    return { group: g, skipPages: firstPage - resident / P, from: firstPage * P, chunks };
  });
  return { restoreTo, loads, predictedMs: best.cost, recomputeMs };
}
