import type { Tier } from "../../schema/catalog.ts";

/**
 * Restore planning (pure): which prefix to restore and where each chunk comes
 * from, decided before any byte moves.
 *
 * Inputs: the continuation's processed-token count (prompt minus the pending
 * token), the rows already resident (page-aligned), and for each leading
 * published chunk of its chain the sources that hold a ready copy, each with a
 * predicted fetch cost (bytes × calibrated cost per byte of its tier). A plan
 * restores chunks [first, k) where `first` is the chunk holding the first
 * non-resident row, and recomputes the rest:
 *
 *   cost(k) = Σ_{i ∈ [first, k)} min_source cost_i + (processed − max(k·C, resident)) · prefillPerTokenMs
 *
 * The plan takes the k of least cost (ties: more restored tokens), among the
 * k whose new pages fit the pages it may use (a shorter prefix under
 * pressure). Each chosen chunk keeps all its sources, cheapest first, so a
 * failed fetch falls back to the next without planning again.
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

export interface PlannedChunk {
  readonly index: number;
  readonly start: number;
  readonly tokens: number;
  readonly bytes: number;
  /** Sources, cheapest first (ties by tier order ram, ssd, peer, s3, then worker). */
  readonly sources: readonly SourceOption[];
}

export interface RestorePlanInput {
  readonly processedTokens: number;
  readonly residentTokens: number;
  readonly pageTokens: number;
  readonly prefillPerTokenMs: number;
  /** Leading published chunks of the chain, in order from the root; index i covers [i·C, (i+1)·C). */
  readonly chunks: readonly Omit<PlannedChunk, "index">[];
  /** Pages the restore may fill beyond the resident ones. */
  readonly availablePages: number;
}

export interface RestorePlan {
  /** Rows that will be in pages once the restore completes (= residentTokens when nothing is restored). */
  readonly restoreTo: number;
  readonly chunks: readonly PlannedChunk[];
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
  const { processedTokens: n, residentTokens: resident, pageTokens: P } = input;
  if (resident % P !== 0) throw new RangeError(`resident rows ${resident} are not whole pages of ${P}`);
  if (resident > n) throw new RangeError(`resident rows ${resident} exceed the processed rows ${n}`);
  const recomputeMs = (n - resident) * input.prefillPerTokenMs;
  const residentPages = resident / P;
  let best = { k: -1, cost: recomputeMs, end: resident };
  let sum = 0;
  const picked: PlannedChunk[] = [];
  for (let i = 0; i < input.chunks.length; i++) {
    const c = input.chunks[i]!;
    const end = c.start + c.tokens;
    if (c.start !== (i === 0 ? 0 : input.chunks[i - 1]!.start + input.chunks[i - 1]!.tokens))
      throw new RangeError(`chunk ${i} starts at ${c.start}, not where chunk ${i - 1} ends`);
    if (end > n) break; // never restore the pending token's row or beyond
    if (end <= resident) continue; // already resident
    if (c.sources.length === 0) break; // the run of restorable chunks ends here
    const pagesNeeded = Math.ceil(end / P) - residentPages;
    if (pagesNeeded > input.availablePages) break;
    const sources = [...c.sources].sort(bySourceCost);
    sum += sources[0]!.costMs;
    picked.push({ ...c, index: i, sources });
    const cost = sum + (n - end) * input.prefillPerTokenMs;
    if (cost <= best.cost) best = { k: picked.length, cost, end };
  }
  if (best.k < 0) return { restoreTo: resident, chunks: [], predictedMs: recomputeMs, recomputeMs };
  return { restoreTo: best.end, chunks: picked.slice(0, best.k), predictedMs: best.cost, recomputeMs };
}
