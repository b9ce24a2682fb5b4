import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  type Calibration,
  type ConfiguredCosts,
  initialCalibration,
  observe,
} from "../../../worker/calibration/calibration.ts";

const COSTS: ConfiguredCosts = {
  prefillPerTokenMs: 0.5,
  firstTokenMs: 20,
  decodeStepMs: 10,
  restorePerByteMs: { ram: 1e-6, ssd: 1e-5, peer: 2e-5, s3: 1e-4 },
};

describe("calibration", () => {
  it("reports configured values with zero samples until the first measurement replaces them", () => {
    const c0 = initialCalibration(COSTS);
    expect(c0.prefillPerTokenMs).toEqual({ value: 0.5, samples: 0 });
    const c1 = observe(c0, { kind: "prefill", tokens: 100, deviceMs: 30, queueMs: 500 });
    expect(c1.prefillPerTokenMs).toEqual({ value: 0.3, samples: 1 });
    // Queue delay is kept apart: it never leaks into the device cost.
    expect(c1.queueDelayMs).toEqual({ value: 500, samples: 1 });
    expect(c1.firstTokenMs).toEqual({ value: 20, samples: 0 });
    const c2 = observe(c1, { kind: "restore", tier: "ssd", bytes: 1000, deviceMs: 2, queueMs: 0 });
    expect(c2.restorePerByteMs.ssd).toEqual({ value: 0.002, samples: 1 });
    expect(c2.restorePerByteMs.s3.samples).toBe(0);
    expect(() => observe(c2, { kind: "prefill", tokens: 0, deviceMs: 1, queueMs: 0 })).toThrow(/positive/);
  });

  it("converges geometrically to a steady cost: |error| shrinks by (1 − α) per sample", () => {
    fc.assert(
      fc.property(
        fc.double({ min: 0.01, max: 1000, noNaN: true }),
        fc.double({ min: 0.01, max: 1000, noNaN: true }),
        fc.double({ min: 0.05, max: 1, noNaN: true }),
        fc.integer({ min: 1, max: 60 }),
        (first, steady, alpha, n) => {
          let c: Calibration = initialCalibration(COSTS, alpha);
          c = observe(c, { kind: "decode-step", deviceMs: first, queueMs: 0 });
          for (let i = 0; i < n; i++) c = observe(c, { kind: "decode-step", deviceMs: steady, queueMs: 0 });
          const expected = Math.abs(first - steady) * (1 - alpha) ** n;
          expect(Math.abs(c.decodeStepMs.value - steady)).toBeCloseTo(expected, 6);
          expect(c.decodeStepMs.samples).toBe(n + 1);
        },
      ),
      { numRuns: 200 },
    );
  });
});
