import { describe, expect, it } from "vitest";
import { type ZipfShape, zipfWorkload } from "../../bench/_cluster-workloads.ts";

const shape: ZipfShape = { tenants: 4, prompts: 6, promptTokens: 32, requests: 400, s: 0.8, thinkMs: 400 };
const VOCAB = 512;

describe("bench cluster zipf workload", () => {
  it("is the same requests, think times included, on every call (every fleet serves one workload)", () => {
    expect(zipfWorkload(shape, VOCAB)).toEqual(zipfWorkload(shape, VOCAB));
  });

  it("warms every prefix exactly once, in popularity order, so the measured phase is the steady state", () => {
    const w = zipfWorkload(shape, VOCAB);
    const key = (j: { tenant: number; prompt: number }) => `${j.tenant}/${j.prompt}`;
    expect(w.warm.map(key)).toEqual(w.ranked.map(key));
    expect(new Set(w.warm.map(key)).size).toBe(shape.tenants * shape.prompts);
    for (const j of w.warm) expect(j.thinkMs ?? 0).toBe(0);
    // Every measured prefix was warmed: its system prompt is a warm job's.
    const warmed = new Map(w.warm.map((j) => [key(j), j.tokens.slice(0, shape.promptTokens).join(",")]));
    for (const j of w.measured)
      expect(j.tokens.slice(0, shape.promptTokens).join(",")).toBe(warmed.get(key(j)));
  });

  it("pauses each measured request by a bounded exponential think time of the given mean", () => {
    const w = zipfWorkload(shape, VOCAB);
    const think = w.measured.map((j) => j.thinkMs!);
    for (const t of think) {
      expect(t).toBeGreaterThanOrEqual(0);
      expect(t).toBeLessThanOrEqual(4 * shape.thinkMs);
    }
    const mean = think.reduce((a, b) => a + b, 0) / think.length;
    // Capped at 4× the mean, the exponential's mean is (1 − e⁻⁴) × 400 ≈ 393 ms; 400 draws keep it within ±20 %.
    expect(mean).toBeGreaterThan(0.8 * shape.thinkMs);
    expect(mean).toBeLessThan(1.2 * shape.thinkMs);
  });

  it("draws the most popular prefix more often than the least (Zipf skew)", () => {
    const w = zipfWorkload(shape, VOCAB);
    const count = (p: { tenant: number; prompt: number }) =>
      w.measured.filter((j) => j.tenant === p.tenant && j.prompt === p.prompt).length;
    const head = count(w.ranked[0]!);
    const tail = count(w.ranked[w.ranked.length - 1]!);
    // Zipf(0.8) over 24: rank 1 carries 1 / H ≈ 12 % of draws, rank 24 about 1 / 24^0.8 of that (~8×).
    expect(head).toBeGreaterThan(3 * Math.max(1, tail));
  });
});
