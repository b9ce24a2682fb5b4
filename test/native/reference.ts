/**
 * Float64 references for the native kernels, written from the formulas in
 * native/src/kernels.h and independently of the C++ (no shared code), plus a
 * seeded generator so every test input is reproducible.
 */

/** mulberry32: a small seeded PRNG; uniform in [0, 1). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function randomF32(rand: () => number, n: number, scale = 1): Float32Array {
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = (rand() * 2 - 1) * scale;
  return out;
}

export function shuffle<T>(rand: () => number, xs: T[]): T[] {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [xs[i], xs[j]] = [xs[j]!, xs[i]!];
  }
  return xs;
}

function roundHalfEven(q: number): number {
  const f = Math.floor(q);
  const d = q - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/** IEEE binary16 bits of the f32 value x, round to nearest even (exact in f64). */
export function f16BitsRef(x: number): number {
  const v = Math.fround(x);
  if (Number.isNaN(v)) return 0x7e00;
  const sign = v < 0 || Object.is(v, -0) ? 0x8000 : 0;
  const a = Math.abs(v);
  if (a >= 65520) return sign | 0x7c00; // halfway above 65504 rounds to even: inf
  if (a < 2 ** -14) return sign | roundHalfEven(a / 2 ** -24); // may reach 0x400, the smallest normal
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e -= 1;
  if (2 ** (e + 1) <= a) e += 1;
  let r = roundHalfEven((a / 2 ** e - 1) * 1024);
  if (r === 1024) {
    r = 0;
    e += 1;
  }
  if (e + 15 >= 31) return sign | 0x7c00;
  return sign | ((e + 15) << 10) | r;
}

export function f16ValueRef(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 31) return m === 0 ? sign * Number.POSITIVE_INFINITY : Number.NaN;
  return sign * (1 + m / 1024) * 2 ** (e - 15);
}

export function bf16ValueRef(h: number): number {
  const b = new DataView(new ArrayBuffer(4));
  b.setUint32(0, h << 16);
  return b.getFloat32(0);
}

/** Encodes f32 values into storage bytes of a weight dtype, returning the bytes and the values they hold. */
export function encodeWeights(
  values: Float32Array,
  dtype: "f32" | "f16" | "bf16",
): { bytes: Uint8Array; decoded: Float64Array } {
  const decoded = new Float64Array(values.length);
  if (dtype === "f32") {
    const copy = Float32Array.from(values);
    copy.forEach((v, i) => {
      decoded[i] = v;
    });
    return { bytes: new Uint8Array(copy.buffer), decoded };
  }
  const h = new Uint16Array(values.length);
  const dv = new DataView(new ArrayBuffer(4));
  for (let i = 0; i < values.length; i++) {
    if (dtype === "f16") {
      h[i] = f16BitsRef(values[i]!);
      decoded[i] = f16ValueRef(h[i]!);
    } else {
      dv.setFloat32(0, values[i]!);
      h[i] = dv.getUint32(0) >>> 16; // truncation is fine: any bf16 value will do as a weight
      decoded[i] = bf16ValueRef(h[i]!);
    }
  }
  return { bytes: new Uint8Array(h.buffer), decoded };
}

export function toF16(values: Float32Array): Uint16Array {
  const h = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) h[i] = f16BitsRef(values[i]!);
  return h;
}

/** max |got - want| / max |want|: error relative to the output's scale. */
export function relError(got: ArrayLike<number>, want: ArrayLike<number>): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < want.length; i++) {
    num = Math.max(num, Math.abs(got[i]! - want[i]!));
    den = Math.max(den, Math.abs(want[i]!));
  }
  return den === 0 ? num : num / den;
}

export function poisoned(n: number): Float32Array {
  return new Float32Array(n).fill(Number.NaN);
}

export function allFinite(xs: ArrayLike<number>): boolean {
  for (let i = 0; i < xs.length; i++) if (!Number.isFinite(xs[i]!)) return false;
  return true;
}

export function sameBits(a: Float32Array, b: Float32Array): boolean {
  if (a.length !== b.length) return false;
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < ua.length; i++) if (ua[i] !== ub[i]) return false;
  return true;
}

// ---- math references -----------------------------------------------------------

export function matmulRef(
  x: ArrayLike<number>,
  T: number,
  K: number,
  w: ArrayLike<number>,
  N: number,
  bias?: ArrayLike<number>,
): Float64Array {
  const y = new Float64Array(T * N);
  for (let t = 0; t < T; t++) {
    for (let n = 0; n < N; n++) {
      let s = 0;
      for (let k = 0; k < K; k++) s += x[t * K + k]! * w[n * K + k]!;
      y[t * N + n] = s + (bias ? bias[n]! : 0);
    }
  }
  return y;
}

export function rmsnormRef(
  x: ArrayLike<number>,
  w: ArrayLike<number>,
  T: number,
  D: number,
  eps: number,
): Float64Array {
  const y = new Float64Array(T * D);
  for (let t = 0; t < T; t++) {
    let ss = 0;
    for (let i = 0; i < D; i++) ss += x[t * D + i]! ** 2;
    const inv = 1 / Math.sqrt(ss / D + eps);
    for (let i = 0; i < D; i++) y[t * D + i] = x[t * D + i]! * inv * w[i]!;
  }
  return y;
}

export function ropeRef(
  x: ArrayLike<number>,
  T: number,
  H: number,
  D: number,
  pos: ArrayLike<number>,
  invFreq: ArrayLike<number>,
): Float64Array {
  const y = Float64Array.from(x as ArrayLike<number>);
  const half = D / 2;
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < H; h++) {
      const o = (t * H + h) * D;
      for (let i = 0; i < half; i++) {
        const th = pos[t]! * invFreq[i]!;
        const a = x[o + i]!;
        const b = x[o + i + half]!;
        y[o + i] = a * Math.cos(th) - b * Math.sin(th);
        y[o + i + half] = b * Math.cos(th) + a * Math.sin(th);
      }
    }
  }
  return y;
}

export function swigluRef(g: ArrayLike<number>, u: ArrayLike<number>): Float64Array {
  const y = new Float64Array(g.length);
  for (let i = 0; i < g.length; i++) y[i] = (g[i]! / (1 + Math.exp(-g[i]!))) * u[i]!;
  return y;
}

/**
 * Causal attention of row t over keys 0..pos[t] of its sequence (only the
 * last `window` of them when window > 0), with K/V given as float64 accessors
 * so paged and contiguous layouts share it; scores soft-capped as
 * softcap · tanh(s / softcap) when softcap > 0.
 */
export function attentionRef(
  q: ArrayLike<number>,
  T: number,
  nHeads: number,
  nKv: number,
  headDim: number,
  vHeadDim: number,
  pos: ArrayLike<number>,
  key: (t: number, j: number, kvh: number, d: number) => number,
  value: (t: number, j: number, kvh: number, d: number) => number,
  scale: number,
  window = 0,
  softcap = 0,
): Float64Array {
  const out = new Float64Array(T * nHeads * vHeadDim);
  const G = nHeads / nKv;
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < nHeads; h++) {
      const kvh = Math.floor(h / G);
      const first = window > 0 ? Math.max(0, pos[t]! - window + 1) : 0;
      const L = pos[t]! + 1 - first;
      const s = new Float64Array(L);
      for (let j = 0; j < L; j++) {
        let d = 0;
        for (let i = 0; i < headDim; i++) d += q[(t * nHeads + h) * headDim + i]! * key(t, first + j, kvh, i);
        s[j] = softcap > 0 ? softcap * Math.tanh((d * scale) / softcap) : d * scale;
      }
      const m = Math.max(...s);
      let l = 0;
      for (let j = 0; j < L; j++) {
        s[j] = Math.exp(s[j]! - m);
        l += s[j]!;
      }
      for (let i = 0; i < vHeadDim; i++) {
        let acc = 0;
        for (let j = 0; j < L; j++) acc += s[j]! * value(t, first + j, kvh, i);
        out[(t * nHeads + h) * vHeadDim + i] = acc / l;
      }
    }
  }
  return out;
}

/** gelu_pytorch_tanh(g) · u, as transformers writes it. */
export function gegluRef(g: ArrayLike<number>, u: ArrayLike<number>): Float64Array {
  const y = new Float64Array(g.length);
  for (let i = 0; i < g.length; i++) {
    const x = g[i]!;
    y[i] = 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3))) * u[i]!;
  }
  return y;
}
