import { describe, expect, it } from "vitest";
import { Prng } from "../../../controller/sim/prng.ts";
import { defaultSimOptions, Faults, type SimSummary, simulate } from "../../../controller/sim/simulate.ts";

const allFaults = new Set(Faults);

describe("seeded PRNG", () => {
  it("is reproducible per seed and differs across seeds", () => {
    const a = new Prng(42);
    const b = new Prng(42);
    const c = new Prng(43);
    const xs = Array.from({ length: 8 }, () => a.u32());
    expect(Array.from({ length: 8 }, () => b.u32())).toEqual(xs);
    expect(Array.from({ length: 8 }, () => c.u32())).not.toEqual(xs);
    const r = new Prng(1);
    for (let i = 0; i < 1000; i++) {
      const f = r.float();
      expect(f >= 0 && f < 1).toBe(true);
      const n = r.int(3, 5);
      expect(n >= 3 && n <= 5).toBe(true);
    }
  });
});

describe("failure simulator", () => {
  it("is deterministic: the same seed gives the same trace hash, different seeds differ", () => {
    const run = (seed: number) => simulate({ ...defaultSimOptions(seed, 4, 60), faults: allFaults });
    const a = run(11);
    expect(run(11)).toEqual(a);
    expect(run(12).traceHash).not.toBe(a.traceHash);
    expect(a.traceHash).toMatch(/^[0-9a-f]{64}$/);
  });

  it("without faults every request completes and the load stays within 2x the mean", () => {
    const s = simulate(defaultSimOptions(5, 4, 200));
    expect(s.completed).toBe(200);
    expect(s.failed).toEqual({});
    expect(s.lateIgnored).toBe(0);
    expect(s.maxOverMeanLoad).toBeLessThanOrEqual(2);
  });

  it("1,000 seeds with every fault keep the invariants, and every request ends", () => {
    const totals = {
      requests: 0,
      completed: 0,
      failed: 0,
      late: 0,
      crashes: 0,
      partitions: 0,
      lost: 0,
      dup: 0,
    };
    for (let seed = 1; seed <= 1000; seed++) {
      const s: SimSummary = simulate({
        ...defaultSimOptions(seed, 1 + (seed % 4), 12 + (seed % 9)),
        faults: allFaults,
      });
      const failed = Object.values(s.failed).reduce((a, b) => a + b, 0);
      expect(s.completed + failed).toBe(s.requests);
      totals.requests += s.requests;
      totals.completed += s.completed;
      totals.failed += failed;
      totals.late += s.lateIgnored;
      totals.crashes += s.crashes;
      totals.partitions += s.partitions;
      totals.lost += s.messages.lost;
      totals.dup += s.messages.duplicated;
    }
    // The faults really happened, and most requests still completed.
    expect(totals.crashes).toBeGreaterThan(500);
    expect(totals.partitions).toBeGreaterThan(500);
    expect(totals.lost).toBeGreaterThan(100);
    expect(totals.dup).toBeGreaterThan(100);
    expect(totals.late).toBeGreaterThan(0);
    expect(totals.completed / totals.requests).toBeGreaterThan(0.5);
  }, 120_000);

  it("rejects bad options with a clear error", () => {
    expect(() => simulate(defaultSimOptions(1, 0, 10))).toThrow(/workers must be 1..1024/);
    expect(() => simulate(defaultSimOptions(1, 2, -1))).toThrow(/requests must be/);
  });
});
