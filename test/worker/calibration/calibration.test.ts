import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { heartbeatCosts } from "../../../worker/agent/heartbeat.ts";
import {
  type Calibration,
  type ConfiguredCosts,
  initialCalibration,
  observe,
  PREFILL_STEP_WINDOW,
} from "../../../worker/calibration/calibration.ts";

const COSTS: ConfiguredCosts = {
  prefillPerTokenMs: 0.5,
  firstTokenMs: 20,
  decodeStepMs: 10,
  restorePerByteMs: { ram: 1e-6, ssd: 1e-5, peer: 2e-5, s3: 1e-4 },
};

/** A step of `prefill` rows after `cached` positions, beside `decodes` one-row lanes at position 500. */
function step(prefill: number, cached: number, decodes = 0) {
  const prefillKeys = prefill * (cached + 1) + (prefill * (prefill - 1)) / 2;
  return {
    rows: prefill + decodes,
    keys: prefillKeys + decodes * 501,
    prefillRows: prefill,
    prefillKeys,
  };
}

describe("calibration", () => {
  it("reports configured values with zero samples until the first measurement replaces them", () => {
    const c0 = initialCalibration(COSTS);
    expect(c0.prefillPerTokenMs).toEqual({ value: 0.5, samples: 0 });
    const c1 = observe(c0, { kind: "prefill-step", ...step(100, 0), deviceMs: 30, queueMs: 500 });
    expect(c1.prefillPerTokenMs).toEqual({ value: 0.3, samples: 1 });
    // Queue delay is kept apart: it never leaks into the device cost.
    expect(c1.queueDelayMs).toEqual({ value: 500, samples: 1 });
    expect(c1.firstTokenMs).toEqual({ value: 20, samples: 0 });
    const c2 = observe(c1, { kind: "restore", tier: "ssd", bytes: 1000, deviceMs: 2, queueMs: 0 });
    expect(c2.restorePerByteMs.ssd).toEqual({ value: 0.002, samples: 1 });
    expect(c2.restorePerByteMs.s3.samples).toBe(0);
    expect(() => observe(c2, { kind: "prefill-step", ...step(0, 0), deviceMs: 1, queueMs: 0 })).toThrow(
      /positive/,
    );
    expect(() =>
      observe(c2, { kind: "prefill-step", ...step(4, 0), prefillRows: 5, deviceMs: 1, queueMs: 0 }),
    ).toThrow(/5 prefill rows of 4/);
  });

  it("a prefill row costs the window's ms per row, its share of each step's pass included", () => {
    const truth = (rows: number, keys: number) => 20 + 2 * rows + 0.001 * keys;
    let c: Calibration = initialCalibration(COSTS);
    let msSum = 0;
    let allRows = 0;
    for (let i = 0; i < 12; i++) {
      const s = step(16 + 37 * i, 384, i % 3);
      msSum += truth(s.rows, s.keys);
      allRows += s.rows;
      c = observe(c, { kind: "prefill-step", ...s, deviceMs: truth(s.rows, s.keys), queueMs: 0 });
      expect(c.prefillPerTokenMs.value).toBeCloseTo(msSum / allRows, 9);
      expect(heartbeatCosts(c).prefillPerTokenMs).toBeCloseTo(msSum / allRows, 9);
    }
  });

  it("keeps PREFILL_STEP_WINDOW steps and follows a machine whose speed changes", () => {
    let c: Calibration = initialCalibration(COSTS);
    const ms = (rows: number, slow: boolean) => (slow ? 3 : 1) * (10 + rows);
    for (let i = 0; i < 3 * PREFILL_STEP_WINDOW; i++) {
      const s = step(16 + (i % 9) * 31, 0);
      c = observe(c, {
        kind: "prefill-step",
        ...s,
        deviceMs: ms(s.rows, i >= PREFILL_STEP_WINDOW),
        queueMs: 0,
      });
      expect(c.prefillSteps.length).toBe(Math.min(i + 1, PREFILL_STEP_WINDOW));
    }
    // Only slow steps are left in the window.
    const rows = c.prefillSteps.reduce((n, s) => n + s.rows, 0);
    const total = c.prefillSteps.reduce((n, s) => n + ms(s.rows, true), 0);
    expect(c.prefillPerTokenMs.value).toBeCloseTo(total / rows, 9);
    expect(c.prefillPerTokenMs.samples).toBe(3 * PREFILL_STEP_WINDOW);
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
