import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { initialCalibration } from "../../../worker/calibration/calibration.ts";
import { cachedPageValue, residencyCosts, reuseProbability } from "../../../worker/residency/residency.ts";

const costs = fc.record({
  recomputePageMs: fc.double({ min: 0, max: 1e4, noNaN: true }),
  reloadPageMs: fc.double({ min: 0, max: 1e4, noNaN: true }),
});

describe("residency value of a cached page", () => {
  it("grows with reuse and never exceeds what losing the page costs; a durable page is worth at most its reload", () => {
    fc.assert(
      fc.property(fc.nat(1000), fc.nat(1000), costs, (a, b, c) => {
        const [lo, hi] = a <= b ? [a, b] : [b, a];
        for (const durable of [false, true]) {
          expect(cachedPageValue(lo, durable, c)).toBeLessThanOrEqual(cachedPageValue(hi, durable, c));
          const loss = durable ? Math.min(c.recomputePageMs, c.reloadPageMs) : c.recomputePageMs;
          expect(cachedPageValue(hi, durable, c)).toBeLessThanOrEqual(loss);
        }
        expect(cachedPageValue(lo, true, c)).toBeLessThanOrEqual(cachedPageValue(lo, false, c));
      }),
      { numRuns: 300 },
    );
  });

  it("weighs reuse by Laplace's rule: even odds unseen, 2/3 after one hit", () => {
    expect(reuseProbability(0)).toBe(0.5);
    expect(reuseProbability(1)).toBeCloseTo(2 / 3, 12);
    const c = { recomputePageMs: 8, reloadPageMs: 2 };
    expect(cachedPageValue(0, false, c)).toBe(4);
    expect(cachedPageValue(0, true, c)).toBe(1);
    // A reload dearer than recompute: the page is recomputed, so durability saves nothing.
    expect(cachedPageValue(0, true, { recomputePageMs: 8, reloadPageMs: 20 })).toBe(4);
  });

  it("refuses costs that are not finite and non-negative, and negative hits", () => {
    expect(() => cachedPageValue(0, false, { recomputePageMs: Number.NaN, reloadPageMs: 0 })).toThrow(
      RangeError,
    );
    expect(() => cachedPageValue(0, true, { recomputePageMs: 1, reloadPageMs: -1 })).toThrow(RangeError);
    expect(() => reuseProbability(-1)).toThrow(RangeError);
  });

  it("prices pages from the calibrated prefill and SSD restore costs", () => {
    const c = initialCalibration({
      prefillPerTokenMs: 0.5,
      firstTokenMs: 1,
      decodeStepMs: 1,
      restorePerByteMs: { ram: 1e-7, ssd: 1e-6, peer: 1e-5, s3: 1e-4 },
    });
    expect(residencyCosts(c, 16, 4096)).toEqual({ recomputePageMs: 8, reloadPageMs: 4096e-6 });
  });
});
