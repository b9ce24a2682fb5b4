import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { PrefillPacer } from "../../worker/runtime/prefill-pacer.ts";

describe("PrefillPacer", () => {
  it("does not pace when nothing decodes, and starts at the smallest tile beside decodes", () => {
    const p = new PrefillPacer(2, 4, 256);
    expect(p.tile(false)).toBe(256);
    expect(p.tile(true)).toBe(4);
    p.observe(8, 0, 40); // a decode-only step: base known, row cost not yet
    expect(p.tile(true)).toBe(4);
    expect(p.tile(false)).toBe(256);
  });

  it("sizes the tile so a mixed step takes pace × a decode-only step", () => {
    const p = new PrefillPacer(2, 1, 256, 1);
    p.observe(8, 0, 40);
    p.observe(8, 4, 56); // 16 ms over the base for 4 rows: 4 ms a row
    // (2 − 1) · 40 / 4 = 10 rows.
    expect(p.tile(true)).toBe(10);
    const q = new PrefillPacer(1.5, 1, 256, 1);
    q.observe(8, 0, 40);
    q.observe(8, 4, 56);
    expect(q.tile(true)).toBe(5);
  });

  it("shrinks the tile as rows get dearer (a long prompt's growing attention), within its bounds", () => {
    const p = new PrefillPacer(2, 3, 12, 1);
    p.observe(8, 0, 40);
    p.observe(8, 10, 60); // 2 ms a row → 20, clamped to 12
    expect(p.tile(true)).toBe(12);
    p.observe(8, 10, 90); // 5 ms a row → 8
    expect(p.tile(true)).toBe(8);
    p.observe(8, 8, 240); // 25 ms a row → 1, clamped to 3
    expect(p.tile(true)).toBe(3);
    p.observe(8, 8, 30); // faster than the base: free rows → the largest tile
    expect(p.tile(true)).toBe(12);
  });

  it("keeps modelled mixed steps within pace × the decode-only step on any linear cost", () => {
    fc.assert(
      fc.property(
        fc.double({ min: 1.1, max: 4, noNaN: true }),
        fc.double({ min: 1, max: 200, noNaN: true }),
        fc.double({ min: 0.01, max: 50, noNaN: true }),
        (pace, baseMs, rowMs) => {
          const p = new PrefillPacer(pace, 1, 4096);
          for (let i = 0; i < 30; i++) {
            p.observe(8, 0, baseMs);
            const t = p.tile(true);
            p.observe(8, t, baseMs + t * rowMs);
          }
          const t = p.tile(true);
          // Exact estimates (the samples are noiseless), so the bound holds unless clamped at the minimum.
          if (t > 1) expect(baseMs + t * rowMs).toBeLessThanOrEqual(pace * baseMs * (1 + 1e-9));
          // And the tile is the largest that fits: one more row would exceed it (or it is the maximum).
          if (t < 4096) expect(baseMs + (t + 1) * rowMs).toBeGreaterThan(pace * baseMs * (1 - 1e-9));
        },
      ),
    );
  });

  it("refuses a pace that cannot be met and bad tile bounds", () => {
    expect(() => new PrefillPacer(1, 1, 8)).toThrow(/pace must be > 1/);
    expect(() => new PrefillPacer(Number.NaN, 1, 8)).toThrow(/pace/);
    expect(() => new PrefillPacer(2, 0, 8)).toThrow(/1 ≤ min ≤ max/);
    expect(() => new PrefillPacer(2, 9, 8)).toThrow(/1 ≤ min ≤ max/);
    expect(() => new PrefillPacer(2, 1, 8, 0)).toThrow(/alpha/);
  });
});
