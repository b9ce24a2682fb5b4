import { describe, expect, it } from "vitest";
import { kernels } from "../../../native/index.ts";
import type { WeightDType } from "../../../native/weights.ts";
import { dequantize, QUANT_BLOCKS, type QuantType, quantize } from "../../../worker/model/quant.ts";

/**
 * Dequantization of every block type against an independent float64 decoder
 * written here from the published block layouts (ggml-common.h /
 * ggml-quants.c), bit-exact on the dequantized values: each value is the
 * f32 rounding of its exact real value (native/src/quant.h says why there is
 * at most one rounding), for the native portable and vector paths and the
 * TypeScript decoder alike.
 */

/** Decodes an IEEE binary16 bit pattern (written here, not imported). */
function half(bits: number): number {
  const s = bits & 0x8000 ? -1 : 1;
  const e = (bits >> 10) & 31;
  const m = bits & 1023;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m === 0 ? s * Number.POSITIVE_INFINITY : Number.NaN;
  return s * (1024 + m) * 2 ** (e - 25);
}

const u16 = (b: Uint8Array, o: number) => b[o]! | (b[o + 1]! << 8);
const i8 = (v: number) => (v > 127 ? v - 256 : v);

/** The reference: every block type, from its layout, values as exact reals then one f32 rounding. */
function reference(b: Uint8Array, t: QuantType): Float64Array {
  const { elems, bytes } = QUANT_BLOCKS[t];
  const out = new Float64Array((b.length / bytes) * elems);
  for (let blk = 0; blk < b.length / bytes; blk++) {
    const o = blk * bytes;
    const y = (i: number, v: number) => {
      out[blk * elems + i] = Math.fround(v);
    };
    if (t === "Q8_0") {
      // { ggml_half d; int8_t qs[32]; }  y = d * q
      for (let i = 0; i < 32; i++) y(i, half(u16(b, o)) * i8(b[o + 2 + i]!));
    } else if (t === "Q4_0") {
      // { ggml_half d; uint8_t qs[16]; }  y[j] = (qs[j] & 15 - 8) d, y[j + 16] = (qs[j] >> 4 - 8) d
      for (let j = 0; j < 16; j++) {
        y(j, ((b[o + 2 + j]! & 15) - 8) * half(u16(b, o)));
        y(j + 16, ((b[o + 2 + j]! >> 4) - 8) * half(u16(b, o)));
      }
    } else if (t === "Q4_K") {
      // { ggml_half d, dmin; uint8_t scales[12]; uint8_t qs[128]; }
      const d = half(u16(b, o));
      const dmin = half(u16(b, o + 2));
      const s = (k: number) => b[o + 4 + k]!;
      // 8 six-bit scales and mins: j < 4 from bytes j / j + 4, else split over bytes j + 4 and j - 4 / j.
      const sc = (j: number) => (j < 4 ? s(j) & 63 : (s(j + 4) & 15) | ((s(j - 4) >> 6) << 4));
      const mn = (j: number) => (j < 4 ? s(j + 4) & 63 : (s(j + 4) >> 4) | ((s(j) >> 6) << 4));
      for (let chunk = 0; chunk < 4; chunk++)
        for (let l = 0; l < 32; l++) {
          const q = b[o + 16 + 32 * chunk + l]!;
          y(64 * chunk + l, d * sc(2 * chunk) * (q & 15) - dmin * mn(2 * chunk));
          y(64 * chunk + 32 + l, d * sc(2 * chunk + 1) * (q >> 4) - dmin * mn(2 * chunk + 1));
        }
    } else {
      // { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; ggml_half d; }
      const d = half(u16(b, o + 208));
      for (let n = 0; n < 2; n++)
        for (let l = 0; l < 32; l++) {
          const ql = (k: number) => b[o + 64 * n + k]!;
          const qh = b[o + 128 + 32 * n + l]!;
          const sc = (k: number) => i8(b[o + 192 + 8 * n + k]!);
          const is = Math.floor(l / 16);
          y(128 * n + l, d * sc(is) * (((ql(l) & 15) | ((qh & 3) << 4)) - 32));
          y(128 * n + l + 32, d * sc(is + 2) * (((ql(l + 32) & 15) | (((qh >> 2) & 3) << 4)) - 32));
          y(128 * n + l + 64, d * sc(is + 4) * (((ql(l) >> 4) | (((qh >> 4) & 3) << 4)) - 32));
          y(128 * n + l + 96, d * sc(is + 6) * (((ql(l + 32) >> 4) | (((qh >> 6) & 3) << 4)) - 32));
        }
    }
  }
  return out;
}

/** Byte offsets of the f16 scale fields of one block. */
const HALVES: Record<QuantType, number[]> = { Q8_0: [0], Q4_0: [0], Q4_K: [0, 2], Q6_K: [208] };

/** Random blocks whose f16 scales are finite (normal and subnormal), every other byte random. */
function randomBlocks(t: QuantType, blocks: number, seed: number): Uint8Array {
  let s = seed >>> 0;
  const next = () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s;
  };
  const { bytes } = QUANT_BLOCKS[t];
  const b = new Uint8Array(blocks * bytes);
  for (let i = 0; i < b.length; i++) b[i] = next() >>> 24;
  for (let k = 0; k < blocks; k++)
    for (const h of HALVES[t]) {
      // exponent 0..30: subnormals, zero and normals, never inf/NaN
      const bits = ((next() >>> 16) & 0x83ff) | ((next() % 31) << 10);
      b[k * bytes + h] = bits & 0xff;
      b[k * bytes + h + 1] = bits >> 8;
    }
  return b;
}

const NATIVE: Record<QuantType, WeightDType> = { Q8_0: "q8_0", Q4_0: "q4_0", Q4_K: "q4_k", Q6_K: "q6_k" };
const TYPES: QuantType[] = ["Q8_0", "Q4_0", "Q4_K", "Q6_K"];
const ISAS = ["generic", "avx2", "avx512"] as const;

function bitsOf(values: ArrayLike<number>): Uint32Array {
  return new Uint32Array(Float32Array.from(values).buffer);
}

describe("block dequantization", () => {
  for (const t of TYPES) {
    it(`${t}: native (every ISA) and TypeScript equal the float64 decoder bit for bit`, () => {
      const blocks = 64;
      const raw = randomBlocks(t, blocks, 7 + t.length);
      const want = bitsOf(reference(raw, t));
      expect(bitsOf(dequantize(raw, t))).toEqual(want);
      const before = kernels.isa();
      try {
        let ran = 0;
        for (const isa of ISAS) {
          if (!kernels.setIsa(isa)) continue;
          const out = new Float32Array(blocks * QUANT_BLOCKS[t].elems);
          kernels.dequantize(raw, NATIVE[t], out);
          expect(new Uint32Array(out.buffer)).toEqual(want);
          ran++;
        }
        expect(ran).toBeGreaterThan(0);
      } finally {
        kernels.setIsa(before);
      }
    });
  }

  it("refuses bytes that are not whole blocks", () => {
    expect(() => kernels.dequantize(new Uint8Array(33), "q8_0", new Float32Array(32))).toThrow(
      /whole number/,
    );
    expect(() => kernels.dequantize(new Uint8Array(34), "q8_0", new Float32Array(31))).toThrow(
      /whole number/,
    );
    expect(() => dequantize(new Uint8Array(17), "Q4_0")).toThrow(/whole number of Q4_0 blocks/);
  });
});

describe("quantization", () => {
  // Per format, the worst error of a value relative to its block's largest
  // magnitude: half a step of the grid (Q8_0: 1/254; Q4_K: 1/30 of a
  // group's range ≤ 2·amax), or a whole step where the symmetric formats put
  // the largest value at −8 / −32 and clamp its opposite at +7 / +31 (Q4_0:
  // 1/8, Q6_K: 1/32), plus the scales' own rounding (f16, and the K-quants'
  // 6- or 8-bit scales of scales).
  const BOUND: Record<QuantType, number> = { Q8_0: 0.0045, Q4_0: 0.13, Q4_K: 0.09, Q6_K: 0.035 };
  for (const t of TYPES) {
    it(`${t}: round trip stays within its grid's error`, () => {
      const n = 4 * 256;
      let s = 99;
      const x = Float32Array.from({ length: n }, () => {
        s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
        return ((s / 2 ** 32) * 2 - 1) * 0.05;
      });
      const y = reference(quantize(x, t), t);
      const block = QUANT_BLOCKS[t].elems;
      for (let b = 0; b < n / block; b++) {
        let amax = 0;
        for (let i = 0; i < block; i++) amax = Math.max(amax, Math.abs(x[b * block + i]!));
        for (let i = 0; i < block; i++) {
          const k = b * block + i;
          expect(Math.abs(y[k]! - x[k]!)).toBeLessThanOrEqual(BOUND[t] * amax);
        }
      }
      expect(() => quantize(new Float32Array(block + 1), t)).toThrow(/whole number/);
    });
  }
});
