import { dequantize, isQuantType, type QuantType } from "./quant.ts";

/**
 * Element types of checkpoint tensors and the conversions between them.
 *
 * Node 20 has no Float16Array, so f16 and bf16 values travel as their 16-bit
 * patterns in Uint16Arrays and are converted here. The rounding matches the
 * native kernel contract (native/src/kernels.h): f32 -> f16 and f32 -> bf16 round
 * to nearest, ties to even; overflow goes to ±inf; NaN stays a quiet NaN;
 * f16/bf16 -> f32 is exact.
 */
export type DType = "F32" | "F16" | "BF16";

/** What a weight tensor may be stored as: one value per element, or a GGUF block format (quant.ts). */
export type WeightFormat = DType | QuantType;

export const DTYPES: readonly DType[] = ["F32", "F16", "BF16"];

/** Bytes per element. */
export function dtypeBytes(dtype: DType): number {
  return dtype === "F32" ? 4 : 2;
}

export function isDType(s: unknown): s is DType {
  return s === "F32" || s === "F16" || s === "BF16";
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The f32 bit pattern of `x` after rounding it to f32. */
export function f32Bits(x: number): number {
  f32[0] = x;
  return u32[0]!;
}

export function bitsToF32(bits: number): number {
  u32[0] = bits >>> 0;
  return f32[0]!;
}

/**
 * f32 -> f16 bit pattern, round to nearest even. The input is first rounded to
 * f32 (as the engine holds it), then its 23-bit mantissa is cut to 10 bits:
 * the 13 dropped bits decide the rounding (above half rounds up; exactly half
 * rounds to the even pattern). A carry out of the mantissa bumps the exponent,
 * which is how 65520 and above become infinity.
 */
export function f32ToF16Bits(x: number): number {
  const u = f32Bits(x);
  const sign = (u >>> 16) & 0x8000;
  const exp = (u >>> 23) & 0xff;
  const mant = u & 0x7fffff;
  if (exp === 0xff) return mant === 0 ? sign | 0x7c00 : sign | 0x7e00 | (mant >>> 13);
  const e = exp - 127 + 15; // rebiased exponent
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    // Subnormal in f16: value = m * 2^(e - 25) with the implicit bit restored;
    // shift the 24-bit significand right by (14 - e) with round-to-nearest-even.
    if (e < -10) return sign;
    const m = mant | 0x800000;
    const shift = 14 - e;
    const h = m >>> shift;
    const rest = m & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    return sign | (rest > half || (rest === half && (h & 1) === 1) ? h + 1 : h);
  }
  const h = (e << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  return sign | (rest > 0x1000 || (rest === 0x1000 && (h & 1) === 1) ? h + 1 : h);
}

/** f16 bit pattern -> its exact value. */
export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 31) return mant === 0 ? sign * Number.POSITIVE_INFINITY : Number.NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** f32 -> bf16 bit pattern: the upper half of the f32 bits, round to nearest even. */
export function f32ToBf16Bits(x: number): number {
  const u = f32Bits(x);
  if ((u & 0x7f800000) === 0x7f800000 && (u & 0x7fffff) !== 0) return ((u >>> 16) | 0x40) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

export function bf16BitsToF32(h: number): number {
  return bitsToF32((h & 0xffff) << 16);
}

/** Rounds `x` to the nearest f16 value (as the fp16 KV pages hold it). */
export function roundToF16(x: number): number {
  return f16BitsToF32(f32ToF16Bits(x));
}

/**
 * Encodes f64/f32 values as little-endian bytes of `dtype`. The result is a
 * fresh Buffer of `values.length * dtypeBytes(dtype)` bytes.
 */
export function encodeValues(values: ArrayLike<number>, dtype: DType): Buffer {
  const n = values.length;
  const out = Buffer.allocUnsafe(n * dtypeBytes(dtype));
  if (dtype === "F32") {
    for (let i = 0; i < n; i++) out.writeFloatLE(values[i]!, 4 * i);
  } else {
    const conv = dtype === "F16" ? f32ToF16Bits : f32ToBf16Bits;
    for (let i = 0; i < n; i++) out.writeUInt16LE(conv(values[i]!), 2 * i);
  }
  return out;
}

/** Decodes little-endian `dtype` bytes (or whole blocks of a block format) into exact f64 values. */
export function decodeValues(bytes: Uint8Array, dtype: WeightFormat): Float64Array {
  if (isQuantType(dtype)) return dequantize(bytes, dtype);
  const size = dtypeBytes(dtype);
  if (bytes.byteLength % size !== 0)
    throw new RangeError(`${bytes.byteLength} bytes is not a whole number of ${dtype} elements`);
  const n = bytes.byteLength / size;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float64Array(n);
  if (dtype === "F32") {
    for (let i = 0; i < n; i++) out[i] = view.getFloat32(4 * i, true);
  } else {
    const conv = dtype === "F16" ? f16BitsToF32 : bf16BitsToF32;
    for (let i = 0; i < n; i++) out[i] = conv(view.getUint16(2 * i, true));
  }
  return out;
}
