import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { Rng, seedRng } from "../../../worker/model/prng.ts";
import { PrefillPacer, type StepShape } from "../../../worker/runtime/prefill-pacer.ts";

/** A step's cost on a machine whose costs are exactly linear: weights pass, per row, per attended key. */
interface Machine {
  readonly w: number;
  readonly r: number;
  readonly a: number;
}
const cost = (m: Machine, rows: number, keys: number) => m.w + m.r * rows + m.a * keys;

/** Σ (position + 1) over T rows from position p0. */
const keysFrom = (p0: number, t: number) => t * (p0 + 1) + (t * (t - 1)) / 2;

/** D decodes at context `ctx` each (their next rows at position ctx). */
const decodes = (d: number, ctx: number) => ({ rows: d, keys: d * (ctx + 1) });

function shape(d: number, ctx: number, t: number, p0: number): StepShape {
  return { decodeRows: d, decodeKeys: d * (ctx + 1), prefillRows: t, prefillKeys: keysFrom(p0, t) };
}

/** The largest T whose step stays within pace × the decode-only step (× 1 + slack) on the machine. */
function ideal(
  m: Machine,
  pace: number,
  d: number,
  ctx: number,
  p0: number,
  cap: number,
  slack = 1e-9,
): number {
  const base = cost(m, d, d * (ctx + 1));
  let t = 0;
  while (t < cap && cost(m, d + t + 1, d * (ctx + 1) + keysFrom(p0, t + 1)) <= pace * base * (1 + slack)) t++;
  return t;
}

/**
 * A long prompt prefilled beside `d` decodes whose contexts grow one row a
 * step, each step's time `noise(i)` × its exact cost; returns every step's
 * tile, its exact cost over the decode-only step's at that moment, and the
 * ideal tile there.
 */
function longPrefill(
  p: PrefillPacer,
  m: Machine,
  d: number,
  ctx0: number,
  prompt: number,
  noise: (i: number) => number = () => 1,
) {
  let ctx = ctx0;
  // The decodes ran alone first.
  for (let i = 0; i < 8; i++, ctx++) p.observe(shape(d, ctx, 0, 0), cost(m, d, d * (ctx + 1)));
  const steps: { tile: number; ratio: number; ideal: number }[] = [];
  for (let done = 0, i = 0; done < prompt; i++, ctx++) {
    const tile = Math.min(p.tile(decodes(d, ctx), done), prompt - done);
    const s = shape(d, ctx, tile, done);
    const exact = cost(m, d + tile, s.decodeKeys + s.prefillKeys);
    steps.push({
      tile,
      ratio: exact / cost(m, d, s.decodeKeys),
      ideal: Math.min(prompt - done, ideal(m, p.pace, d, ctx, done, p.maxTile)),
    });
    p.observe(s, exact * noise(i));
    done += tile;
  }
  return steps;
}

describe("PrefillPacer", () => {
  it("does not pace when nothing decodes, and starts at the smallest tile beside decodes", () => {
    const p = new PrefillPacer(2, 4, 256);
    expect(p.tile(null, 0)).toBe(256);
    expect(p.tile(decodes(8, 100), 0)).toBe(4);
    p.observe(shape(8, 100, 0, 0), 40); // a decode-only step: no prefill row measured yet
    expect(p.tile(decodes(8, 100), 0)).toBe(4);
    expect(p.tile(null, 0)).toBe(256);
    expect(p.tile({ rows: 0, keys: 0 }, 0)).toBe(256);
  });

  it("on exactly linear costs, settles on the largest tile that keeps the step within pace × the decode-only step", () => {
    fc.assert(
      fc.property(
        fc.record({
          pace: fc.double({ min: 1.1, max: 3, noNaN: true }),
          w: fc.double({ min: 1, max: 100, noNaN: true }),
          r: fc.double({ min: 0.05, max: 20, noNaN: true }),
          a: fc.double({ min: 0, max: 0.02, noNaN: true }),
          d: fc.integer({ min: 1, max: 32 }),
          ctx: fc.integer({ min: 0, max: 4000 }),
          p0: fc.integer({ min: 0, max: 4000 }),
        }),
        ({ pace, w, r, a, d, ctx, p0 }) => {
          const m = { w, r, a };
          const p = new PrefillPacer(pace, 1, 4096);
          // Decode-only and mixed steps of varied shapes (as a run gives them).
          for (let i = 0; i < 40; i++) {
            const c = (ctx + 37 * i) % 4000;
            p.observe(shape(d, c, 0, 0), cost(m, d, d * (c + 1)));
            const t = 1 + ((7 * i) % 23);
            const s = shape(d, c, t, (p0 + 11 * i) % 4000);
            p.observe(s, cost(m, d + t, s.decodeKeys + s.prefillKeys));
          }
          // Past the growth limit (the last mixed step had 23 rows: let it grow back to the fit).
          // (A fit rounds: a row whose step lands within 10⁻⁶ of the bound may go either way.)
          const low = Math.max(1, ideal(m, pace, d, ctx, p0, 4096, -1e-6));
          const high = Math.max(1, ideal(m, pace, d, ctx, p0, 4096, 1e-6));
          let t = p.tile(decodes(d, ctx), p0);
          for (let i = 0; i < 60 && t < low; i++) {
            const s = shape(d, ctx, t, p0);
            p.observe(s, cost(m, d + t, s.decodeKeys + s.prefillKeys));
            t = p.tile(decodes(d, ctx), p0);
          }
          expect(t).toBeGreaterThanOrEqual(low);
          expect(t).toBeLessThanOrEqual(high);
        },
      ),
      { numRuns: 60 },
    );
  });

  it("follows the decodes' growing contexts: beside a long prompt every step keeps the pace and takes nearly every row it allows", () => {
    // The small preset on 2 cores, roughly: an 11 ms pass over the weights, 2 ms a row, 6 µs a key.
    const m = { w: 11, r: 2, a: 0.006 };
    const steps = longPrefill(new PrefillPacer(1.8, 1, 128), m, 8, 32, 4088);
    // A decode-only step at the end costs 4× the one measured before the prompt arrived.
    expect(cost(m, 8, 8 * (32 + steps.length))).toBeGreaterThan(3 * cost(m, 8, 8 * 33));
    for (const s of steps) expect(s.ratio).toBeLessThanOrEqual(1.8 * (1 + 1e-9));
    // Rows per step against the ideal (after the first steps' growth from the minimum).
    const late = steps.slice(30);
    const got = late.reduce((a, s) => a + s.tile, 0);
    const best = late.reduce((a, s) => a + s.ideal, 0);
    expect(got / best).toBeGreaterThan(0.98);
  });

  it("a noisy machine moves it little: stalled and early steps barely pull the fit, and the pace holds", () => {
    const m = { w: 11, r: 2, a: 0.006 };
    // ±5 % on every step, and every 50th step three times slower or twice as fast.
    const noise = (i: number) =>
      (i % 50 === 25 ? 3 : i % 50 === 49 ? 0.5 : 1) * (1 + 0.05 * Math.sin(i * 12.9898));
    const steps = longPrefill(new PrefillPacer(1.8, 1, 128), m, 8, 32, 4088, noise);
    const over = steps.filter((s) => s.ratio > 1.8 * 1.05);
    expect(over.length / steps.length).toBeLessThan(0.01);
    for (const s of steps) expect(s.ratio).toBeLessThan(1.8 * 1.1);
    const late = steps.slice(30);
    expect(late.reduce((a, s) => a + s.tile, 0) / late.reduce((a, s) => a + s.ideal, 0)).toBeGreaterThan(0.9);

    // A shared machine: every step slower by a random factor 1 + Exp(mean 0.5), seeded.
    const rng = new Rng(seedRng(5, "pacer-contention"));
    const contended = longPrefill(
      new PrefillPacer(1.8, 1, 128),
      m,
      8,
      32,
      4088,
      () => 1 - 0.5 * Math.log(1 - rng.nextFloat()),
    );
    expect(contended.filter((s) => s.ratio > 1.8 * 1.05).length / contended.length).toBeLessThan(0.01);
    for (const s of contended) expect(s.ratio).toBeLessThan(2);

    // After settling, one stalled step does not move the tile.
    const p = new PrefillPacer(1.8, 1, 128);
    longPrefill(p, m, 8, 32, 600);
    // A few exact steps at one spot, so the tile is past its growth limit.
    for (let i = 0; i < 8; i++) {
      const t = p.tile(decodes(8, 700), 600);
      const s = shape(8, 700, t, 600);
      p.observe(s, cost(m, 8 + t, s.decodeKeys + s.prefillKeys));
    }
    const t = p.tile(decodes(8, 700), 600);
    const s = shape(8, 700, t, 600);
    p.observe(s, 3 * cost(m, 8 + t, s.decodeKeys + s.prefillKeys));
    expect(p.tile(decodes(8, 700), 600)).toBe(t);
  });

  it("never grows the tile by more than its growth factor per mixed step, whatever the samples", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            decodeOnly: fc.boolean(),
            ctx: fc.integer({ min: 0, max: 4000 }),
            ms: fc.double({ min: 0, max: 500, noNaN: true }),
          }),
          { maxLength: 80 },
        ),
        (samples) => {
          const p = new PrefillPacer(1.6, 2, 256);
          let last = 2;
          for (const s of samples) {
            const t = p.tile(decodes(8, s.ctx), s.ctx);
            expect(t).toBeGreaterThanOrEqual(2);
            expect(t).toBeLessThanOrEqual(Math.max(2, Math.ceil(last * 1.25)));
            if (s.decodeOnly) p.observe(shape(8, s.ctx, 0, 0), s.ms);
            else {
              p.observe(shape(8, s.ctx, t, s.ctx), s.ms);
              last = t;
            }
            const c = p.model();
            if (c) for (const x of [c.c0, c.c1, c.c2]) expect(x).toBeGreaterThanOrEqual(0);
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
    expect(() => new PrefillPacer(2, 1, 8, 3)).toThrow(/window/);
    expect(() => new PrefillPacer(2, 1, 8, 16, 1)).toThrow(/growth/);
  });
});
