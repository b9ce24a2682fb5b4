/**
 * The typed face of the native engine (native/build/Release/continuum_native.node).
 *
 * TypeScript owns policy (which page, refcounts, generations); the engine owns
 * memory and arithmetic: weights, per-layer fp16 K/V page pools, the contiguous
 * oracle cache, and the full forward for one ragged batch. Every call that does
 * real work runs on a native thread and returns a promise: `step` and weight
 * loading on the engine's compute thread, page transfers on its transfer
 * thread, so a long prefill never stalls the event loop and a restore never
 * waits behind a prefill.
 *
 * Bad input (a page id or slot out of range, duplicate slots, lengths that
 * disagree, an unknown tensor, a freed engine) throws synchronously with the
 * reason and writes nothing.
 *
 * Two backends sit behind the one Engine: the CPU engine (always built) and
 * the CUDA engine (built in when nvcc was found at build time, see
 * native/build.mjs), chosen per engine by `EngineOptions.backend`;
 * `nativeBackends()` says what this addon offers.
 */
import { createRequire } from "node:module";
import type { PageId } from "../schema/ids.ts";

/**
 * Weight element types: one value per element (f32, f16, bf16), or one of
 * llama.cpp's block formats (native/src/quant.h: a row of K elements is K /
 * block blocks), which only weight matrices and the embedding may use.
 */
export type WeightDType = "f32" | "f16" | "bf16" | "q8_0" | "q4_0" | "q4_k" | "q6_k";

/** Elements and bytes of one block of each weight type (a value of f32/f16/bf16 is a block of one). */
export const WEIGHT_BLOCKS: Readonly<
  Record<WeightDType, { readonly elems: number; readonly bytes: number }>
> = {
  f32: { elems: 1, bytes: 4 },
  f16: { elems: 1, bytes: 2 },
  bf16: { elems: 1, bytes: 2 },
  q8_0: { elems: 32, bytes: 34 },
  q4_0: { elems: 32, bytes: 18 },
  q4_k: { elems: 256, bytes: 144 },
  q6_k: { elems: 256, bytes: 210 },
};

/** Bytes of a tensor of `shape` in `dtype`, or null when its rows are not whole blocks. */
export function weightBytes(dtype: WeightDType, shape: readonly number[]): number | null {
  const b = WEIGHT_BLOCKS[dtype];
  const row = shape.length > 0 ? shape[shape.length - 1]! : 1;
  if (row % b.elems !== 0) return null;
  return (shape.reduce((a, d) => a * d, 1) / b.elems) * b.bytes;
}

/** Llama-3 rotary frequency scaling, with Hugging Face's `rope_scaling` field names. */
export interface Llama3RopeScaling {
  readonly factor: number;
  readonly low_freq_factor: number;
  readonly high_freq_factor: number;
  readonly original_max_position_embeddings: number;
}

/**
 * The architecture of a Llama-family model and its relatives (native/src/backend.h
 * gives the forward). The optional family fields default to the Llama forward.
 */
export interface ModelSpec {
  readonly nLayers: number;
  readonly hidden: number;
  readonly nHeads: number;
  readonly nKvHeads: number;
  readonly headDim: number;
  /** Value head dimension; defaults to headDim. */
  readonly vHeadDim?: number;
  /** MLP intermediate size. */
  readonly ffn: number;
  readonly vocab: number;
  readonly rmsEps: number;
  readonly ropeTheta: number;
  readonly ropeScaling?: Llama3RopeScaling | null;
  /** q/k/v projections carry a bias (Qwen2). */
  readonly attentionBias: boolean;
  /** lm_head shares model.embed_tokens.weight. */
  readonly tiedEmbeddings: boolean;
  /** Positions are in [0, maxPosition). */
  readonly maxPosition: number;
  /** Every RMSNorm scales by (1 + w) (Gemma). */
  readonly normOffset?: boolean;
  /** q_norm / k_norm [headDim] per head before RoPE (Qwen3, Gemma 3). */
  readonly qkNorm?: boolean;
  /** post_attention_layernorm on the attention output, pre_ and post_feedforward_layernorm around the MLP (Gemma). */
  readonly sandwichNorms?: boolean;
  /** The MLP gate; default "silu". */
  readonly activation?: "silu" | "gelu_tanh";
  /** Embedding rows are multiplied by this (Gemma: √hidden); default 1. */
  readonly embedScale?: number;
  /** q and k are multiplied by this after RoPE (LongRoPE's attention factor); default 1. */
  readonly ropeScale?: number;
  /** Softmax scale of the scores; default 1/√headDim. */
  readonly attnScale?: number;
  /** Scores become cap · tanh(s / cap); absent or null: none. */
  readonly attnSoftcap?: number | null;
  /** Logits become cap · tanh(l / cap); absent or null: none. */
  readonly finalSoftcap?: number | null;
  /** Per layer: 0 global, W > 0 sliding over the last W positions; absent: every layer global. */
  readonly layerWindows?: Int32Array;
  /**
   * RoPE inverse frequencies per layer, [nLayers * headDim / 2]; absent:
   * ropeInvFreq(spec) for every layer.
   */
  readonly layerInvFreq?: Float32Array;
}

/** One tensor as read from safetensors: little-endian bytes in `dtype`. */
export interface WeightTensor {
  readonly dtype: WeightDType;
  readonly shape: readonly number[];
  readonly data: Uint8Array;
}

/** Tensors keyed by Hugging Face name. */
export type Weights = ReadonlyMap<string, WeightTensor> | Readonly<Record<string, WeightTensor>>;

/**
 * One ragged batch of prefill and decode rows for the paged path. Row t is
 * token tokens[t] of sequence rowSeq[t] at absolute position positions[t];
 * its K/V go to slot slotMapping[t] = page * pageSize + positions[t] % pageSize
 * where page = pageTable[rowSeq[t] * ptStride + positions[t] / pageSize]
 * (checked). Attention reads keys 0..positions[t] of the row's sequence
 * through its page table, so earlier keys must already be in the pool (or be
 * rows of this batch). Logits are returned for `logitRows`, in that order.
 * With G layer groups (createPool) pageTable is [G, S, ptStride] and
 * slotMapping [G, T], group-major: group g's layers use block g of each. A
 * group's entries before its widest window's first key of every row may be
 * released (negative).
 */
export interface StepBatch {
  readonly tokens: Int32Array;
  readonly positions: Int32Array;
  readonly rowSeq: Int32Array;
  readonly slotMapping: Int32Array;
  /** [G, S, ptStride] physical page ids; entries past a sequence's last page are ignored (use -1). */
  readonly pageTable: Int32Array;
  readonly ptStride: number;
  readonly logitRows: Int32Array;
}

/** A batch for the contiguous oracle: row t's K/V go to position positions[t] of cache sequence rowSeq[t]. */
export interface ContiguousBatch {
  readonly tokens: Int32Array;
  readonly positions: Int32Array;
  readonly rowSeq: Int32Array;
  readonly logitRows: Int32Array;
}

export interface CpuFeatures {
  readonly avx2: boolean;
  readonly fma: boolean;
  readonly f16c: boolean;
  /** AVX-512 F and DQ: the batched GEMM's 512-bit column pairs. */
  readonly avx512: boolean;
}

/** A backend that computes. */
export type BackendName = "cpu" | "cuda";
/** What engine creation asks for: `auto` = CUDA when built and a device is present, else CPU. */
export type BackendChoice = "auto" | BackendName;

export interface EngineOptions {
  /** Compute threads of the CPU backend (the compute thread plus workers); default: all cores. */
  readonly threads?: number;
  /** Default "auto". */
  readonly backend?: BackendChoice;
}

/** Whether this addon carries the CUDA backend and what the CUDA runtime sees. */
export interface CudaStatus {
  readonly built: boolean;
  readonly devices: number;
  /** Why no device is usable (absent when devices > 0). */
  readonly reason?: string;
  /** Device 0's compute capability, e.g. "sm90" (absent without a device). */
  readonly arch?: string;
  /** The CUDA toolkit the backend was compiled with, e.g. "13.0" (absent when not built). */
  readonly toolkit?: string;
  /** The kernels' numerics tag (kNumerics, native/cuda/kernels_cuda.cuh; absent when not built). */
  readonly numerics?: string;
}

export interface NativeBackends {
  readonly cpu: { readonly isa: CpuIsa; readonly threads: number } & CpuFeatures;
  readonly cuda: CudaStatus;
}

/**
 * Byte layout of downloadPages/uploadPages: for each page id in the order
 * given, for each storage slot ascending (each layer, with one layer group;
 * else the layers of the group owning the page, by rank): the K page
 * [pageSize, nKvHeads, headDim] then the V page [pageSize, nKvHeads,
 * vHeadDim], fp16 little-endian. One page is `pageBytes` = slots * pageSize *
 * nKvHeads * (headDim + vHeadDim) * 2.
 */
export interface Engine {
  readonly backend: BackendName;
  readonly spec: ModelSpec;
  /** Host threads that compute (the CUDA backend: 1, the one that queues device work). */
  readonly threads: number;
  /** Bytes of one page across its storage slots (every layer with one group; 0 before createPool). */
  readonly pageBytes: number;
  readonly freed: boolean;
  /**
   * Allocates the K/V page pools, zeroed; once per engine. `layerGroups`
   * (default: one group of every layer) gives each layer's group
   * (worker/model/layout.ts layerGroups): each group has its own page table
   * and slot mapping in a batch, and a page id holds, for the group that owns
   * it, one storage slot per layer of that group (a layer's slot is its rank
   * in its group), so the pool holds max(group size) layers' K/V per page.
   */
  createPool(numPages: number, pageSize: number, layerGroups?: Int32Array | readonly number[]): void;
  /** Allocates the contiguous oracle cache [numSeqs, ctxCap] per layer, zeroed; once per engine. */
  createContiguousCache(numSeqs: number, ctxCap: number): void;
  /** Full forward over the paged pools; resolves with logits [logitRows.length, vocab]. */
  step(batch: StepBatch): Promise<Float32Array>;
  /** The same forward over the contiguous cache (the correctness oracle). */
  stepContiguous(batch: ContiguousBatch): Promise<Float32Array>;
  downloadPages(pageIds: Int32Array | readonly PageId[]): Promise<Uint8Array>;
  /** The engine reads `bytes` on its transfer thread: do not modify them until the promise settles. */
  uploadPages(pageIds: Int32Array | readonly PageId[], bytes: Uint8Array): Promise<void>;
  /** Copy-on-write: every layer's K and V of page src into page dst. */
  copyPage(src: PageId, dst: PageId): Promise<void>;
  /**
   * Times later steps by part on the device (CUDA events; the CUDA engine
   * only: the CPU engine throws). Enabling clears the totals; it costs host
   * time per GEMM and attention call, so leave it off when serving.
   */
  setProfiling(on: boolean): void;
  /** Device time of the steps since profiling was enabled (zeros when it never was). */
  profile(): StepProfile;
  /**
   * Releases native memory. Waits for the job running on each thread, rejects
   * queued ones with "engine freed"; afterwards every call throws "engine freed".
   */
  free(): void;
}

/** Milliseconds of device time summed over `steps` steps; the rest of a step is stepMs − gemmMs − attentionMs. */
export interface StepProfile {
  readonly steps: number;
  readonly stepMs: number;
  readonly gemmMs: number;
  readonly attentionMs: number;
}

// ---- the addon --------------------------------------------------------------

interface NativeEngine {
  loadWeights(tensors: { dtype: WeightDType; data: Uint8Array }[]): Promise<void>;
  tensorNames(): { name: string; shape: number[] }[];
  createPool(numPages: number, pageSize: number, layerGroups?: Int32Array): void;
  createContiguousCache(numSeqs: number, ctxCap: number): void;
  step(batch: StepBatch): Promise<Float32Array>;
  stepContiguous(batch: ContiguousBatch): Promise<Float32Array>;
  downloadPages(ids: Int32Array): Promise<Uint8Array>;
  uploadPages(ids: Int32Array, bytes: Uint8Array): Promise<void>;
  copyPage(src: number, dst: number): Promise<void>;
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

export type CpuIsa = "generic" | "avx2" | "avx512";
const CPU_ISAS: readonly CpuIsa[] = ["generic", "avx2", "avx512"];

/**
 * The vector path a process runs its CPU kernels on: `CONTINUUM_CPU_ISA`
 * (generic, avx2 or avx512) when set, else the widest the CPU has. The
 * paths compute the same bits (kernels.h), so the choice changes speed only:
 * it lets an AVX-512 host measure the AVX2 path most CPUs take. A value that
 * is not one of the three, or a path the CPU lacks, is an error naming the
 * variable.
 */
export function cpuIsaFromEnv(value: string | undefined, cpu: CpuFeatures): CpuIsa | null {
  if (value === undefined || value === "") return null;
  if (!(CPU_ISAS as readonly string[]).includes(value))
    throw new Error(`CONTINUUM_CPU_ISA must be one of ${CPU_ISAS.join("|")}, got ${JSON.stringify(value)}`);
  const isa = value as CpuIsa;
  const avx2 = cpu.avx2 && cpu.fma && cpu.f16c;
  if ((isa === "avx2" && !avx2) || (isa === "avx512" && !(avx2 && cpu.avx512)))
    throw new Error(
      `CONTINUUM_CPU_ISA=${isa}, but this CPU lacks ${isa === "avx2" ? "AVX2, FMA or F16C" : "AVX-512 F/DQ/BW"}`,
    );
  return isa;
}

{
  const isa = cpuIsaFromEnv(process.env.CONTINUUM_CPU_ISA, features);
  if (isa !== null && !kernels.setIsa(isa))
    throw new Error(`CONTINUUM_CPU_ISA=${isa}: the native addon refused it`);
}

/**
 * The backends this addon offers: the CPU's vector path and threads, and
 * whether the CUDA backend is built in and how many devices it sees (the
 * CUDA runtime is asked on each call; without a driver it answers 0 devices
 * and the reason).
 */
export function nativeBackends(): NativeBackends {
  return {
    cpu: { isa: kernels.isa(), threads: defaultThreads, ...features },
    cuda: addon.cudaProbe(),
  };
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

export class BackendUnavailableError extends Error {
  override readonly name = "BackendUnavailableError";
}

/**
 * The backend an engine gets. Pure. `auto` takes CUDA when it is built and
 * sees a device, else CPU; `cuda` without either throws saying which.
 */
export function chooseBackend(choice: BackendChoice, cuda: CudaStatus): BackendName {
  switch (choice) {
    case "cpu":
      return "cpu";
    case "auto":
      return cuda.built && cuda.devices > 0 ? "cuda" : "cpu";
    case "cuda":
      if (!cuda.built) {
        throw new BackendUnavailableError(
          `backend "cuda" requested, but this native addon was built without the CUDA backend (${cuda.reason ?? "no nvcc at build time"}); rebuild with nvcc present (CONTINUUM_CUDA=on)`,
        );
      }
      if (cuda.devices === 0) {
        throw new BackendUnavailableError(
          `backend "cuda" requested, but no CUDA device is usable: ${cuda.reason ?? "0 devices"}`,
        );
      }
      return "cuda";
    default:
      throw new BackendUnavailableError(
        `backend must be "auto", "cpu" or "cuda", got ${JSON.stringify(choice)}`,
      );
  }
}

// ---- model description ----------------------------------------------------------

export class ModelSpecError extends Error {
  override readonly name = "ModelSpecError";
}

export class WeightError extends Error {
  override readonly name = "WeightError";
}

/**
 * Rotary inverse frequencies [headDim / 2]: inv_freq[i] = theta^(-2i / headDim),
 * then the Llama-3 rule when `ropeScaling` is set (with wavelen = 2π / inv_freq,
 * low = original / low_freq_factor, high = original / high_freq_factor):
 * wavelen < high keeps inv_freq; wavelen > low divides it by `factor`; between,
 * smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
 * and inv_freq' = (1 - smooth) * inv_freq / factor + smooth * inv_freq.
 * Computed in float64, rounded once to float32.
 */
export function ropeInvFreq(spec: Pick<ModelSpec, "headDim" | "ropeTheta" | "ropeScaling">): Float32Array {
  const half = spec.headDim / 2;
  const out = new Float32Array(half);
  const sc = spec.ropeScaling ?? null;
  for (let i = 0; i < half; i++) {
    let f = 1 / spec.ropeTheta ** ((2 * i) / spec.headDim);
    if (sc !== null) {
      const lowWavelen = sc.original_max_position_embeddings / sc.low_freq_factor;
      const highWavelen = sc.original_max_position_embeddings / sc.high_freq_factor;
      const wavelen = (2 * Math.PI) / f;
      if (wavelen > lowWavelen) {
        f = f / sc.factor;
      } else if (wavelen >= highWavelen) {
        const smooth =
          (sc.original_max_position_embeddings / wavelen - sc.low_freq_factor) /
          (sc.high_freq_factor - sc.low_freq_factor);
        f = ((1 - smooth) * f) / sc.factor + smooth * f;
      }
    }
    out[i] = f;
  }
  return out;
}

function checkSpec(spec: ModelSpec): void {
  const ints: (keyof ModelSpec)[] = [
    "nLayers",
    "hidden",
    "nHeads",
    "nKvHeads",
    "headDim",
    "ffn",
    "vocab",
    "maxPosition",
  ];
  for (const k of ints) {
    const v = spec[k];
    if (typeof v !== "number" || !Number.isInteger(v) || v < 1 || v > 2 ** 31 - 1) {
      throw new ModelSpecError(`spec.${k} must be a positive integer, got ${String(v)}`);
    }
  }
  const vHead = spec.vHeadDim ?? spec.headDim;
  if (!Number.isInteger(vHead) || vHead < 1)
    throw new ModelSpecError(`spec.vHeadDim must be a positive integer`);
  if (spec.nHeads % spec.nKvHeads !== 0) {
    throw new ModelSpecError(
      `spec.nHeads (${spec.nHeads}) must be a multiple of nKvHeads (${spec.nKvHeads})`,
    );
  }
  if (spec.headDim % 2 !== 0) throw new ModelSpecError(`spec.headDim must be even, got ${spec.headDim}`);
  if (!(spec.rmsEps > 0)) throw new ModelSpecError(`spec.rmsEps must be > 0, got ${spec.rmsEps}`);
  if (!(spec.ropeTheta > 0)) throw new ModelSpecError(`spec.ropeTheta must be > 0, got ${spec.ropeTheta}`);
  const sc = spec.ropeScaling;
  if (sc !== undefined && sc !== null) {
    for (const k of [
      "factor",
      "low_freq_factor",
      "high_freq_factor",
      "original_max_position_embeddings",
    ] as const) {
      if (!(typeof sc[k] === "number" && sc[k] > 0)) {
        throw new ModelSpecError(`spec.ropeScaling.${k} must be > 0, got ${String(sc[k])}`);
      }
    }
    if (sc.high_freq_factor <= sc.low_freq_factor) {
      throw new ModelSpecError("spec.ropeScaling.high_freq_factor must exceed low_freq_factor");
    }
  }
  for (const k of ["embedScale", "ropeScale", "attnScale", "attnSoftcap", "finalSoftcap"] as const) {
    const v = spec[k];
    if (v !== undefined && v !== null && !(typeof v === "number" && Number.isFinite(v) && v > 0))
      throw new ModelSpecError(`spec.${k} must be a positive number, got ${String(v)}`);
  }
  const w = spec.layerWindows;
  if (w !== undefined) {
    if (!(w instanceof Int32Array) || w.length !== spec.nLayers)
      throw new ModelSpecError(
        `spec.layerWindows must be an Int32Array of nLayers (${spec.nLayers}) windows`,
      );
    if (w.some((x) => x < 0)) throw new ModelSpecError("spec.layerWindows must be >= 0 (0: global)");
  }
  const inv = spec.layerInvFreq;
  if (
    inv !== undefined &&
    (!(inv instanceof Float32Array) || inv.length !== (spec.nLayers * spec.headDim) / 2)
  )
    throw new ModelSpecError("spec.layerInvFreq must be a Float32Array of nLayers * headDim / 2 frequencies");
}

/** The tensors a spec needs, by Hugging Face name, in the engine's load order. */
export function weightNames(spec: ModelSpec): { name: string; shape: number[] }[] {
  const H = spec.hidden;
  const vHead = spec.vHeadDim ?? spec.headDim;
  const qn = spec.nHeads * spec.headDim;
  const kn = spec.nKvHeads * spec.headDim;
  const vn = spec.nKvHeads * vHead;
  const on = spec.nHeads * vHead;
  const out: { name: string; shape: number[] }[] = [
    { name: "model.embed_tokens.weight", shape: [spec.vocab, H] },
  ];
  for (let l = 0; l < spec.nLayers; l++) {
    const p = `model.layers.${l}.`;
    out.push({ name: `${p}input_layernorm.weight`, shape: [H] });
    out.push({ name: `${p}self_attn.q_proj.weight`, shape: [qn, H] });
    out.push({ name: `${p}self_attn.k_proj.weight`, shape: [kn, H] });
    out.push({ name: `${p}self_attn.v_proj.weight`, shape: [vn, H] });
    if (spec.attentionBias) {
      out.push({ name: `${p}self_attn.q_proj.bias`, shape: [qn] });
      out.push({ name: `${p}self_attn.k_proj.bias`, shape: [kn] });
      out.push({ name: `${p}self_attn.v_proj.bias`, shape: [vn] });
    }
    if (spec.qkNorm) {
      out.push({ name: `${p}self_attn.q_norm.weight`, shape: [spec.headDim] });
      out.push({ name: `${p}self_attn.k_norm.weight`, shape: [spec.headDim] });
    }
    out.push({ name: `${p}self_attn.o_proj.weight`, shape: [H, on] });
    out.push({ name: `${p}post_attention_layernorm.weight`, shape: [H] });
    if (spec.sandwichNorms) out.push({ name: `${p}pre_feedforward_layernorm.weight`, shape: [H] });
    out.push({ name: `${p}mlp.gate_proj.weight`, shape: [spec.ffn, H] });
    out.push({ name: `${p}mlp.up_proj.weight`, shape: [spec.ffn, H] });
    out.push({ name: `${p}mlp.down_proj.weight`, shape: [H, spec.ffn] });
    if (spec.sandwichNorms) out.push({ name: `${p}post_feedforward_layernorm.weight`, shape: [H] });
  }
  out.push({ name: "model.norm.weight", shape: [H] });
  if (!spec.tiedEmbeddings) out.push({ name: "lm_head.weight", shape: [spec.vocab, H] });
  return out;
}

/** Checks every tensor (presence, no extras, shape, dtype, byte length) and returns them in load order. */
function orderWeights(spec: ModelSpec, weights: Weights): { dtype: WeightDType; data: Uint8Array }[] {
  const byName: ReadonlyMap<string, WeightTensor> =
    weights instanceof Map ? weights : new Map(Object.entries(weights as Record<string, WeightTensor>));
  const wanted = weightNames(spec);
  const known = new Set(wanted.map((w) => w.name));
  for (const name of byName.keys()) {
    if (!known.has(name))
      throw new WeightError(`unexpected tensor ${name}: the model spec has no place for it`);
  }
  return wanted.map(({ name, shape }) => {
    const t = byName.get(name);
    if (t === undefined) throw new WeightError(`missing tensor ${name} [${shape.join(", ")}]`);
    if (!Object.hasOwn(WEIGHT_BLOCKS, t.dtype)) {
      throw new WeightError(
        `tensor ${name}: dtype ${String(t.dtype)} is not one of ${Object.keys(WEIGHT_BLOCKS).join(", ")}`,
      );
    }
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new WeightError(`tensor ${name}: shape [${t.shape.join(", ")}], expected [${shape.join(", ")}]`);
    }
    if (!(t.data instanceof Uint8Array)) throw new WeightError(`tensor ${name}: data must be a Uint8Array`);
    const bytes = weightBytes(t.dtype, shape);
    if (bytes === null) {
      throw new WeightError(
        `tensor ${name}: rows of ${shape[shape.length - 1]} elements are not whole ${t.dtype} blocks of ${WEIGHT_BLOCKS[t.dtype].elems}`,
      );
    }
    if (t.data.byteLength !== bytes) {
      throw new WeightError(`tensor ${name}: ${t.data.byteLength} bytes, expected ${bytes} for ${t.dtype}`);
    }
    return { dtype: t.dtype, data: t.data };
  });
}

/**
 * Engines not yet freed. A process that ends with one still allocated would
 * free it from the addon's finalizer during environment teardown, after Node
 * has already torn down the engine's thread-safe functions — which aborts
 * the process (exit 134). So every live engine is freed on "exit", while
 * the environment is still whole.
 */
const liveEngines = new Set<NativeBackedEngine>();
let exitHookInstalled = false;

/** Engines created and not yet freed, in this process. */
export function liveEngineCount(): number {
  return liveEngines.size;
}

function trackEngine(e: NativeBackedEngine): void {
  liveEngines.add(e);
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once("exit", () => {
    for (const engine of liveEngines) engine.free();
  });
}

class NativeBackedEngine implements Engine {
  readonly backend: BackendName;
  #native: NativeEngine | null;
  #hasPool = false;

  constructor(
    readonly spec: ModelSpec,
    native: NativeEngine,
  ) {
    this.#native = native;
    this.backend = native.backend;
    trackEngine(this);
  }

  #live(): NativeEngine {
    if (this.#native === null) throw new Error("engine freed");
    return this.#native;
  }

  get freed(): boolean {
    return this.#native === null;
  }
  get threads(): number {
    return this.#live().threads;
  }
  get pageBytes(): number {
    const n = this.#live();
    return this.#hasPool ? n.pageBytes : 0;
  }

  createPool(numPages: number, pageSize: number, layerGroups?: Int32Array | readonly number[]): void {
    this.#live().createPool(
      numPages,
      pageSize,
      layerGroups === undefined ? undefined : Int32Array.from(layerGroups),
    );
    this.#hasPool = true;
  }
  createContiguousCache(numSeqs: number, ctxCap: number): void {
    this.#live().createContiguousCache(numSeqs, ctxCap);
  }
  step(batch: StepBatch): Promise<Float32Array> {
    return this.#live().step(batch);
  }
  stepContiguous(batch: ContiguousBatch): Promise<Float32Array> {
    return this.#live().stepContiguous(batch);
  }
  downloadPages(pageIds: Int32Array | readonly PageId[]): Promise<Uint8Array> {
    return this.#live().downloadPages(toIds(pageIds));
  }
  uploadPages(pageIds: Int32Array | readonly PageId[], bytes: Uint8Array): Promise<void> {
    return this.#live().uploadPages(toIds(pageIds), bytes);
  }
  copyPage(src: PageId, dst: PageId): Promise<void> {
    return this.#live().copyPage(src, dst);
  }
  setProfiling(on: boolean): void {
    this.#live().setProfiling(on);
  }
  profile(): StepProfile {
    return this.#live().profile();
  }
  free(): void {
    const n = this.#native;
    this.#native = null;
    liveEngines.delete(this);
    n?.free();
  }
}

function toIds(ids: Int32Array | readonly PageId[]): Int32Array {
  if (ids instanceof Int32Array) return ids;
  for (const [i, id] of ids.entries()) {
    if (!Number.isInteger(id) || id < 0 || id > 2 ** 31 - 1)
      throw new RangeError(`pageIds[${i}] = ${id} is not a page id`);
  }
  return Int32Array.from(ids);
}

/**
 * Validates the spec and every tensor (a bad one throws naming it, before any
 * native memory is taken), chooses the backend (`opts.backend`, see
 * chooseBackend: a forced one that is unavailable throws before anything is
 * created), then copies the weights into the backend's memory (host or
 * device) on the compute thread. A failure frees what was created.
 */
export async function createEngine(
  spec: ModelSpec,
  weights: Weights,
  opts: EngineOptions = {},
): Promise<Engine> {
  checkSpec(spec);
  const ordered = orderWeights(spec, weights);
  const threads = opts.threads ?? defaultThreads;
  if (!Number.isInteger(threads) || threads < 1)
    throw new RangeError(`threads must be a positive integer, got ${threads}`);
  const choice = opts.backend ?? "auto";
  // "cpu" never touches the CUDA runtime (the probe loads the driver).
  const backend = choice === "cpu" ? "cpu" : chooseBackend(choice, addon.cudaProbe());
  const native = new addon.Engine(spec, spec.layerInvFreq ?? ropeInvFreq(spec), threads, backend);
  try {
    await native.loadWeights(ordered);
  } catch (e) {
    native.free();
    throw e;
  }
  return new NativeBackedEngine(spec, native);
}
