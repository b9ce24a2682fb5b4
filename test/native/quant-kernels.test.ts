import { describe, expect, it } from "vitest";
import { kernels, type WeightDType } from "../../native/index.ts";
import { QUANT_BLOCKS, type QuantType, quantize } from "../../worker/model/quant.ts";

/**
 * The quantized matrix products and embedding against the f32 kernels on
 * the dequantized weights: bit for bit, on every ISA this CPU has, for batch
 * sizes that take every tile shape (single rows, quads, 16-row blocks and
 * their leftovers), so a quantized model keeps the determinism contract
 * (kernels.h): a row's bits never depend on T or on the other rows.
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

describe("quantized matmul", () => {
  for (const t of ["Q8_0", "Q4_0", "Q4_K", "Q6_K"] as const) {
    it(`${t}: equals the f32 product of the dequantized weights, bit for bit, alone or in any batch`, () => {
      const K = QUANT_BLOCKS[t].elems === 256 ? 512 : 96;
      const N = 53; // not a multiple of any tile or work-item width
      const { q, f32 } = weights(t, N, K, 11);
      const r = rng(5);
      const TMAX = 33;
      const x = Float32Array.from({ length: TMAX * K }, () => r());
      const bias = Float32Array.from({ length: N }, () => r() * 0.01);
      withEachIsa(() => {
        for (const T of [1, 3, 4, 8, 16, 17, 33]) {
          const xs = x.subarray(0, T * K);
          expect(product(xs, T, K, q, NATIVE[t], N, bias)).toEqual(product(xs, T, K, f32, "f32", N, bias));
        }
        // Row 20 alone gives the bits it has in the batch of 33.
        const all = product(x, TMAX, K, q, NATIVE[t], N, null);
        const alone = product(x.subarray(20 * K, 21 * K), 1, K, q, NATIVE[t], N, null);
        expect(alone).toEqual(all.subarray(20 * N, 21 * N));
      });
    });
  }

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
