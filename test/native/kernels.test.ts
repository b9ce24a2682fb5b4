import { afterAll, describe, expect, it } from "vitest";
import { features, kernels } from "../../native/index.ts";
import { ropeInvFreq } from "../../native/model-spec.ts";
import {
  allFinite,
  attentionRef,
  encodeWeights,
  f16BitsRef,
  f16ValueRef,
  gegluRef,
  matmulRef,
  poisoned,
  randomF32,
  relError,
  rmsnormRef,
  rng,
  ropeRef,
  sameBits,
  shuffle,
  swigluRef,
  toF16,
} from "./reference.ts";

const startIsa = kernels.isa();
afterAll(() => {
  kernels.setIsa(startIsa);
});

// Every numeric test runs on each vector path this CPU has: the portable one
// always, AVX2/FMA/F16C when cpuid reports them, and the AVX-512 column-pair
// GEMM on top of them when cpuid reports AVX-512 F and DQ.
const hasAvx2 = features.avx2 && features.fma && features.f16c;
const isas = (["generic", "avx2", "avx512"] as const).filter(
  (i) => i === "generic" || (hasAvx2 && (i === "avx2" || features.avx512)),
);

function f16Of(x: number, path: "vector" | "scalar"): number {
  const y = new Uint16Array(9);
  const xs = new Float32Array(9).fill(x); // 8 through the vector body, 1 through the tail
  if (path === "vector") kernels.f32ToF16(xs, y);
  else kernels.f32ToF16Scalar(xs, y);
  expect(y[8]).toBe(y[0]);
  return y[0]!;
}

describe.each(isas)("kernels on the %s path", (isa) => {
  it("selects the path", () => {
    expect(kernels.setIsa(isa)).toBe(true);
    expect(kernels.isa()).toBe(isa);
  });

  it("f32 -> f16 edge cases: ties to even, subnormals, overflow, inf, NaN", () => {
    kernels.setIsa(isa);
    const cases: [number, number][] = [
      [0, 0x0000],
      [-0, 0x8000],
      [1, 0x3c00],
      [-2, 0xc000],
      [65504, 0x7bff], // largest finite
      [65519.99, 0x7bff], // just below the halfway point to 2^16
      [65520, 0x7c00], // halfway: ties to even -> inf
      [1e9, 0x7c00], // overflow
      [-1e9, 0xfc00],
      [Number.POSITIVE_INFINITY, 0x7c00],
      [Number.NEGATIVE_INFINITY, 0xfc00],
      [1 + 2 ** -11, 0x3c00], // tie between 1 and 1+2^-10: even mantissa is 1
      [1 + 3 * 2 ** -11, 0x3c02], // tie between 1+2^-10 (odd) and 1+2^-9 (even)
      [1 + 2 ** -11 + 2 ** -20, 0x3c01], // just above the tie rounds up
      [2 ** -14, 0x0400], // smallest normal
      [2 ** -24, 0x0001], // smallest subnormal
      [2 ** -25, 0x0000], // tie between 0 and the smallest subnormal -> 0 (even)
      [3 * 2 ** -25, 0x0002], // tie between 1 and 2 subnormal units -> 2
      [2 ** -25 * 1.5, 0x0001], // above the tie
      [2 ** -14 - 2 ** -25, 0x0400], // the largest subnormal + half a unit rounds (to even) into the normals
      [1e-30, 0x0000], // f32 normal far below the f16 range
      [1e-45, 0x0000], // f32 subnormal
      [-1e-45, 0x8000],
    ];
    for (const path of ["vector", "scalar"] as const) {
      for (const [x, bits] of cases) {
        expect([x, path, f16Of(x, path).toString(16)]).toEqual([x, path, bits.toString(16)]);
      }
      for (const nan of [Number.NaN, -Number.NaN]) {
        const h = f16Of(nan, path);
        expect(h & 0x7c00).toBe(0x7c00);
        expect(h & 0x03ff).not.toBe(0); // still a NaN, not inf
      }
    }
  });

  it("f32 -> f16 matches the reference bit for bit on 200k random values of every magnitude", () => {
    kernels.setIsa(isa);
    const r = rng(1);
    const n = 200_000;
    const x = new Float32Array(n);
    for (let i = 0; i < n; i++) x[i] = (r() < 0.5 ? -1 : 1) * 2 ** (r() * 50 - 30) * (1 + r());
    const v = new Uint16Array(n);
    const s = new Uint16Array(n);
    kernels.f32ToF16(x, v);
    kernels.f32ToF16Scalar(x, s);
    const want = toF16(x);
    let bad = 0;
    for (let i = 0; i < n; i++) if (v[i] !== want[i] || s[i] !== want[i]) bad++;
    expect(bad).toBe(0);
  });

  it("f16 and bf16 -> f32 are exact for every bit pattern", () => {
    kernels.setIsa(isa);
    const all = new Uint16Array(65536).map((_, i) => i);
    const got = new Float32Array(65536);
    kernels.f16ToF32(all, got);
    const wrong: number[] = [];
    for (let i = 0; i < 65536; i++) {
      const want = f16ValueRef(i);
      const ok = Number.isNaN(want)
        ? Number.isNaN(got[i]!)
        : Object.is(got[i], want === 0 && i & 0x8000 ? -0 : want);
      if (!ok) wrong.push(i);
    }
    expect(wrong).toEqual([]);
    const b = new Float32Array(65536);
    kernels.bf16ToF32(all, b);
    const dv = new DataView(new ArrayBuffer(4));
    for (let i = 0; i < 65536; i += 97) {
      dv.setUint32(0, i << 16);
      const want = dv.getFloat32(0);
      expect(Number.isNaN(want) ? Number.isNaN(b[i]!) : Object.is(b[i], want)).toBe(true);
    }
  });

  it("routed append writes each row, rounded to f16, to its own slot and nothing else", () => {
    kernels.setIsa(isa);
    const r = rng(2);
    const rowElems = 2 * 12; // n_kv 2, head_dim 12 (not a multiple of 8: exercises the tail)
    const numSlots = 40;
    const B = 17;
    const slots = Int32Array.from(shuffle(r, [...Array(numSlots).keys()]).slice(0, B));
    const rows = randomF32(r, B * rowElems, 3);
    const POISON = 0x7e01;
    const pages = new Uint16Array(numSlots * rowElems).fill(POISON);
    kernels.routedAppend(rows, slots, rowElems, pages);
    const written = new Set(slots);
    for (let s = 0; s < numSlots; s++) {
      const b = slots.indexOf(s);
      for (let i = 0; i < rowElems; i++) {
        const got = pages[s * rowElems + i];
        if (written.has(s)) expect(got).toBe(f16BitsRef(rows[b * rowElems + i]!));
        else expect(got).toBe(POISON);
      }
    }
  });

  it("routed append refuses an out-of-range or duplicate slot and writes nothing", () => {
    kernels.setIsa(isa);
    const pages = new Uint16Array(4 * 8).fill(7);
    const rows = new Float32Array(2 * 8).fill(1);
    expect(() => kernels.routedAppend(rows, Int32Array.from([1, 1]), 8, pages)).toThrow(/duplicate/);
    expect(() => kernels.routedAppend(rows, Int32Array.from([0, 4]), 8, pages)).toThrow(/out of range/);
    expect(() => kernels.routedAppend(rows, Int32Array.from([-1, 2]), 8, pages)).toThrow(/out of range/);
    expect(pages.every((v) => v === 7)).toBe(true);
  });

  it.each(["f32", "f16", "bf16"] as const)(
    "matmul with %s weights matches float64 and writes every output",
    (dtype) => {
      kernels.setIsa(isa);
      const r = rng(3);
      for (const [T, K, N] of [
        [1, 64, 50],
        [3, 7, 5],
        [5, 130, 97],
        [17, 96, 49],
        [4, 256, 1],
      ] as const) {
        const x = randomF32(r, T * K);
        const { bytes, decoded } = encodeWeights(randomF32(r, N * K), dtype);
        const bias = r() < 0.5 ? randomF32(r, N) : null;
        const y = poisoned(T * N);
        kernels.matmul(x, T, K, bytes, dtype, N, bias, y);
        expect(allFinite(y)).toBe(true);
        expect(relError(y, matmulRef(x, T, K, decoded, N, bias ?? undefined))).toBeLessThan(1e-5);
      }
    },
  );

  it("rmsnorm, rope (Llama-3 frequencies, long positions), swiglu and embed match float64", () => {
    kernels.setIsa(isa);
    const r = rng(4);
    const T = 6;
    const D = 72;
    const x = randomF32(r, T * D, 4);
    const w = encodeWeights(randomF32(r, D, 2), "bf16");
    const y = poisoned(T * D);
    kernels.rmsnorm(x, w.bytes, "bf16", T, D, 1e-5, y);
    expect(allFinite(y)).toBe(true);
    expect(relError(y, rmsnormRef(x, w.decoded, T, D, 1e-5))).toBeLessThan(1e-6);

    const H = 3;
    const hd = 64;
    const inv = ropeInvFreq({
      headDim: hd,
      ropeTheta: 500000,
      ropeScaling: {
        factor: 8,
        low_freq_factor: 1,
        high_freq_factor: 4,
        original_max_position_embeddings: 8192,
      },
    });
    const pos = Int32Array.from([0, 1, 17, 1000, 65535, 131071]);
    const q = randomF32(r, T * H * hd);
    const q0 = Float32Array.from(q);
    kernels.rope(q, T, H, hd, pos, inv);
    expect(relError(q, ropeRef(q0, T, H, hd, pos, inv))).toBeLessThan(1e-6);

    const g = randomF32(r, 1000, 12);
    const u = randomF32(r, 1000, 3);
    const o = poisoned(1000);
    kernels.swiglu(g, u, o);
    expect(allFinite(o)).toBe(true);
    expect(relError(o, swigluRef(g, u))).toBeLessThan(1e-6);

    const vocab = 11;
    const table = encodeWeights(randomF32(r, vocab * D), "f16");
    const ids = Int32Array.from([3, 0, 10, 3]);
    const e = poisoned(ids.length * D);
    kernels.embed(ids, table.bytes, "f16", D, e);
    ids.forEach((id, t) => {
      for (let i = 0; i < D; i++) expect(e[t * D + i]).toBe(table.decoded[id * D + i]);
    });
    expect(() => kernels.embed(Int32Array.from([vocab]), table.bytes, "f16", D, poisoned(D))).toThrow(
      /vocabulary/,
    );
  });
});

/**
 * A paged K/V layout and the same keys in a contiguous cache: S sequences of
 * given lengths, pages handed out shuffled from a pool with spare pages so
 * tables are fragmented and out of order.
 */
/** Paged-attention shape arguments for one row (sequence 0) of one head, head_dim 8, 4-token pages of `fx`. */
function oneHeadRow(fx: { readonly ptStride: number }, q: Float32Array, scale: number) {
  return {
    q,
    rowSeq: Int32Array.from([0]),
    T: 1,
    nHeads: 1,
    nKv: 1,
    headDim: 8,
    pageSize: 4,
    ptStride: fx.ptStride,
    scale,
  };
}

function kvFixture(
  seed: number,
  lens: number[],
  nKv: number,
  headDim: number,
  vHeadDim: number,
  pageSize: number,
) {
  const r = rng(seed);
  const ctxCap = Math.max(...lens);
  const ptStride = Math.ceil(ctxCap / pageSize);
  const numPages = lens.reduce((a, l) => a + Math.ceil(l / pageSize), 0) + 9;
  const free = shuffle(r, [...Array(numPages).keys()]);
  const pageTable = new Int32Array(lens.length * ptStride).fill(-1);
  lens.forEach((len, s) => {
    for (let i = 0; i < Math.ceil(len / pageSize); i++) pageTable[s * ptStride + i] = free.pop()!;
  });
  const kRow = nKv * headDim;
  const vRow = nKv * vHeadDim;
  const kPages = new Uint16Array(numPages * pageSize * kRow);
  const vPages = new Uint16Array(numPages * pageSize * vRow);
  const k = new Uint16Array(lens.length * ctxCap * kRow);
  const v = new Uint16Array(lens.length * ctxCap * vRow);
  lens.forEach((len, s) => {
    for (let j = 0; j < len; j++) {
      const slot = pageTable[s * ptStride + Math.floor(j / pageSize)]! * pageSize + (j % pageSize);
      const kr = toF16(randomF32(r, kRow, 2));
      const vr = toF16(randomF32(r, vRow, 2));
      kPages.set(kr, slot * kRow);
      vPages.set(vr, slot * vRow);
      k.set(kr, (s * ctxCap + j) * kRow);
      v.set(vr, (s * ctxCap + j) * vRow);
    }
  });
  return { pageTable, ptStride, kPages, vPages, k, v, ctxCap, numPages };
}

function runBoth(
  fx: ReturnType<typeof kvFixture>,
  q: Float32Array,
  rowSeq: Int32Array,
  rowPos: Int32Array,
  nHeads: number,
  nKv: number,
  headDim: number,
  vHeadDim: number,
  pageSize: number,
  window = 0,
  softcap = 0,
) {
  const T = rowSeq.length;
  const scale = 1 / Math.sqrt(headDim);
  const paged = poisoned(T * nHeads * vHeadDim);
  kernels.pagedAttention({
    q,
    kPages: fx.kPages,
    vPages: fx.vPages,
    pageTable: fx.pageTable,
    rowSeq,
    rowPos,
    out: paged,
    T,
    nHeads,
    nKv,
    headDim,
    vHeadDim,
    pageSize,
    ptStride: fx.ptStride,
    scale,
    window,
    softcap,
  });
  const contiguous = poisoned(T * nHeads * vHeadDim);
  kernels.contiguousAttention({
    q,
    k: fx.k,
    v: fx.v,
    rowSeq,
    rowPos,
    out: contiguous,
    T,
    nHeads,
    nKv,
    headDim,
    vHeadDim,
    ctxCap: fx.ctxCap,
    scale,
    window,
    softcap,
  });
  return { paged, contiguous, scale };
}

interface AttentionShape {
  nHeads: number;
  nKv: number;
  headDim: number;
  vHeadDim: number;
  pageSize: number;
  /** Sliding window (0 or absent: global). */
  window?: number;
  /** Score soft-cap (0 or absent: none). */
  softcap?: number;
}

/** Runs both layouts; paged is finite and equals contiguous bit for bit. */
function expectPagedEqualsContiguous(
  fx: ReturnType<typeof kvFixture>,
  q: Float32Array,
  rowSeq: Int32Array,
  rowPos: Int32Array,
  c: AttentionShape,
): { paged: Float32Array; scale: number } {
  const { paged, contiguous, scale } = runBoth(
    fx,
    q,
    rowSeq,
    rowPos,
    c.nHeads,
    c.nKv,
    c.headDim,
    c.vHeadDim,
    c.pageSize,
    c.window,
    c.softcap,
  );
  expect(allFinite(paged)).toBe(true);
  expect(sameBits(paged, contiguous)).toBe(true);
  return { paged, scale };
}

/** Paged attention over the fixture is finite, equals contiguous bit for bit, and matches float64 within 1e-5. */
function expectPagedEqualsContiguousAndRef(
  fx: ReturnType<typeof kvFixture>,
  q: Float32Array,
  rowSeq: Int32Array,
  rowPos: Int32Array,
  c: AttentionShape,
): void {
  const T = rowSeq.length;
  const { paged, scale } = expectPagedEqualsContiguous(fx, q, rowSeq, rowPos, c);
  const kRow = c.nKv * c.headDim;
  const vRow = c.nKv * c.vHeadDim;
  const ref = attentionRef(
    q,
    T,
    c.nHeads,
    c.nKv,
    c.headDim,
    c.vHeadDim,
    rowPos,
    (t, j, kvh, d) => f16ValueRef(fx.k[(rowSeq[t]! * fx.ctxCap + j) * kRow + kvh * c.headDim + d]!),
    (t, j, kvh, d) => f16ValueRef(fx.v[(rowSeq[t]! * fx.ctxCap + j) * vRow + kvh * c.vHeadDim + d]!),
    scale,
    c.window,
    c.softcap,
  );
  expect(relError(paged, ref)).toBeLessThan(1e-5);
}

describe.each(isas)("attention on the %s path", (isa) => {
  it.each([
    { nHeads: 8, nKv: 2, headDim: 40, vHeadDim: 40, pageSize: 4 },
    { nHeads: 6, nKv: 6, headDim: 16, vHeadDim: 24, pageSize: 3 },
    { nHeads: 8, nKv: 1, headDim: 64, vHeadDim: 64, pageSize: 16 },
    { nHeads: 14, nKv: 2, headDim: 72, vHeadDim: 100, pageSize: 5 },
    { nHeads: 12, nKv: 2, headDim: 136, vHeadDim: 56, pageSize: 7 },
  ])("paged over shuffled fragmented pages == contiguous, bit for bit, and matches float64 (%o)", (c) => {
    kernels.setIsa(isa);
    const r = rng(5);
    const lens = [13, 30, 7];
    const fx = kvFixture(6, lens, c.nKv, c.headDim, c.vHeadDim, c.pageSize);
    // Decode rows (the last key of each sequence) and a causal prefill run
    // of sequence 1 (positions 20..29, each seeing only keys up to itself).
    const rowSeq = Int32Array.from([0, 2, ...Array(10).fill(1), 1]);
    const rowPos = Int32Array.from([12, 6, ...Array.from({ length: 10 }, (_, i) => 20 + i), 0]);
    const T = rowSeq.length;
    const q = randomF32(r, T * c.nHeads * c.headDim);
    expectPagedEqualsContiguousAndRef(fx, q, rowSeq, rowPos, c);
  });

  it.each([
    { nHeads: 4, nKv: 1, headDim: 32, vHeadDim: 32, pageSize: 64 },
    { nHeads: 6, nKv: 3, headDim: 24, vHeadDim: 40, pageSize: 9 },
  ])("long contexts (pages and runs of many keys): paged == contiguous and matches float64 (%o)", (c) => {
    kernels.setIsa(isa);
    const r = rng(12);
    const lens = [300, 141];
    const fx = kvFixture(13, lens, c.nKv, c.headDim, c.vHeadDim, c.pageSize);
    const rowSeq = Int32Array.from([0, 1, 0, 1]);
    const rowPos = Int32Array.from([299, 140, 64, 33]);
    const T = rowSeq.length;
    // Scores of a few units, so the softmax weights span many orders of magnitude.
    const q = randomF32(r, T * c.nHeads * c.headDim, 4);
    expectPagedEqualsContiguousAndRef(fx, q, rowSeq, rowPos, c);
  });

  it.each([
    { nHeads: 4, nKv: 1, headDim: 32, vHeadDim: 32, pageSize: 16, window: 24 },
    { nHeads: 6, nKv: 3, headDim: 24, vHeadDim: 40, pageSize: 9, window: 5 },
    { nHeads: 8, nKv: 2, headDim: 40, vHeadDim: 40, pageSize: 4, window: 1 },
    { nHeads: 4, nKv: 2, headDim: 16, vHeadDim: 16, pageSize: 8, window: 1000 },
    { nHeads: 8, nKv: 4, headDim: 64, vHeadDim: 64, pageSize: 16, softcap: 2.5 },
    { nHeads: 6, nKv: 2, headDim: 48, vHeadDim: 48, pageSize: 7, window: 33, softcap: 4 },
  ])("sliding windows and soft-capped scores: paged == contiguous bit for bit, and float64 (%o)", (c) => {
    kernels.setIsa(isa);
    const r = rng(21);
    const lens = [300, 141, 20];
    const fx = kvFixture(22, lens, c.nKv, c.headDim, c.vHeadDim, c.pageSize);
    // Rows whose window starts at 0, mid-page, on a page boundary, and a prefill run.
    const rowSeq = Int32Array.from([0, 1, 0, 2, ...Array(8).fill(0)]);
    const rowPos = Int32Array.from([299, 140, 3, 19, ...Array.from({ length: 8 }, (_, i) => 200 + i)]);
    const q = randomF32(r, rowSeq.length * c.nHeads * c.headDim, 4);
    expectPagedEqualsContiguousAndRef(fx, q, rowSeq, rowPos, c);
  });

  it("a sliding row reads nothing before its window: keys there may be anything, even NaN", () => {
    kernels.setIsa(isa);
    const c = { nHeads: 2, nKv: 1, headDim: 16, vHeadDim: 16, pageSize: 4, window: 6 };
    const fx = kvFixture(23, [40], c.nKv, c.headDim, c.vHeadDim, c.pageSize);
    const q = randomF32(rng(24), c.nHeads * c.headDim);
    const rowSeq = Int32Array.from([0]);
    const rowPos = Int32Array.from([39]);
    const before = expectPagedEqualsContiguous(fx, q, rowSeq, rowPos, c).paged;
    // Poison keys and values 0..33 (the window is 34..39) in both layouts.
    for (let j = 0; j < 34; j++) {
      const slot = fx.pageTable[Math.floor(j / 4)]! * 4 + (j % 4);
      fx.kPages.fill(0x7e00, slot * 16, (slot + 1) * 16);
      fx.vPages.fill(0x7e00, slot * 16, (slot + 1) * 16);
      fx.k.fill(0x7e00, j * 16, (j + 1) * 16);
      fx.v.fill(0x7e00, j * 16, (j + 1) * 16);
    }
    expect(sameBits(expectPagedEqualsContiguous(fx, q, rowSeq, rowPos, c).paged, before)).toBe(true);
    // A global row does read them.
    expect(allFinite(runBoth(fx, q, rowSeq, rowPos, 2, 1, 16, 16, 4).paged)).toBe(false);
  });

  it("geglu matches float64, and the soft-cap is cap · tanh(x / cap)", () => {
    kernels.setIsa(isa);
    const r = rng(25);
    const g = randomF32(r, 1001, 12);
    const u = randomF32(r, 1001, 3);
    const o = poisoned(1001);
    kernels.geglu(g, u, o);
    expect(allFinite(o)).toBe(true);
    expect(relError(o, gegluRef(g, u))).toBeLessThan(1e-6);
    const x = randomF32(r, 1000, 200);
    x.set([0, -0, 1e-30, -1e-30, 1e30, -1e30, Number.POSITIVE_INFINITY]);
    const capped = Float32Array.from(x);
    kernels.softcap(capped, 30);
    for (let i = 0; i < x.length; i++)
      expect(Math.abs(capped[i]! - 30 * Math.tanh(x[i]! / 30))).toBeLessThan(5e-6);
    expect([capped[4], capped[5], capped[6]]).toEqual([30, -30, 30]);
    const nan = Float32Array.from([Number.NaN]);
    kernels.softcap(nan, 30);
    expect(Number.isNaN(nan[0]!)).toBe(true);
    expect(() => kernels.softcap(capped, 0)).toThrow(/cap must be > 0/);
  });

  it("the softmax exp is within 2 ulp of e^x on [ln FLT_MIN, 0], exactly 1 at 0, and keeps NaN", () => {
    kernels.setIsa(isa);
    const n = 1 << 20;
    const x = new Float32Array(n);
    const lo = Math.log(2 ** -126) + 1e-3; // just inside the normal range, after rounding to f32
    for (let i = 0; i < n; i++) x[i] = lo * (i / (n - 1));
    const y = poisoned(n);
    kernels.attentionExp(x, y);
    const f = new Float32Array(1);
    const u = new Uint32Array(f.buffer);
    // The spacing of f32 values at |v| (normal v): 2^(exponent - 23).
    const ulp = (v: number) => {
      f[0] = Math.abs(v);
      return 2 ** (((u[0]! >>> 23) & 0xff) - 127 - 23);
    };
    let worst = 0;
    for (let i = 0; i < n; i++) {
      const want = Math.exp(x[i]!);
      worst = Math.max(worst, Math.abs(y[i]! - want) / ulp(want));
    }
    expect(worst).toBeLessThanOrEqual(2);
    const edge = Float32Array.from([0, -0, Number.NaN, Number.NEGATIVE_INFINITY, -200]);
    const out = poisoned(edge.length);
    kernels.attentionExp(edge, out);
    expect([out[0], out[1]]).toEqual([1, 1]);
    expect(Number.isNaN(out[2]!)).toBe(true);
    expect(out[3]).toBe(0);
    // Below ln FLT_MIN: 0 on the vector paths, a subnormal or 0 from std::exp.
    expect(out[4]!).toBeLessThan(2 ** -126);
    expect(out[4]!).toBeGreaterThanOrEqual(0);
  });

  it("refuses page ids and positions outside the pool or table", () => {
    kernels.setIsa(isa);
    const fx = kvFixture(7, [5], 1, 8, 8, 4);
    const bad = Int32Array.from(fx.pageTable);
    bad[1] = fx.numPages;
    const out = poisoned(8);
    const base = { ...oneHeadRow(fx, randomF32(rng(1), 8), 1), kPages: fx.kPages, vPages: fx.vPages, out };
    expect(() => kernels.pagedAttention({ ...base, pageTable: bad, rowPos: Int32Array.from([4]) })).toThrow(
      /page id/,
    );
    expect(() =>
      kernels.pagedAttention({ ...base, pageTable: fx.pageTable, rowPos: Int32Array.from([8]) }),
    ).toThrow(/out of range/);
    expect(out.every(Number.isNaN)).toBe(true);
  });
});

describe.each(isas)("determinism on the %s path: a row's bits do not depend on its batch", (isa) => {
  // f16/bf16 weights take a different inner loop once a batch has 8+ rows
  // (widened to f32 once per column triplet), so every dtype is checked.
  it.each(["f16", "bf16", "f32"] as const)(
    "matmul with %s weights: one row alone and inside batches of 2..16 random neighbours, on 1 and 2 threads",
    (dtype) => {
      kernels.setIsa(isa);
      const r = rng(8);
      const K = 203;
      const N = 101;
      const w = encodeWeights(randomF32(r, N * K), dtype).bytes;
      const bias = randomF32(r, N);
      const row = randomF32(r, K);
      const alone = poisoned(N);
      kernels.matmul(row, 1, K, w, dtype, N, bias, alone);
      const threads = kernels.threads();
      try {
        for (const nThreads of [1, 2]) {
          kernels.setThreads(nThreads);
          for (let B = 2; B <= 16; B++) {
            const at = Math.floor(r() * B);
            const x = randomF32(r, B * K, 5);
            x.set(row, at * K);
            const y = poisoned(B * N);
            kernels.matmul(x, B, K, w, dtype, N, bias, y);
            expect(allFinite(y)).toBe(true);
            expect(sameBits(y.subarray(at * N, (at + 1) * N), alone)).toBe(true);
          }
        }
      } finally {
        kernels.setThreads(threads);
      }
    },
  );

  it("attention: one decode row alone and inside batches of 2..16 random rows", () => {
    kernels.setIsa(isa);
    const r = rng(9);
    const nHeads = 4;
    const nKv = 2;
    const hd = 32;
    const lens = [40, 17, 25, 9];
    const fx = kvFixture(10, lens, nKv, hd, hd, 8);
    const q0 = randomF32(r, nHeads * hd);
    const alone = runBoth(fx, q0, Int32Array.from([1]), Int32Array.from([16]), nHeads, nKv, hd, hd, 8).paged;
    for (let B = 2; B <= 16; B++) {
      const at = Math.floor(r() * B);
      const rowSeq = new Int32Array(B);
      const rowPos = new Int32Array(B);
      for (let t = 0; t < B; t++) {
        rowSeq[t] = Math.floor(r() * lens.length);
        rowPos[t] = Math.floor(r() * lens[rowSeq[t]!]!);
      }
      rowSeq[at] = 1;
      rowPos[at] = 16;
      const q = randomF32(r, B * nHeads * hd);
      q.set(q0, at * nHeads * hd);
      const { paged } = runBoth(fx, q, rowSeq, rowPos, nHeads, nKv, hd, hd, 8);
      expect(sameBits(paged.subarray(at * nHeads * hd, (at + 1) * nHeads * hd), alone)).toBe(true);
    }
  });
});

describe("poolF16: engine pool memory for the benchmarks", () => {
  it("is zeroed, as long as asked, writable, and usable by the attention kernels", () => {
    const a = kernels.poolF16(3 * 1024 * 1024 + 5); // past 2 MiB pages, and not a whole number of them
    expect(a).toBeInstanceOf(Uint16Array);
    expect(a.length).toBe(3 * 1024 * 1024 + 5);
    expect(a.every((x) => x === 0)).toBe(true);
    a[a.length - 1] = 0x3c00;
    expect(a[a.length - 1]).toBe(0x3c00);
    const fx = kvFixture(3, [9], 1, 8, 8, 4);
    const kPages = kernels.poolF16(fx.kPages.length);
    const vPages = kernels.poolF16(fx.vPages.length);
    kPages.set(fx.kPages);
    vPages.set(fx.vPages);
    const args = {
      ...oneHeadRow(fx, randomF32(rng(2), 8), 0.5),
      pageTable: fx.pageTable,
      rowPos: Int32Array.from([8]),
    };
    const onPool = poisoned(8);
    const onArray = poisoned(8);
    kernels.pagedAttention({ ...args, kPages, vPages, out: onPool });
    kernels.pagedAttention({ ...args, kPages: fx.kPages, vPages: fx.vPages, out: onArray });
    expect(allFinite(onPool)).toBe(true);
    expect(sameBits(onPool, onArray)).toBe(true);
  });

  it("refuses a length that is not a positive integer", () => {
    for (const bad of [0, -1, 1.5, Number.NaN, 2 ** 41])
      expect(() => kernels.poolF16(bad)).toThrow(/poolF16: elems must be an integer/);
    expect(() => kernels.poolF16("8" as unknown as number)).toThrow(/poolF16: elems must be a number/);
  });
});

describe("Llama-3 rotary frequencies", () => {
  it("keep high frequencies, divide low ones by the factor, and blend in between", () => {
    const base = ropeInvFreq({ headDim: 128, ropeTheta: 500000 });
    const sc = { factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 };
    const scaled = ropeInvFreq({ headDim: 128, ropeTheta: 500000, ropeScaling: sc });
    expect(base[1]).toBe(Math.fround(500000 ** (-2 / 128)));
    let kept = 0;
    let divided = 0;
    let blended = 0;
    for (let i = 0; i < 64; i++) {
      const wavelen = (2 * Math.PI) / base[i]!;
      if (wavelen < 8192 / 4) {
        expect(scaled[i]).toBe(base[i]);
        kept++;
      } else if (wavelen > 8192) {
        expect(scaled[i]).toBe(Math.fround(base[i]! / 8));
        divided++;
      } else {
        expect(scaled[i]!).toBeLessThan(base[i]!);
        expect(scaled[i]!).toBeGreaterThan(base[i]! / 8);
        blended++;
      }
    }
    expect(kept > 0 && divided > 0 && blended > 0).toBe(true);
  });
});

describe.runIf(isas.includes("avx512"))("the avx512 path is the avx2 arithmetic", () => {
  it.each([
    { nHeads: 32, nKv: 8, headDim: 128, vHeadDim: 128, pageSize: 16 },
    { nHeads: 7, nKv: 7, headDim: 40, vHeadDim: 24, pageSize: 3 },
    { nHeads: 6, nKv: 3, headDim: 64, vHeadDim: 72, pageSize: 8 },
    { nHeads: 9, nKv: 3, headDim: 20, vHeadDim: 100, pageSize: 5 },
    { nHeads: 14, nKv: 2, headDim: 136, vHeadDim: 136, pageSize: 64 },
    { nHeads: 10, nKv: 2, headDim: 96, vHeadDim: 48, pageSize: 13 },
  ])(
    "attention gives the same bits on both paths: head groups 1..7 (and 4 + rest), key pairs and single keys, lane tails (%o)",
    (c) => {
      const r = rng(14);
      const lens = [77, 41, 130];
      const fx = kvFixture(15, lens, c.nKv, c.headDim, c.vHeadDim, c.pageSize);
      const rowSeq = Int32Array.from([0, 1, 2, 2, 2, 0]);
      const rowPos = Int32Array.from([76, 40, 0, 1, 129, 12]);
      const q = randomF32(r, rowSeq.length * c.nHeads * c.headDim, 2);
      try {
        const on = (isa: "avx2" | "avx512") => {
          kernels.setIsa(isa);
          return expectPagedEqualsContiguous(fx, q, rowSeq, rowPos, c).paged;
        };
        expect(sameBits(on("avx512"), on("avx2"))).toBe(true);
      } finally {
        kernels.setIsa(startIsa);
      }
    },
  );

  it.each(["f16", "bf16", "f32"] as const)(
    "matmul with %s weights gives the same bits on both paths (row pairs, column pairs, leftover columns and rows)",
    (dtype) => {
      const r = rng(11);
      try {
        // Row pairs take whole 16-row blocks and walk K in blocks of 256
        // (K = 600: two full blocks and a short one; K % 8 == 0 takes the
        // vector horizontal sums, K = 203 the scalar tail).
        for (const [T, K, N] of [
          [16, 203, 101],
          [13, 64, 50],
          [8, 7, 6],
          [24, 130, 97],
          [32, 600, 100],
          [35, 264, 53],
        ] as const) {
          const x = randomF32(r, T * K);
          const w = encodeWeights(randomF32(r, N * K), dtype).bytes;
          const bias = randomF32(r, N);
          const on = (isa: "avx2" | "avx512") => {
            kernels.setIsa(isa);
            const y = poisoned(T * N);
            kernels.matmul(x, T, K, w, dtype, N, bias, y);
            expect(allFinite(y)).toBe(true);
            return y;
          };
          expect(sameBits(on("avx512"), on("avx2"))).toBe(true);
        }
      } finally {
        kernels.setIsa(startIsa);
      }
    },
  );
});

describe.runIf(hasAvx2)("the MLP activations and the soft-cap: the same bits on every path", () => {
  it("swiglu, geglu and softcap on the portable path equal the AVX2 path bit for bit", () => {
    const r = rng(26);
    // Ordinary values, the exp's clamps (|g| large), and a length with a scalar tail.
    const g = randomF32(r, 4099, 20);
    g.set([0, -0, 150, -150, 1e20, -1e20, 1e-30]);
    const u = randomF32(r, 4099, 3);
    try {
      const on = (isa: "generic" | "avx2") => {
        kernels.setIsa(isa);
        const s = poisoned(g.length);
        const e = poisoned(g.length);
        kernels.swiglu(g, u, s);
        kernels.geglu(g, u, e);
        const c = Float32Array.from(g);
        kernels.softcap(c, 7.5);
        return [s, e, c] as const;
      };
      const a = on("generic");
      const b = on("avx2");
      for (let i = 0; i < 3; i++) expect(sameBits(a[i]!, b[i]!)).toBe(true);
    } finally {
      kernels.setIsa(startIsa);
    }
  });
});
