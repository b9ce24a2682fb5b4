import { f16BitsToF32, f32ToF16Bits } from "./dtype.ts";

/**
 * llama.cpp's block-quantized tensor types, byte for byte the layouts of
 * ggml-common.h (native/src/quant.h has the table and why every value is
 * exact): a row of K elements is K / block blocks.
 *
 *   Q8_0  32 elements, 34 B  { f16 d; i8 q[32] }                    x = d·q
 *   Q4_0  32 elements, 18 B  { f16 d; u8 q[16] }                    x = d·(nibble − 8)
 *   Q4_K 256 elements, 144 B { f16 d, dmin; u8 scales[12]; u8 q[128] } x = (d·sc)·q − dmin·m
 *   Q6_K 256 elements, 210 B { u8 ql[128]; u8 qh[64]; i8 sc[16]; f16 d } x = (d·sc)·(q − 32)
 *
 * Dequantization here is for the float64 reference forward and tools; the
 * engine dequantizes natively to the same values. Quantization (for
 * `continuum model quantize`) follows llama.cpp's reference rounding for
 * Q8_0 and Q4_0, and a min/max fit per group for Q4_K and Q6_K (a valid
 * block of the type; llama.cpp's own quantizer searches harder for scales).
 */
export type QuantType = "Q8_0" | "Q4_0" | "Q4_K" | "Q6_K";
export const QUANT_TYPES: readonly QuantType[] = ["Q8_0", "Q4_0", "Q4_K", "Q6_K"];

export const QUANT_BLOCKS: Readonly<Record<QuantType, { readonly elems: number; readonly bytes: number }>> = {
  Q8_0: { elems: 32, bytes: 34 },
  Q4_0: { elems: 32, bytes: 18 },
  Q4_K: { elems: 256, bytes: 144 },
  Q6_K: { elems: 256, bytes: 210 },
};

export function isQuantType(s: unknown): s is QuantType {
  return typeof s === "string" && Object.hasOwn(QUANT_BLOCKS, s);
}

/** Bytes of `elems` elements of `t` (a whole number of blocks), else null. */
export function quantBytes(t: QuantType, elems: number): number | null {
  const b = QUANT_BLOCKS[t];
  return elems % b.elems === 0 ? (elems / b.elems) * b.bytes : null;
}

const f16At = (b: Uint8Array, o: number) => f16BitsToF32(b[o]! | (b[o + 1]! << 8));

/** Q4_K's 6-bit scale and min of group g < 8 (llama.cpp's get_scale_min_k4). */
function scaleMin(s: Uint8Array, o: number, g: number): [number, number] {
  if (g < 4) return [s[o + g]! & 63, s[o + g + 4]! & 63];
  return [
    (s[o + g + 4]! & 0xf) | ((s[o + g - 4]! >> 6) << 4),
    (s[o + g + 4]! >> 4) | ((s[o + g]! >> 6) << 4),
  ];
}

/**
 * The values of `bytes` (whole blocks of `t`), as f64 holding the f32 each
 * one dequantizes to: the operations are exact in f64, and the one f32
 * rounding (Q4_K's subtraction) is applied with Math.fround.
 */
export function dequantize(bytes: Uint8Array, t: QuantType): Float64Array {
  const { elems, bytes: bb } = QUANT_BLOCKS[t];
  if (bytes.byteLength % bb !== 0)
    throw new RangeError(`${bytes.byteLength} bytes is not a whole number of ${t} blocks (${bb} bytes)`);
  const n = (bytes.byteLength / bb) * elems;
  const out = new Float64Array(n);
  for (let o = 0, e = 0; e < n; o += bb, e += elems) {
    switch (t) {
      case "Q8_0": {
        const d = f16At(bytes, o);
        for (let j = 0; j < 32; j++) out[e + j] = d * ((bytes[o + 2 + j]! << 24) >> 24);
        break;
      }
      case "Q4_0": {
        const d = f16At(bytes, o);
        for (let j = 0; j < 16; j++) {
          const q = bytes[o + 2 + j]!;
          out[e + j] = d * ((q & 0xf) - 8);
          out[e + j + 16] = d * ((q >> 4) - 8);
        }
        break;
      }
      case "Q4_K": {
        const d = f16At(bytes, o);
        const dmin = f16At(bytes, o + 2);
        for (let c = 0; c < 4; c++) {
          const [sc1, m1] = scaleMin(bytes, o + 4, 2 * c);
          const [sc2, m2] = scaleMin(bytes, o + 4, 2 * c + 1);
          for (let l = 0; l < 32; l++) {
            const q = bytes[o + 16 + 32 * c + l]!;
            out[e + 64 * c + l] = Math.fround(d * sc1 * (q & 0xf) - dmin * m1);
            out[e + 64 * c + 32 + l] = Math.fround(d * sc2 * (q >> 4) - dmin * m2);
          }
        }
        break;
      }
      case "Q6_K": {
        const d = f16At(bytes, o + 208);
        for (let h = 0; h < 2; h++) {
          const ql = o + 64 * h;
          const qh = o + 128 + 32 * h;
          const sc = o + 192 + 8 * h;
          for (let l = 0; l < 32; l++) {
            const is = l >> 4;
            const hb = bytes[qh + l]!;
            const q = [
              (bytes[ql + l]! & 0xf) | ((hb & 3) << 4),
              (bytes[ql + l + 32]! & 0xf) | (((hb >> 2) & 3) << 4),
              (bytes[ql + l]! >> 4) | (((hb >> 4) & 3) << 4),
              (bytes[ql + l + 32]! >> 4) | (((hb >> 6) & 3) << 4),
            ];
            for (let i = 0; i < 4; i++) {
              const s = (bytes[sc + is + 2 * i]! << 24) >> 24;
              out[e + 128 * h + l + 32 * i] = d * s * (q[i]! - 32);
            }
          }
        }
        break;
      }
    }
  }
  return out;
}

// ---- quantization ----------------------------------------------------------

/** round half away from zero (C's roundf / llama.cpp's nearest_int for these ranges). */
const roundAway = (x: number) => Math.sign(x) * Math.round(Math.abs(x));

function putF16(out: Uint8Array, o: number, x: number): number {
  const h = f32ToF16Bits(x);
  out[o] = h & 0xff;
  out[o + 1] = h >> 8;
  return f16BitsToF32(h);
}

/** The element of largest magnitude (the first such), with its sign. */
function signedMax(x: Float32Array, o: number, n: number): number {
  let m = 0;
  for (let i = 0; i < n; i++) if (Math.abs(x[o + i]!) > Math.abs(m)) m = x[o + i]!;
  return m;
}

function q8_0(x: Float32Array, o: number, out: Uint8Array, p: number): void {
  let amax = 0;
  for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(x[o + i]!));
  const d = Math.fround(amax / 127);
  const id = d !== 0 ? Math.fround(1 / d) : 0;
  putF16(out, p, d);
  for (let i = 0; i < 32; i++) out[p + 2 + i] = roundAway(Math.fround(x[o + i]! * id)) & 0xff;
}

function q4_0(x: Float32Array, o: number, out: Uint8Array, p: number): void {
  const d = Math.fround(signedMax(x, o, 32) / -8);
  const id = d !== 0 ? Math.fround(1 / d) : 0;
  putF16(out, p, d);
  const q = (i: number) => Math.min(15, Math.trunc(Math.fround(Math.fround(x[o + i]! * id) + 8.5)));
  for (let j = 0; j < 16; j++) out[p + 2 + j] = q(j) | (q(j + 16) << 4);
}

function q4_k(x: Float32Array, o: number, out: Uint8Array, p: number): void {
  // Per group of 32: x ≈ scale·q − min over q in 0..15 (min ≥ 0, as llama.cpp keeps it).
  const scales = new Float64Array(8);
  const mins = new Float64Array(8);
  for (let g = 0; g < 8; g++) {
    let lo = Number.POSITIVE_INFINITY;
    let hi = Number.NEGATIVE_INFINITY;
    for (let i = 0; i < 32; i++) {
      lo = Math.min(lo, x[o + 32 * g + i]!);
      hi = Math.max(hi, x[o + 32 * g + i]!);
    }
    lo = Math.min(lo, 0);
    scales[g] = (hi - lo) / 15;
    mins[g] = -lo;
  }
  const maxScale = Math.max(...scales);
  const maxMin = Math.max(...mins);
  const d = putF16(out, p, maxScale / 63);
  const dmin = putF16(out, p + 2, maxMin / 63);
  const ls = scales.map((s) => (d > 0 ? Math.min(63, roundAway(s / d)) : 0));
  const lm = mins.map((m) => (dmin > 0 ? Math.min(63, roundAway(m / dmin)) : 0));
  const sc = p + 4;
  out.fill(0, sc, sc + 12);
  for (let j = 0; j < 8; j++) {
    if (j < 4) {
      out[sc + j] = ls[j]!;
      out[sc + j + 4] = lm[j]!;
    } else {
      out[sc + j + 4] = (ls[j]! & 0xf) | ((lm[j]! & 0xf) << 4);
      out[sc + j - 4]! |= (ls[j]! >> 4) << 6;
      out[sc + j]! |= (lm[j]! >> 4) << 6;
    }
  }
  // The nibbles against the scales as stored (dequantized like the reader does).
  const q = new Uint8Array(256);
  for (let g = 0; g < 8; g++) {
    const dq = Math.fround(d * ls[g]!);
    const dm = Math.fround(dmin * lm[g]!);
    for (let i = 0; i < 32; i++)
      q[32 * g + i] = dq > 0 ? Math.max(0, Math.min(15, roundAway((x[o + 32 * g + i]! + dm) / dq))) : 0;
  }
  for (let c = 0; c < 4; c++)
    for (let l = 0; l < 32; l++) out[p + 16 + 32 * c + l] = q[64 * c + l]! | (q[64 * c + 32 + l]! << 4);
}

function q6_k(x: Float32Array, o: number, out: Uint8Array, p: number): void {
  // Per group of 16: x ≈ scale·q over q in −32..31, scale = (signed max) / −32.
  const scales = new Float64Array(16);
  for (let g = 0; g < 16; g++) scales[g] = signedMax(x, o + 16 * g, 16) / -32;
  let maxScale = 0;
  for (const s of scales) if (Math.abs(s) > Math.abs(maxScale)) maxScale = s;
  const iscale = maxScale !== 0 ? -128 / maxScale : 0;
  const d = putF16(out, p + 208, iscale !== 0 ? 1 / iscale : 0);
  const L = new Uint8Array(256);
  for (let g = 0; g < 16; g++) {
    const s = Math.max(-128, Math.min(127, roundAway(iscale * scales[g]!)));
    out[p + 192 + g] = s & 0xff;
    const dq = Math.fround(d * s);
    for (let i = 0; i < 16; i++)
      L[16 * g + i] = dq !== 0 ? Math.max(-32, Math.min(31, roundAway(x[o + 16 * g + i]! / dq))) + 32 : 32;
  }
  for (let h = 0; h < 2; h++)
    for (let l = 0; l < 32; l++) {
      const [q1, q2, q3, q4] = [
        L[128 * h + l]!,
        L[128 * h + l + 32]!,
        L[128 * h + l + 64]!,
        L[128 * h + l + 96]!,
      ];
      out[p + 64 * h + l] = (q1 & 0xf) | ((q3 & 0xf) << 4);
      out[p + 64 * h + l + 32] = (q2 & 0xf) | ((q4 & 0xf) << 4);
      out[p + 128 + 32 * h + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
    }
}

const QUANTIZERS: Record<QuantType, (x: Float32Array, o: number, out: Uint8Array, p: number) => void> = {
  Q8_0: q8_0,
  Q4_0: q4_0,
  Q4_K: q4_k,
  Q6_K: q6_k,
};

/** Quantizes `values` (rows of K elements, K a whole number of blocks) to `t`. */
export function quantize(values: Float32Array, t: QuantType): Uint8Array {
  const { elems, bytes } = QUANT_BLOCKS[t];
  if (values.length % elems !== 0)
    throw new RangeError(`${values.length} values is not a whole number of ${t} blocks (${elems})`);
  const out = new Uint8Array((values.length / elems) * bytes);
  const f = QUANTIZERS[t];
  for (let o = 0, p = 0; o < values.length; o += elems, p += bytes) f(values, o, out, p);
  return out;
}
