import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { PrefillPacer } from "../../worker/runtime/prefill-pacer.ts";

/** Feeds `steps` mixed steps of a noiseless linear cost, each after a decode-only step; returns the pacer. */
function converge(p: PrefillPacer, baseMs: number, rowMs: number, steps: number): PrefillPacer {
  for (let i = 0; i < steps; i++) {
    p.observe(8, 0, baseMs);
    const t = p.tile(true);
    p.observe(8, t, baseMs + t * rowMs);
  }
  return p;
}

describe("PrefillPacer", () => {
  it("does not pace when nothing decodes, and starts at the smallest tile beside decodes", () => {
    const p = new PrefillPacer(2, 4, 256);
    expect(p.tile(false)).toBe(256);
    expect(p.tile(true)).toBe(4);
    p.observe(8, 0, 40); // a decode-only step: base known, row cost not yet
    expect(p.tile(true)).toBe(4);
    expect(p.tile(false)).toBe(256);
  });

  it("sizes the tile so a mixed step takes pace × a decode-only step, growing toward it step by step", () => {
    const p = new PrefillPacer(2, 1, 256, 16, 2);
    p.observe(8, 0, 40);
    p.observe(8, 4, 56); // 16 ms over the base for 4 rows: 4 ms a row
    // (2 − 1) · 40 / 4 = 10 rows, but at most 2 × the last 4 rows.
    expect(p.tile(true)).toBe(8);
    p.observe(8, 8, 72);
    expect(p.tile(true)).toBe(10);
    const q = new PrefillPacer(1.5, 1, 256, 16, 2);
    q.observe(8, 0, 40);
    q.observe(8, 4, 56);
    expect(q.tile(true)).toBe(5);
  });

  it("shrinks the tile at once as rows get dearer (a long prompt's growing attention), within its bounds", () => {
    const p = new PrefillPacer(2, 3, 12, 1, 4);
    p.observe(8, 0, 40);
    p.observe(8, 10, 60); // 2 ms a row → 20, clamped to 12
    expect(p.tile(true)).toBe(12);
    p.observe(8, 10, 90); // 5 ms a row → 8
    expect(p.tile(true)).toBe(8);
    p.observe(8, 8, 240); // 25 ms a row → 1, clamped to 3
    expect(p.tile(true)).toBe(3);
  });

  it("a noisy machine moves it little: one early step does not jump the tile, one slow decode step does not move the base", () => {
    const p = converge(new PrefillPacer(1.6, 2, 128), 50, 4, 60);
    const settled = p.tile(true);
    expect(settled).toBe(7); // ⌊0.6 · 50 / 4⌋
    // A 7-row step that finished faster than a decode-only one (read alone: rows are free).
    p.observe(8, settled, 45);
    expect(p.tile(true)).toBeLessThanOrEqual(Math.ceil(settled * 1.25));
    expect(p.tile(true)).toBeLessThan(128);
    // A decode-only step three times slower than usual.
    const base = p.baseMs();
    p.observe(8, 0, 150);
    expect(p.baseMs()).toBe(base);
    // A stalled mixed step (the machine was busy): the tile stays.
    const before = p.tile(true);
    p.observe(8, before, 1000);
    expect(p.tile(true)).toBe(before);
  });

  it("keeps modelled mixed steps within pace × the decode-only step on any linear cost", () => {
    fc.assert(
      fc.property(
        fc.double({ min: 1.1, max: 4, noNaN: true }),
        fc.double({ min: 1, max: 200, noNaN: true }),
        fc.double({ min: 0.01, max: 50, noNaN: true }),
        (pace, baseMs, rowMs) => {
          // Growth by 1.25 per step reaches any tile ≤ 4096 within 40 steps.
          const p = converge(new PrefillPacer(pace, 1, 4096), baseMs, rowMs, 60);
          const t = p.tile(true);
          // Exact estimates (the samples are noiseless), so the bound holds unless clamped at the minimum.
          if (t > 1) expect(baseMs + t * rowMs).toBeLessThanOrEqual(pace * baseMs * (1 + 1e-9));
          // And the tile is the largest that fits: one more row would exceed it (or it is the maximum).
          if (t < 4096) expect(baseMs + (t + 1) * rowMs).toBeGreaterThan(pace * baseMs * (1 - 1e-9));
        },
      ),
    );
  });

  it("never grows the tile by more than its growth factor per mixed step, whatever the samples", () => {
    fc.assert(
      fc.property(
        fc.array(fc.record({ decodeOnly: fc.boolean(), ms: fc.double({ min: 0, max: 500, noNaN: true }) }), {
          maxLength: 80,
        }),
        (samples) => {
          const p = new PrefillPacer(1.6, 2, 256);
          let last = 2;
          for (const s of samples) {
            const t = p.tile(true);
            expect(t).toBeLessThanOrEqual(Math.max(2, Math.ceil(last * 1.25)));
            if (s.decodeOnly) p.observe(8, 0, s.ms);
            else {
              p.observe(8, t, s.ms);
              last = t;
            }
          }
        },
      ),
    );
  });

  it("refuses a pace that cannot be met and bad bounds", () => {
    expect(() => new PrefillPacer(1, 1, 8)).toThrow(/pace must be > 1/);
    expect(() => new PrefillPacer(Number.NaN, 1, 8)).toThrow(/pace/);
    expect(() => new PrefillPacer(2, 0, 8)).toThrow(/1 ≤ min ≤ max/);
    expect(() => new PrefillPacer(2, 9, 8)).toThrow(/1 ≤ min ≤ max/);
    expect(() => new PrefillPacer(2, 1, 8, 0)).toThrow(/window/);
    expect(() => new PrefillPacer(2, 1, 8, 16, 1)).toThrow(/growth/);
  });
});
