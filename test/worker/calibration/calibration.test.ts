import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { heartbeatCosts } from "../../../worker/agent/heartbeat.ts";
import {
  type Calibration,
  type ConfiguredCosts,
  initialCalibration,
  MIN_FIT_STEPS,
  observe,
  PREFILL_STEP_WINDOW,
  prefillFit,
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

  it("fits prefill steps for the router: a row costs c₁ + c₂·k̄ and each step's pass rides with the first token", () => {
    // A machine whose steps cost 20 ms + 2 ms a row + 1 µs a key, with decode rows beside some prefills.
    const truth = (rows: number, keys: number) => 20 + 2 * rows + 0.001 * keys;
    let c: Calibration = initialCalibration(COSTS);
    let keysSum = 0;
    let rowsSum = 0;
    let msSum = 0;
    let allRows = 0;
    for (let i = 0; i < MIN_FIT_STEPS + 4; i++) {
      const p = 16 + 37 * i;
      const s = step(p, 384, i % 3);
      keysSum += s.prefillKeys;
      rowsSum += s.prefillRows;
      msSum += truth(s.rows, s.keys);
      allRows += s.rows;
      c = observe(c, { kind: "prefill-step", ...s, deviceMs: truth(s.rows, s.keys), queueMs: 0 });
      // Until MIN_FIT_STEPS the fit is not trusted: the heartbeat gives the window's ms per row, nothing fixed.
      if (i < MIN_FIT_STEPS - 1) {
        expect(prefillFit(c)).toBeNull();
        expect(heartbeatCosts(c).prefillPerTokenMs).toBeCloseTo(msSum / allRows, 9);
      }
      // The worker's own recompute cost: a row with its share of each step's pass.
      expect(c.prefillPerTokenMs.value).toBeCloseTo(msSum / allRows, 9);
    }
    expect(prefillFit(c)!.stepMs).toBeCloseTo(20, 3);
    expect(prefillFit(c)!.perTokenMs).toBeCloseTo(2 + 0.001 * (keysSum / rowsSum), 3);
    expect(c.prefillPerTokenMs.value).toBeGreaterThan(prefillFit(c)!.perTokenMs);
    c = observe(c, { kind: "first-token", deviceMs: 40, queueMs: 0 });
    // A 16-row prompt after 384 cached tokens: U·prefillPerTokenMs + firstTokenMs ≈ its prefill step + the first-token step.
    const costs = heartbeatCosts(c);
    expect(costs.firstTokenMs).toBeCloseTo(60, 3);
    const s16 = step(16, 384);
    expect(16 * costs.prefillPerTokenMs + costs.firstTokenMs).toBeCloseTo(truth(16, s16.keys) + 40, -1);
  });

  it("keeps PREFILL_STEP_WINDOW steps and follows a machine whose speed changes", () => {
    let c: Calibration = initialCalibration(COSTS);
    for (let i = 0; i < 3 * PREFILL_STEP_WINDOW; i++) {
      const s = step(16 + (i % 9) * 31, 0);
      const slow = i >= PREFILL_STEP_WINDOW;
      c = observe(c, { kind: "prefill-step", ...s, deviceMs: (slow ? 3 : 1) * (10 + s.rows), queueMs: 0 });
      expect(c.prefillSteps.length).toBe(Math.min(i + 1, PREFILL_STEP_WINDOW));
    }
    expect(prefillFit(c)!.perTokenMs).toBeCloseTo(3, 6);
    expect(prefillFit(c)!.stepMs).toBeCloseTo(30, 4);
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
