import { describe, expect, it } from "vitest";
import { features, kernels } from "../../native/index.ts";
import type { WeightDType } from "../../native/weights.ts";
import { QUANT_BLOCKS, type QuantType, quantize } from "../../worker/model/quant.ts";

/**
 * The quantized matrix products and embedding, on every ISA this CPU has,
 * for batch sizes that take every tile shape (single rows, quads, 16-row
 * blocks and their leftovers), so a quantized model keeps the determinism
 * contract (kernels.h): a row's bits never depend on T or on the other rows.
 * Every block format takes the integer path (activations quantized to int8 blocks,
 * native/src/quant_dot.h): the same bits on every ISA, within its stated
 * bound of the float64 product.
 */
const NATIVE: Record<QuantType, WeightDType> = { Q8_0: "q8_0", Q4_0: "q4_0", Q4_K: "q4_k", Q6_K: "q6_k" };
const ISAS = ["generic", "avx2", "avx512"] as const;

function rng(seed: number) {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return (s / 2 ** 32) * 2 - 1;
  };
}

function weights(t: QuantType, N: number, K: number, seed: number) {
  const r = rng(seed);
  const values = Float32Array.from({ length: N * K }, () => r() * 0.1);
  const q = quantize(values, t);
  const wide = new Float32Array(N * K);
  kernels.dequantize(q, NATIVE[t], wide);
  return { q, f32: new Uint8Array(wide.buffer) };
}

function product(
  x: Float32Array,
  T: number,
  K: number,
  w: Uint8Array,
  dt: WeightDType,
  N: number,
  bias: Float32Array | null,
) {
  const y = new Float32Array(T * N);
  kernels.matmul(x, T, K, w, dt, N, bias, y);
  return new Uint32Array(y.buffer);
}

function withEachIsa(body: (isa: string) => void): void {
  const before = kernels.isa();
  let ran = 0;
  try {
    for (const isa of ISAS) {
      if (!kernels.setIsa(isa)) continue;
      body(isa);
      ran++;
    }
  } finally {
    kernels.setIsa(before);
  }
  expect(ran).toBeGreaterThan(0);
}

/**
 * The float64 product of x and the dequantized weights, and the bound the
 * integer path (native/src/quant_dot.h) must keep from it: each activation
 * value is rounded to a multiple of its block's d = amax / 127, so it moves
 * by at most d / 2, and y by Σ_b (d_b / 2) · Σ_{j ∈ b} |w_j|; plus the f32
 * accumulation (≤ 1e-5 relative of Σ |x_j w_j| for these K).
 */
function referenceWithBound(x: Float32Array, T: number, K: number, wide: Float32Array, N: number) {
  const y = new Float64Array(T * N);
  const bound = new Float64Array(T * N);
  for (let t = 0; t < T; t++)
    for (let n = 0; n < N; n++) {
      let s = 0;
      let abs = 0;
      let q = 0;
      for (let b = 0; b < K / 32; b++) {
        let amax = 0;
        for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(x[t * K + 32 * b + j]!));
        let wsum = 0;
        for (let j = 0; j < 32; j++) {
          const k = 32 * b + j;
          s += x[t * K + k]! * wide[n * K + k]!;
          abs += Math.abs(x[t * K + k]! * wide[n * K + k]!);
          wsum += Math.abs(wide[n * K + k]!);
        }
        q += (amax / 127 / 2) * wsum;
      }
      y[t * N + n] = s;
      bound[t * N + n] = q * (1 + 1e-6) + 1e-5 * abs + 1e-30;
    }
  return { y, bound };
}

describe("quantized matmul, integer path", () => {
  for (const t of ["Q8_0", "Q4_0", "Q6_K", "Q4_K"] as const) {
    it(`${t}: the same bits on every ISA and alone or in any batch, within the activation rounding's bound of the float64 product`, () => {
      // Q8_0/Q4_0: 10 blocks, a group of 8 and a short one; K-quants: 2 super-blocks.
      const K = QUANT_BLOCKS[t].elems === 256 ? 512 : 320;
      const N = 53; // not a multiple of any tile or work-item width
      const { q, f32 } = weights(t, N, K, 13);
      const wide = new Float32Array(f32.buffer);
      const r = rng(7);
      const TMAX = 33;
      const x = Float32Array.from({ length: TMAX * K }, (_, i) => (i % 97 === 0 ? 0 : r() * (1 + (i % 5))));
      x.fill(0, 2 * K, 2 * K + 32); // an all-zero block (d = 0)
      const bias = Float32Array.from({ length: N }, () => r() * 0.01);
      const { y: want, bound } = referenceWithBound(x, TMAX, K, wide, N);
      const byIsa = new Map<string, Uint32Array>();
      const tilesByIsa = new Map<string, string>();
      withEachIsa((isa) => {
        const all = product(x, TMAX, K, q, NATIVE[t], N, null);
        byIsa.set(isa, all);
        tilesByIsa.set(isa, kernels.int8Tiles());
        expect(kernels.int8Tiles()).toBe(isa === "avx512" ? (features.vnni ? "avx512vnni" : "avx2") : isa);
        for (const T of [1, 2, 3, 4, 5, 8, 16, 17]) {
          const xs = x.subarray(0, T * K);
          const y = product(xs, T, K, q, NATIVE[t], N, bias);
          const yf = new Float32Array(y.buffer);
          for (let i = 0; i < T * N; i++) {
            const n = i % N;
            expect(Math.abs(yf[i]! - bias[n]! - want[i]!)).toBeLessThanOrEqual(bound[i]! + 1e-6);
          }
          // Without the bias: rows [0, T) are the batch of 33's bits.
          expect(product(xs, T, K, q, NATIVE[t], N, null)).toEqual(all.subarray(0, T * N));
        }
        const alone = product(x.subarray(20 * K, 21 * K), 1, K, q, NATIVE[t], N, null);
        expect(alone).toEqual(all.subarray(20 * N, 21 * N));
      });
      const first = [...byIsa.values()][0]!;
      for (const v of byIsa.values()) expect(v).toEqual(first);
      // Where the CPU has AVX512-VNNI, the "avx512" run went through its tiles: those bits too.
      if (features.vnni) expect(tilesByIsa.get("avx512")).toBe("avx512vnni");
      // The bound is not vacuous: the rounding shows.
      const got = new Float32Array(first.buffer);
      let diff = 0;
      for (let i = 0; i < got.length; i++) diff = Math.max(diff, Math.abs(got[i]! - want[i]!));
      expect(diff).toBeGreaterThan(1e-6);
    });
  }

  it("Q8_0 weights of -128 (valid in the format) multiply exactly", () => {
    const K = 64;
    const N = 9;
    const w = new Uint8Array(N * (K / 32) * 34);
    const wide = new Float32Array(N * K);
    for (let n = 0; n < N; n++)
      for (let b = 0; b < K / 32; b++) {
        const o = (n * (K / 32) + b) * 34;
        w[o] = 0x00;
        w[o + 1] = 0x3c; // d = 1.0 (f16)
        for (let j = 0; j < 32; j++) {
          const v = (j + n) % 3 === 0 ? -128 : ((j * 7 + n) % 255) - 127;
          w[o + 2 + j] = v & 0xff;
          wide[n * K + 32 * b + j] = v;
        }
      }
    // x already on the grid (amax 127): the integer product is exact.
    const x = Float32Array.from({ length: K }, (_, i) =>
      i === 5 ? 127 : i === 37 ? -127 : ((i * 13) % 255) - 127,
    );
    withEachIsa(() => {
      const y = new Float32Array(product(x, 1, K, w, "q8_0", N, null).buffer);
      for (let n = 0; n < N; n++) {
        let s = 0;
        for (let k = 0; k < K; k++) s += x[k]! * wide[n * K + k]!;
        expect(y[n]).toBe(s);
      }
    });
  });
});

describe("quantized matmul", () => {
  it("refuses rows that are not whole blocks, and quantized norms", () => {
    const y = new Float32Array(4);
    expect(() =>
      kernels.matmul(new Float32Array(40), 1, 40, new Uint8Array(4 * 34), "q8_0", 4, null, y),
    ).toThrow(/whole number of its blocks/);
    expect(() =>
      kernels.rmsnorm(new Float32Array(32), new Uint8Array(34), "q8_0", 1, 32, 1e-5, new Float32Array(32)),
    ).toThrow(/rmsnorm: w must be/);
  });
});

describe("quantized embedding", () => {
  it("rows of a Q4_K and a Q6_K table are their dequantized values", () => {
    for (const t of ["Q4_K", "Q6_K", "Q8_0"] as const) {
      const D = 256;
      const { q, f32 } = weights(t, 10, D, 3);
      const ids = Int32Array.from([9, 0, 4, 4]);
      const out = new Float32Array(ids.length * D);
      const want = new Float32Array(ids.length * D);
      withEachIsa(() => {
        kernels.embed(ids, q, NATIVE[t], D, out);
        kernels.embed(ids, f32, "f32", D, want);
        expect(new Uint32Array(out.buffer)).toEqual(new Uint32Array(want.buffer));
      });
    }
  });
});
