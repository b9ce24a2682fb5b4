/**
 * The engine: weights, per-layer fp16 K/V page pools, the contiguous oracle
 * cache, and the full forward for one ragged batch, in native memory.
 *
 * TypeScript owns policy (which page, refcounts, generations); the engine owns
 * memory and arithmetic. Every call that does real work runs on a native
 * thread and returns a promise: `step` and weight loading on the engine's
 * compute thread, page transfers on its transfer thread, so a long prefill
 * never stalls the event loop and a restore never waits behind a prefill.
 *
 * Bad input (a page id or slot out of range, duplicate slots, lengths that
 * disagree, an unknown tensor, a freed engine) throws synchronously with the
 * reason and writes nothing.
 *
 * Two backends sit behind the one Engine (native/backends.ts), chosen per
 * engine by `EngineOptions.backend`.
 */
import type { PageId } from "../schema/ids.ts";
import { type BackendChoice, type BackendName, chooseBackend } from "./backends.ts";
import { cudaProbe, defaultThreads, type NativeEngine, newNativeEngine } from "./index.ts";
import { checkSpec, type ModelSpec, ropeInvFreq } from "./model-spec.ts";
import { orderWeights, type Weights } from "./weights.ts";

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

export interface EngineOptions {
  /** Compute threads of the CPU backend (the compute thread plus workers); default: all cores. */
  readonly threads?: number;
  /** Default "auto". */
  readonly backend?: BackendChoice;
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
  /**
   * Commits the whole pool now (the CPU engine's pool is otherwise faulted in
   * as steps first write it; the CUDA pool is committed at createPool). A
   * server calls it before it is ready, so no request pays that first touch
   * and a host that cannot back the pool fails at start-up. Contents unchanged.
   */
  commitPool(): Promise<void>;
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
  commitPool(): Promise<void> {
    return this.#live().commitPool();
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
  const backend = choice === "cpu" ? "cpu" : chooseBackend(choice, cudaProbe());
  const native = newNativeEngine(spec, spec.layerInvFreq ?? ropeInvFreq(spec), threads, backend);
  try {
    await native.loadWeights(ordered);
  } catch (e) {
    native.free();
    throw e;
  }
  return new NativeBackedEngine(spec, native);
}
