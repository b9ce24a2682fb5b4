import type { ContiguousBatch, Engine, StepBatch, StepProfile } from "../native/engine.ts";
import { type PageId, RequestId } from "../schema/ids.ts";
import { silentLogger } from "../schema/log.ts";
import type { LoadedModel } from "../worker/model/model-dir.ts";
import { Rng, seedRng } from "../worker/model/prng.ts";
import { WorkerRuntime } from "../worker/runtime/runtime.ts";
import type { RuntimeOptions, SubmitRequest } from "../worker/runtime/runtime-api.ts";

/**
 * The worker runtime driven in process for bench serve (no HTTP): an engine
 * whose step times are recorded, a fresh runtime per part over it, each
 * request's trace as the client saw it, and the closed-loop run of N
 * requests at once that the batching figures sum.
 */
export const PAGE_TOKENS = 16;
export const PHYSICAL_PAGES = 2048;
/** Every request samples with a fixed seed and never stops early, so each generates exactly its max tokens. */
export const SAMPLING = { temperature: 0.8, topK: 40, topP: 0.95 } as const;

/** The scheduler settings a session's runtime runs under (bench/serve.ts SCHED). */
export interface SchedulerSettings {
  readonly maxBatchTokens: number;
  readonly prefillTile: number;
  readonly minPrefillTokens: number;
  readonly maxBatchSeqs: number;
  /** 0 = unpaced (fixed tiles). */
  readonly decodePace: number;
}

/**
 * The engine with its step times recorded, so a run's wall time splits into
 * device time (the native step) and the runtime's own per-step JS time.
 */
export class MeteredEngine implements Engine {
  /** [rows, ms] of every step since the last reset. */
  steps: [number, number][] = [];

  constructor(private readonly inner: Engine) {}

  get spec() {
    return this.inner.spec;
  }
  get backend() {
    return this.inner.backend;
  }
  get threads() {
    return this.inner.threads;
  }
  get pageBytes() {
    return this.inner.pageBytes;
  }
  get freed() {
    return this.inner.freed;
  }
  createPool(numPages: number, pageSize: number): void {
    this.inner.createPool(numPages, pageSize);
  }
  commitPool(): Promise<void> {
    return this.inner.commitPool();
  }
  createContiguousCache(numSeqs: number, ctxCap: number): void {
    this.inner.createContiguousCache(numSeqs, ctxCap);
  }
  async step(batch: StepBatch): Promise<Float32Array> {
    const t0 = performance.now();
    const out = await this.inner.step(batch);
    this.steps.push([batch.tokens.length, performance.now() - t0]);
    return out;
  }
  stepContiguous(batch: ContiguousBatch): Promise<Float32Array> {
    return this.inner.stepContiguous(batch);
  }
  setProfiling(on: boolean): void {
    this.inner.setProfiling(on);
  }
  profile(): StepProfile {
    return this.inner.profile();
  }
  downloadPages(pageIds: Int32Array | readonly PageId[]): Promise<Uint8Array> {
    return this.inner.downloadPages(pageIds);
  }
  uploadPages(pageIds: Int32Array | readonly PageId[], bytes: Uint8Array): Promise<void> {
    return this.inner.uploadPages(pageIds, bytes);
  }
  copyPage(src: PageId, dst: PageId): Promise<void> {
    return this.inner.copyPage(src, dst);
  }
  free(): void {
    this.inner.free();
  }

  /** Steps, their total device ms, and the count and total ms of the steps of exactly `rows` rows. */
  summary(rows?: number): { steps: number; deviceMs: number; atRows: number; atRowsMs: number } {
    let deviceMs = 0;
    let atRowsMs = 0;
    let atRows = 0;
    for (const [r, ms] of this.steps) {
      deviceMs += ms;
      if (r === rows) {
        atRowsMs += ms;
        atRows++;
      }
    }
    return { steps: this.steps.length, deviceMs, atRows, atRowsMs };
  }
}

/** One request as the client saw it: submit time, each token's arrival time, how it ended. */
export interface Trace {
  readonly submittedAt: number;
  readonly tokenAt: number[];
  end: string;
  cachedTokens: number;
}

export interface Session {
  readonly rt: WorkerRuntime;
  submit(
    id: string,
    prompt: readonly number[],
    maxTokens: number,
    extra?: Partial<SubmitRequest>,
  ): { live: Trace; trace: Promise<Trace>; cancel(): void };
  close(): Promise<void>;
}

/** A fresh runtime (empty page pool and prefix cache) over the shared engine. */
export function session(engine: Engine, model: LoadedModel, sched: SchedulerSettings): Session {
  const opts: RuntimeOptions = {
    fingerprint: model.fingerprint,
    vocab: model.config.spec.vocab,
    maxContext: model.config.spec.maxPosition,
    layers: model.config.spec.layers,
    pageTokens: PAGE_TOKENS,
    physicalPages: PHYSICAL_PAGES,
    maxBatchTokens: sched.maxBatchTokens,
    maxBatchSeqs: sched.maxBatchSeqs,
    minPrefillTokens: sched.minPrefillTokens,
    prefillTile: sched.prefillTile,
    ...(sched.decodePace > 0 ? { decodePace: sched.decodePace } : {}),
    maxQueued: 1024,
    costs: {
      prefillPerTokenMs: 1,
      firstTokenMs: 50,
      decodeStepMs: 50,
      restorePerByteMs: { ram: 1e-6, ssd: 1e-5, peer: 2e-5, s3: 1e-4 },
    },
    logger: silentLogger,
  };
  const rt = new WorkerRuntime(engine, opts);
  rt.start();
  let n = 0;
  return {
    rt,
    submit(id, prompt, maxTokens, extra = {}) {
      const req: SubmitRequest = {
        requestId: RequestId(id),
        salt: undefined,
        prompt,
        maxTokens,
        ...SAMPLING,
        seed: n++,
        stopTokenIds: [],
        ...extra,
      };
      const trace: Trace = { submittedAt: performance.now(), tokenAt: [], end: "", cachedTokens: 0 };
      const gen = rt.submit(req);
      const done = (async () => {
        for await (const ev of gen.events) {
          if (ev.type === "token") trace.tokenAt.push(performance.now());
          else if (ev.type === "end") {
            trace.end = ev.reason;
            trace.cachedTokens = ev.cachedTokens;
          } else trace.end = `error: ${ev.message}`;
        }
        return trace;
      })();
      return { live: trace, trace: done, cancel: gen.cancel };
    },
    close: () => rt.stop(),
  };
}

export function tokens(rng: Rng, n: number, vocab: number): number[] {
  return Array.from({ length: n }, () => rng.nextU32() % vocab);
}

export function gaps(t: readonly number[], from = 1, to = t.length): number[] {
  const out: number[] = [];
  for (let i = Math.max(1, from); i < Math.min(to, t.length); i++) out.push(t[i]! - t[i - 1]!);
  return out;
}

/** Every request ran to its length (or was cancelled); a constrained one may also stop when its document is whole. */
export function checkEnds(traces: readonly Trace[], what: string, constrained = false): void {
  const bad = traces.filter(
    (t) => t.end !== "length" && t.end !== "cancelled" && !(constrained && t.end === "stop"),
  );
  if (bad.length > 0) throw new Error(`${what}: ${bad.length} requests ended with ${bad[0]!.end}`);
}

/** Totals of closed-loop runs of N requests at once, summed over rounds. */
export class BatchTotals {
  generated = 0;
  endToEndMs = 0;
  decoded = 0;
  decodeMs = 0;
  /** Every native step and its time; and the steps of exactly N rows (pure decode). */
  steps = 0;
  deviceMs = 0;
  decodeSteps = 0;
  decodeStepMs = 0;
  /** Wall time of the runs, from the first submission to the runtime's stop. */
  wallMs = 0;

  get endToEndTokPerS(): number {
    return this.generated / (this.endToEndMs / 1000);
  }
  /** Tokens after the moment every request had its first, over that window. */
  get decodeTokPerS(): number {
    return this.decoded / (this.decodeMs / 1000);
  }
  get meanDecodeStepMs(): number {
    return this.decodeStepMs / this.decodeSteps;
  }
  /** The runtime's own time per step: wall time not spent in the native step. */
  get runtimeMsPerStep(): number {
    return (this.wallMs - this.deviceMs) / this.steps;
  }
}

/** N requests at once: `promptLen` unique prompt tokens each, `maxTokens` generated; adds to `into`. */
export async function concurrent(
  s: Session,
  n: number,
  promptLen: number,
  maxTokens: number,
  vocab: number,
  into: BatchTotals,
  extra?: Partial<SubmitRequest>,
): Promise<void> {
  const rng = new Rng(seedRng(n, "bench-serve-concurrent"));
  const traces = await Promise.all(
    Array.from(
      { length: n },
      (_, i) => s.submit(`c${n}-${i}`, tokens(rng, promptLen, vocab), maxTokens, extra).trace,
    ),
  );
  checkEnds(traces, `concurrency ${n}`, extra?.constraint !== undefined);
  const start = Math.min(...traces.map((t) => t.submittedAt));
  const allFirst = Math.max(...traces.map((t) => t.tokenAt[0]!));
  const end = Math.max(...traces.map((t) => t.tokenAt[t.tokenAt.length - 1]!));
  for (const t of traces) {
    into.generated += t.tokenAt.length;
    for (const at of t.tokenAt) if (at > allFirst) into.decoded++;
  }
  into.endToEndMs += end - start;
  into.decodeMs += end - allFirst;
}
