/**
 * The native addon (native/build/Release/continuum_native.node): loads it,
 * types what it exports, and offers its module-level functions. The engine
 * over it is native/engine.ts; the backends it offers, native/backends.ts.
 */
import { createRequire } from "node:module";
import type { BackendName, CudaStatus } from "./backends.ts";
import { type CpuFeatures, type CpuIsa, cpuIsaFromEnv } from "./cpu-isa.ts";
import type { ContiguousBatch, StepBatch, StepProfile } from "./engine.ts";
import type { ModelSpec } from "./model-spec.ts";
import type { WeightDType } from "./weights.ts";

/** The addon's engine object: native/engine.ts wraps it as an Engine and checks what it passes. */
export interface NativeEngine {
  loadWeights(tensors: { dtype: WeightDType; data: Uint8Array }[]): Promise<void>;
  tensorNames(): { name: string; shape: number[] }[];
  createPool(numPages: number, pageSize: number, layerGroups?: Int32Array): void;
  createContiguousCache(numSeqs: number, ctxCap: number): void;
  step(batch: StepBatch): Promise<Float32Array>;
  stepContiguous(batch: ContiguousBatch): Promise<Float32Array>;
  downloadPages(ids: Int32Array): Promise<Uint8Array>;
  uploadPages(ids: Int32Array, bytes: Uint8Array): Promise<void>;
  copyPage(src: number, dst: number): Promise<void>;
  commitPool(): Promise<void>;
  setProfiling(on: boolean): void;
  profile(): StepProfile;
  free(): void;
  readonly threads: number;
  readonly pageBytes: number;
  readonly backend: BackendName;
}

/** Synchronous single-kernel hooks on a shared thread pool: for tests and benchmarks only. */
export interface Kernels {
  setThreads(n: number): void;
  threads(): number;
  /**
   * Switches the vector path (test hook); false when the CPU lacks it.
   * "avx512" is the avx2 arithmetic bit for bit, with the batched GEMM on
   * 512-bit column pairs.
   */
  setIsa(isa: CpuIsa): boolean;
  isa(): CpuIsa;
  /** The tiles of the quantized (int8) products: the ISA's, AVX512-VNNI's dot products on "avx512" where the CPU has them. */
  int8Tiles(): "generic" | "avx2" | "avx512vnni";
  /** f32 → f16 bits through the vector path that routed append uses. */
  f32ToF16(x: Float32Array, y: Uint16Array): void;
  /** f32 → f16 bits through the scalar conversion. */
  f32ToF16Scalar(x: Float32Array, y: Uint16Array): void;
  f16ToF32(x: Uint16Array, y: Float32Array): void;
  bf16ToF32(x: Uint16Array, y: Float32Array): void;
  /** pages[slots[b]] = f16(rows[b]); pages is [numSlots, rowElems]. */
  routedAppend(rows: Float32Array, slots: Int32Array, rowElems: number, pages: Uint16Array): void;
  pagedAttention(a: {
    q: Float32Array;
    kPages: Uint16Array;
    vPages: Uint16Array;
    pageTable: Int32Array;
    rowSeq: Int32Array;
    rowPos: Int32Array;
    out: Float32Array;
    T: number;
    nHeads: number;
    nKv: number;
    headDim: number;
    vHeadDim?: number;
    pageSize: number;
    ptStride: number;
    scale: number;
    /** 0 (default): global; W: the last W positions. */
    window?: number;
    /** 0 (default): none. */
    softcap?: number;
  }): void;
  contiguousAttention(a: {
    q: Float32Array;
    k: Uint16Array;
    v: Uint16Array;
    rowSeq: Int32Array;
    rowPos: Int32Array;
    out: Float32Array;
    T: number;
    nHeads: number;
    nKv: number;
    headDim: number;
    vHeadDim?: number;
    ctxCap: number;
    scale: number;
    window?: number;
    softcap?: number;
  }): void;
  /**
   * y = e^x through the attention softmax's exp on the active path (std::exp
   * on "generic", a polynomial on the vector paths); defined for x <= 0.
   */
  attentionExp(x: Float32Array, y: Float32Array): void;
  /** y[T, N] = x[T, K] · W[N, K]^T (+ bias); w holds W's bytes in dtype. */
  matmul(
    x: Float32Array,
    T: number,
    K: number,
    w: Uint8Array,
    dtype: WeightDType,
    N: number,
    bias: Float32Array | null,
    y: Float32Array,
  ): void;
  rmsnorm(
    x: Float32Array,
    w: Uint8Array,
    dtype: WeightDType,
    T: number,
    D: number,
    eps: number,
    y: Float32Array,
  ): void;
  /** In place on x [T, nHeads, headDim]. */
  rope(
    x: Float32Array,
    T: number,
    nHeads: number,
    headDim: number,
    pos: Int32Array,
    invFreq: Float32Array,
  ): void;
  swiglu(gate: Float32Array, up: Float32Array, out: Float32Array): void;
  /** out = gelu_tanh(gate) · up (kernels.h: geglu). */
  geglu(gate: Float32Array, up: Float32Array, out: Float32Array): void;
  /** In place: x = cap · tanh(x / cap), cap > 0. */
  softcap(x: Float32Array, cap: number): void;
  embed(ids: Int32Array, table: Uint8Array, dtype: WeightDType, D: number, out: Float32Array): void;
  /** out = the exact values of src's out.length elements of dtype (whole blocks), on the active ISA's path. */
  dequantize(src: Uint8Array, dtype: WeightDType, out: Float32Array): void;
  /** Multi-threaded copy: the memory-bandwidth yardstick. */
  memcpy(dst: Uint8Array, src: Uint8Array): void;
  /**
   * FLOPs of `iters` rounds of 12 independent register-only FMA chains on
   * every kernel thread at the active ISA's vector width (time the call):
   * the FMA-peak yardstick.
   */
  fmaPeak(iters: number): number;
  /** Multi-threaded streaming read (a checksum of src's 64-bit words): the read-bandwidth yardstick. */
  memread(src: Uint8Array): number;
  /**
   * elems zeroed f16 in memory allocated as the CPU engine allocates its page
   * pools (advised for 2 MiB pages before the first touch), freed with the
   * array: benchmarks time the attention hooks on the engine's kind of memory.
   */
  poolF16(elems: number): Uint16Array;
}

interface Addon {
  readonly Engine: new (
    spec: ModelSpec,
    invFreq: Float32Array,
    threads: number,
    backend: BackendName,
  ) => NativeEngine;
  cudaProbe(): CudaStatus;
  cudaCopyGbPerS(bytes: number): number;
  readonly features: CpuFeatures;
  readonly defaultThreads: number;
  readonly kernels: Kernels;
  lockFileExclusive(fd: number): boolean;
  rowLogprobs(row: Float32Array, token: number, top: Int32Array, out: Float64Array): void;
}

const addonPath = new URL("./build/Release/continuum_native.node", import.meta.url).pathname;

function loadAddon(): Addon {
  try {
    return createRequire(import.meta.url)(addonPath) as Addon;
  } catch (e) {
    throw new Error(
      `native addon not loadable at ${addonPath} (build it with \`npm run build:native\`): ${(e as Error).message}`,
    );
  }
}

const addon = loadAddon();

/** What the CPU offers (for benchmark env lines). */
export const features: CpuFeatures = addon.features;
export const defaultThreads: number = addon.defaultThreads;
export const kernels: Kernels = addon.kernels;

{
  const isa = cpuIsaFromEnv(process.env.CONTINUUM_CPU_ISA, features);
  if (isa !== null && !kernels.setIsa(isa))
    throw new Error(`CONTINUUM_CPU_ISA=${isa}: the native addon refused it`);
}

/** What the CUDA runtime sees, asked on each call (it loads the driver where there is one). */
export function cudaProbe(): CudaStatus {
  return addon.cudaProbe();
}

/** An engine of `backend` with no weights yet; the caller has checked spec and backend. */
export function newNativeEngine(
  spec: ModelSpec,
  invFreq: Float32Array,
  threads: number,
  backend: BackendName,
): NativeEngine {
  return new addon.Engine(spec, invFreq, threads, backend);
}

/**
 * The device's copy bandwidth: GB/s read + written by a device-to-device copy
 * of `bytes` (median of 10; the yardstick GPU benchmarks divide by, measured
 * as native/gpu-check.sh does). Throws without a usable CUDA device.
 */
export function cudaCopyGbPerS(bytes: number = 2 ** 31): number {
  return addon.cudaCopyGbPerS(bytes);
}

/**
 * One row's log-probability reduction (native/src/logprobs.h), synchronous:
 * top ← the top.length most likely ids (value descending, ties by lower id);
 * out ← [max, Σ exp(x − max) (f32 exp, f64 sum, fixed order), rank of token].
 */
export function rowLogprobs(row: Float32Array, token: number, top: Int32Array, out: Float64Array): void {
  addon.rowLogprobs(row, token, top, out);
}

/**
 * flock(fd, LOCK_EX | LOCK_NB): true when this open file (the descriptor's
 * open file description) now holds the exclusive lock, false when another
 * holds it; never waits. The kernel drops the lock when the descriptor
 * closes or the process dies, kill -9 included.
 */
export function lockFileExclusive(fd: number): boolean {
  return addon.lockFileExclusive(fd);
}
