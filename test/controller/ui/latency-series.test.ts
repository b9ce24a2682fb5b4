import { describe, expect, it } from "vitest";
import { Histogram, LATENCY_BUCKETS_S } from "../../../controller/metrics.ts";
import { bucketQuantile, LatencySeries, windowCounts } from "../../../controller/ui/latency-series.ts";

describe("latency quantiles from histogram buckets", () => {
  const bounds = [0.01, 0.1, 1, Number.POSITIVE_INFINITY];

  it("interpolates inside the bucket that holds the rank, as histogram_quantile does", () => {
    // 10 observations: 4 ≤ 10 ms, 6 in (10 ms, 100 ms].
    expect(bucketQuantile(0.5, bounds, [4, 10, 10, 10])).toBeCloseTo(0.01 + 0.09 * (1 / 6), 12);
    expect(bucketQuantile(0.2, bounds, [4, 10, 10, 10])).toBeCloseTo(0.005, 12);
    expect(bucketQuantile(0.99, bounds, [4, 10, 10, 10])).toBeCloseTo(0.01 + 0.09 * (5.9 / 6), 12);
    // A rank in the +Inf bucket answers the highest finite bound; nothing observed answers null.
    expect(bucketQuantile(0.99, bounds, [0, 0, 1, 10])).toBe(1);
    expect(bucketQuantile(0.5, bounds, [0, 0, 0, 0])).toBeNull();
    expect(() => bucketQuantile(1, bounds, [0, 0, 0, 1])).toThrow(RangeError);
    expect(() => bucketQuantile(0.5, bounds, [0, 1])).toThrow(RangeError);
  });

  it("counts a window as the difference of two snapshots, and a reset as a fresh start", () => {
    const a = { bounds, cumulative: [1, 2, 3, 3] };
    const b = { bounds, cumulative: [2, 5, 6, 7] };
    expect(windowCounts(a, b)).toEqual([1, 3, 3, 4]);
    expect(windowCounts(b, a)).toEqual([1, 2, 3, 3]);
  });

  it("keeps a bounded history and gives one point per tick with a full window behind it", () => {
    const ttft = new Histogram("t", "t", LATENCY_BUCKETS_S);
    const itl = new Histogram("i", "i", LATENCY_BUCKETS_S);
    const series = new LatencySeries(5, 2);
    for (let tick = 0; tick < 12; tick++) {
      if (tick >= 8) ttft.observe(0.02); // 20 ms, in (10 ms, 25 ms]
      itl.observe(0.002);
      series.record(tick * 1000, ttft.snapshot(), itl.snapshot());
    }
    const points = series.points();
    expect(points.map((p) => p.t)).toEqual([9000, 10000, 11000]);
    // Ticks 8..11 observed one TTFT each: a 2-tick window holds two.
    expect(points.map((p) => p.ttftCount)).toEqual([2, 2, 2]);
    expect(points[0]!.ttftP50).toBeCloseTo(17.5, 6);
    expect(points[0]!.itlCount).toBe(2);
    expect(points[0]!.itlP99).toBeGreaterThan(1);
    expect(points[0]!.itlP99).toBeLessThanOrEqual(2.5);
    const quiet = new LatencySeries(3, 1);
    quiet.record(0, ttft.snapshot(), itl.snapshot());
    quiet.record(1, ttft.snapshot(), itl.snapshot());
    expect(quiet.points()).toEqual([
      { t: 1, ttftP50: null, ttftP99: null, itlP50: null, itlP99: null, ttftCount: 0, itlCount: 0 },
    ]);
    expect(() => new LatencySeries(2, 2)).toThrow(RangeError);
  });
});
