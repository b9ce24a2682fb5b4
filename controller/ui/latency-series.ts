import type { HistogramSnapshot } from "../metrics.ts";

/**
 * TTFT and inter-token latency over the last minutes, for the web view, from
 * the same cumulative histograms /metrics exports: one snapshot per tick, and
 * each point is the quantile of the observations in the window that ends at
 * it (this snapshot minus the one `windowTicks` earlier), the way PromQL's
 * histogram_quantile over rate(...[window]) reads them.
 *
 * Bounds: at most `capacity` snapshots of each histogram are kept (the
 * oldest is dropped), so memory is fixed whatever the traffic.
 */

/**
 * The q-quantile (0 < q < 1) of the observations counted by `cumulative`
 * (per bucket upper bound, the last +Inf), by linear interpolation inside
 * the bucket that holds rank q × count — histogram_quantile's rule: the first
 * bucket's lower bound is 0, and a rank in the +Inf bucket answers the
 * highest finite bound. Null when the window holds no observation.
 */
export function bucketQuantile(
  q: number,
  bounds: readonly number[],
  cumulative: readonly number[],
): number | null {
  if (!(q > 0 && q < 1)) throw new RangeError(`quantile must be in (0, 1), got ${q}`);
  if (bounds.length !== cumulative.length || bounds.length < 2)
    throw new RangeError("bounds and counts must pair up, with at least one finite bound and +Inf");
  const total = cumulative[cumulative.length - 1]!;
  if (total <= 0) return null;
  const rank = q * total;
  let i = 0;
  while (i < cumulative.length - 1 && cumulative[i]! < rank) i++;
  if (i === bounds.length - 1) return bounds[bounds.length - 2]!;
  const lower = i === 0 ? 0 : bounds[i - 1]!;
  const below = i === 0 ? 0 : cumulative[i - 1]!;
  const inBucket = cumulative[i]! - below;
  return lower + (bounds[i]! - lower) * ((rank - below) / inBucket);
}

/** Counts observed between two snapshots of one histogram (a reset — a smaller count — reads as a fresh start). */
export function windowCounts(older: HistogramSnapshot, newer: HistogramSnapshot): number[] {
  const reset =
    newer.cumulative[newer.cumulative.length - 1]! < older.cumulative[older.cumulative.length - 1]!;
  return newer.cumulative.map((c, i) => (reset ? c : c - older.cumulative[i]!));
}

export interface LatencyPoint {
  /** ms since the epoch of the tick. */
  readonly t: number;
  /** Quantiles in milliseconds over the window ending here (null: nothing observed). */
  readonly ttftP50: number | null;
  readonly ttftP99: number | null;
  readonly itlP50: number | null;
  readonly itlP99: number | null;
  /** Observations in the window. */
  readonly ttftCount: number;
  readonly itlCount: number;
}

interface Tick {
  readonly t: number;
  readonly ttft: HistogramSnapshot;
  readonly itl: HistogramSnapshot;
}

export class LatencySeries {
  private readonly ticks: Tick[] = [];

  constructor(
    /** Snapshots kept (ticks of history + the window). */
    readonly capacity: number,
    /** Ticks per quantile window. */
    readonly windowTicks: number,
  ) {
    if (!Number.isInteger(windowTicks) || windowTicks < 1) throw new RangeError("windowTicks must be ≥ 1");
    if (!Number.isInteger(capacity) || capacity <= windowTicks)
      throw new RangeError("capacity must exceed windowTicks");
  }

  /** Records one tick's snapshots. */
  record(t: number, ttft: HistogramSnapshot, itl: HistogramSnapshot): void {
    this.ticks.push({ t, ttft, itl });
    if (this.ticks.length > this.capacity) this.ticks.shift();
  }

  /** One point per tick that has a full window behind it, oldest first. */
  points(): LatencyPoint[] {
    const out: LatencyPoint[] = [];
    for (let i = this.windowTicks; i < this.ticks.length; i++) {
      const a = this.ticks[i - this.windowTicks]!;
      const b = this.ticks[i]!;
      const ttft = windowCounts(a.ttft, b.ttft);
      const itl = windowCounts(a.itl, b.itl);
      const ms = (v: number | null) => (v === null ? null : Math.round(v * 10_000) / 10);
      out.push({
        t: b.t,
        ttftP50: ms(bucketQuantile(0.5, b.ttft.bounds, ttft)),
        ttftP99: ms(bucketQuantile(0.99, b.ttft.bounds, ttft)),
        itlP50: ms(bucketQuantile(0.5, b.itl.bounds, itl)),
        itlP99: ms(bucketQuantile(0.99, b.itl.bounds, itl)),
        ttftCount: ttft[ttft.length - 1]!,
        itlCount: itl[itl.length - 1]!,
      });
    }
    return out;
  }
}
