import type { Calibration } from "../calibration/calibration.ts";

/**
 * Residency (pure): what keeping a cached page resident is worth. The page
 * pool evicts its cached pages lowest value first (worker/pages/page-pool.ts);
 * this is the one place that value is defined.
 *
 * A cached page is a sealed page no route references. Keeping it saves, on
 * its next use, the cost of bringing it back: recomputing its rows, or, when
 * the page is durable (its rows are in published chunks), reloading them from
 * the local store if that is cheaper. With p the probability it is used again:
 *
 *   value = p · (durable ? min(recompute, reload) : recompute)
 *
 * p follows Laplace's rule of succession on the page's observed reuse,
 * p = (hits + 1) / (hits + 2), as checkpoint admission weighs reuse.
 */
export interface ResidencyCosts {
  /** Recomputing one page's rows: pageTokens × the calibrated prefill cost per token. */
  readonly recomputePageMs: number;
  /** Reloading one page from the local store: page bytes × the calibrated SSD restore cost per byte. */
  readonly reloadPageMs: number;
}

/** Probability that a prefix reused `hits` times is asked for again (Laplace's rule of succession). */
export function reuseProbability(hits: number): number {
  if (!Number.isSafeInteger(hits) || hits < 0) throw new RangeError(`hits must be ≥ 0, got ${hits}`);
  return (hits + 1) / (hits + 2);
}

export function cachedPageValue(hits: number, durable: boolean, costs: ResidencyCosts): number {
  const { recomputePageMs: recompute, reloadPageMs: reload } = costs;
  if (!Number.isFinite(recompute) || recompute < 0 || !Number.isFinite(reload) || reload < 0)
    throw new RangeError(`residency costs must be finite and ≥ 0, got ${recompute} and ${reload} ms`);
  return reuseProbability(hits) * (durable ? Math.min(recompute, reload) : recompute);
}

/** The costs a page is priced with, from the worker's calibrated costs. */
export function residencyCosts(c: Calibration, pageTokens: number, pageBytes: number): ResidencyCosts {
  return {
    recomputePageMs: pageTokens * c.prefillPerTokenMs.value,
    reloadPageMs: pageBytes * c.restorePerByteMs.ssd.value,
  };
}
