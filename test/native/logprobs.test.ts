import { afterAll, describe, expect, it } from "vitest";
import { features, kernels, rowLogprobs } from "../../native/index.ts";

/**
 * The row reduction behind every log-probability (native/src/logprobs.h):
 * max, rank and top ids exact; Σ exp(x − max) (f32 exp, f64 sum in a fixed
 * lane order) within f32 rounding of the float64 sum, and the same bits on
 * every vector path.
 */

const startIsa = kernels.isa();
afterAll(() => {
  kernels.setIsa(startIsa);
});
const hasAvx2 = features.avx2 && features.fma && features.f16c;
const isas = (["generic", "avx2"] as const).filter((i) => i === "generic" || hasAvx2);

function randomRow(n: number, seed: number, scale = 8): Float32Array {
  let s = seed >>> 0;
  const row = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    row[i] = (s / 2 ** 32 - 0.5) * scale;
  }
  return row;
}

function reduce(row: Float32Array, token: number, k: number) {
  const top = new Int32Array(k);
  const out = new Float64Array(3);
  rowLogprobs(row, token, top, out);
  return { top: [...top], max: out[0]!, sum: out[1]!, rank: out[2]! };
}

/** The sampler's order, by a full comparator sort: value descending, ties by lower id. */
function refOrder(row: Float32Array): number[] {
  return Array.from(row.keys()).sort((a, b) => row[b]! - row[a]! || a - b);
}

describe.each(isas)("rowLogprobs on the %s path", (isa) => {
  it("max, rank and top ids are exact; the exp-sum is the float64 one within f32 rounding", () => {
    kernels.setIsa(isa);
    for (const n of [1, 7, 8, 9, 100, 8192, 8195]) {
      const row = randomRow(n, n);
      // Ties, to exercise the lower-id rule in the top ids and the strict rank.
      if (n > 50) row[40] = row[3]!;
      const order = refOrder(row);
      for (const k of new Set([0, 1, 5, 20, 64, 65, 200].map((k) => Math.min(k, n)))) {
        const token = n - 1;
        const r = reduce(row, token, k);
        expect(r.top).toEqual(order.slice(0, k));
        const max = row[order[0]!]!;
        expect(r.max).toBe(max);
        expect(r.rank).toBe(1 + row.filter((x) => x > row[token]!).length);
        let sum = 0;
        for (const x of row) sum += Math.exp(x - max);
        expect(Math.abs(r.sum - sum) / sum).toBeLessThan(1e-6);
      }
    }
  });

  it("−∞ entries add nothing, and an all −∞ row has max −∞ and sum 0", () => {
    kernels.setIsa(isa);
    const row = new Float32Array(19).fill(Number.NEGATIVE_INFINITY);
    expect(reduce(row, 3, 2)).toEqual({ top: [0, 1], max: Number.NEGATIVE_INFINITY, sum: 0, rank: 1 });
    row[11] = 2.5;
    row[17] = -1e30;
    const r = reduce(row, 11, 3);
    expect(r.top).toEqual([11, 17, 0]);
    expect(r.max).toBe(2.5);
    expect(r.sum).toBe(1);
    expect(r.rank).toBe(1);
  });

  it("refuses a token outside the row, a top longer than the row, a wrong out buffer", () => {
    const row = randomRow(10, 1);
    expect(() => rowLogprobs(row, 10, new Int32Array(1), new Float64Array(3))).toThrow(/token/);
    expect(() => rowLogprobs(row, 1.5, new Int32Array(1), new Float64Array(3))).toThrow(/token/);
    expect(() => rowLogprobs(row, 0, new Int32Array(11), new Float64Array(3))).toThrow(/top/);
    expect(() => rowLogprobs(row, 0, new Int32Array(1), new Float64Array(2))).toThrow(/out/);
    expect(() => rowLogprobs(new Float32Array(0), 0, new Int32Array(0), new Float64Array(3))).toThrow(/row/);
  });
});

describe("rowLogprobs is deterministic", () => {
  it("the same bits on every vector path, and wherever the row sits in a batch's buffer", () => {
    const n = 8192 + 5;
    const row = randomRow(n, 42, 20);
    const bits: string[] = [];
    for (const isa of isas) {
      kernels.setIsa(isa);
      const r = reduce(row, 17, 5);
      bits.push(Buffer.from(Float64Array.from([r.max, r.sum, r.rank, ...r.top]).buffer).toString("hex"));
      // The row as a batch's third row, at an unaligned offset.
      const batch = new Float32Array(3 * n + 1);
      batch.set(row, 2 * n + 1);
      const b = reduce(batch.subarray(2 * n + 1), 17, 5);
      bits.push(Buffer.from(Float64Array.from([b.max, b.sum, b.rank, ...b.top]).buffer).toString("hex"));
    }
    expect(new Set(bits).size).toBe(1);
  });
});
