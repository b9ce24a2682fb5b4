import { join } from "node:path";
import type { ContiguousBatch, Engine, StepBatch, StepProfile } from "../native/index.ts";
import { type PageId, RequestId } from "../schema/ids.ts";
import { silentLogger } from "../schema/log.ts";
import { generateModel } from "../worker/model/generate.ts";
import { type LoadedModel, loadModelDir } from "../worker/model/model-dir.ts";
import { Rng, seedRng } from "../worker/model/prng.ts";
import { loadEngine } from "../worker/runtime/engine-load.ts";
import { type RuntimeOptions, type SubmitRequest, WorkerRuntime } from "../worker/runtime/runtime.ts";
import { type Bench, percentile, round } from "./contract.ts";

/**
 * The worker runtime serving the `small` preset in one process, driven
 * through WorkerRuntime.submit (no HTTP), in three parts:
 *
 * 1. Batching gain: N requests submitted at once (closed loop), N = 1 and
 *    16, alternated over rounds; generated tokens/s end to end (prefill
 *    included) and in the decode phase alone, with the native step time
 *    apart from the runtime's own time per step.
 * 2. Prefill interference: 8 running decodes, alone and beside one long
 *    prompt (4088 tokens + 8 generated = the model's 4096 positions),
 *    phases alternating within one run; the decodes' inter-token p99 beside
 *    the prefill over their p99 alone.
 * 3. An open-loop Poisson workload with shared prefixes: 4 system prompts
 *    (256/512/768/1024 tokens) + a unique suffix of 16–64 tokens, 32–64
 *    generated tokens, arrivals at a rate set to ~50 % of the capacity
 *    implied by part 1 and the runtime's measured prefill cost. TTFT,
 *    inter-token latency, throughput and the prompt tokens served from
 *    cached prefix pages.
 *
 * 4. In-flight prefix sharing: 16 requests with one long system prompt
 *    (1024 tokens; quick 256) and a unique 16-token suffix arrive at once;
 *    the prompt tokens the engine computed against those of 16 separate
 *    prompts, and the TTFT.
 *
 * Every request samples (temperature 0.8, top-k 40, top-p 0.95) with a fixed
 * seed and never stops early, so each generates exactly its max tokens.
 * The model is generated once under .continuum/models/small (seed 0, shared
 * with bench decode) and reused.
 */
const MODEL_DIR = join(process.env.CONTINUUM_DATA_DIR ?? ".continuum", "models", "small");
const PAGE_TOKENS = 16;
const PHYSICAL_PAGES = 2048;
/**
 * Scheduler settings under test. A step costs about one pass over the
 * weights plus its rows' compute, so a prefill tile of T rows beside B
 * decode rows stretches their step from B·c + m to (B + T)·c' + m, and c'
 * grows with a long prompt's context. A fixed tile cannot hold the decodes'
 * pace over a 4096-token prompt without being tiny for every other prompt;
 * so tiles are large (prefillTile) when nothing decodes and paced beside
 * decodes: the runtime's PrefillPacer keeps a mixed step within decodePace ×
 * the decode-only step it replaces (predicted from a cost model fitted to the
 * measured steps: rows and attended keys), down to minPrefillTokens rows.
 * 1.8 leaves a margin under the 2× goal for noise and fitting error.
 */
const SCHED = {
  maxBatchTokens: envInt("CONTINUUM_SERVE_MAX_BATCH_TOKENS", 256),
  prefillTile: envInt("CONTINUUM_SERVE_PREFILL_TILE", 128),
  minPrefillTokens: envInt("CONTINUUM_SERVE_MIN_PREFILL_TOKENS", 2),
  maxBatchSeqs: 64,
  /** 0 = unpaced (fixed tiles). */
  decodePace: envNumber("CONTINUUM_SERVE_DECODE_PACE", 1.8),
} as const;

/** A scheduler setting overridden from the environment, to explore the trade-off without editing. */
function envNumber(name: string, fallback: number): number {
  const v = process.env[name];
  if (v === undefined || v === "") return fallback;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) throw new Error(`${name} must be a number ≥ 0, got '${v}'`);
  return n;
}

function envInt(name: string, fallback: number): number {
  const v = process.env[name];
  if (v === undefined || v === "") return fallback;
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 1) throw new Error(`${name} must be a positive integer, got '${v}'`);
  return n;
}
const SAMPLING = { temperature: 0.8, topK: 40, topP: 0.95 } as const;
const LOAD_FACTOR = 0.5;

async function smallModel(log: (l: string) => void): Promise<LoadedModel> {
  try {
    return await loadModelDir(MODEL_DIR, { variant: "bench" });
  } catch {
    log(`generating the small preset into ${MODEL_DIR} (once)`);
    await generateModel({ preset: "small", out: MODEL_DIR, seed: 0, force: true });
    return loadModelDir(MODEL_DIR, { variant: "bench" });
  }
}

/**
 * The engine with its step times recorded, so a run's wall time splits into
 * device time (the native step) and the runtime's own per-step JS time.
 */
class MeteredEngine implements Engine {
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
interface Trace {
  readonly submittedAt: number;
  readonly tokenAt: number[];
  end: string;
  cachedTokens: number;
}

interface Session {
  readonly rt: WorkerRuntime;
  submit(
    id: string,
    prompt: readonly number[],
    maxTokens: number,
  ): { live: Trace; trace: Promise<Trace>; cancel(): void };
  close(): Promise<void>;
}

/** A fresh runtime (empty page pool and prefix cache) over the shared engine. */
function session(engine: Engine, model: LoadedModel, sched: typeof SCHED): Session {
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
    submit(id, prompt, maxTokens) {
      const req: SubmitRequest = {
        requestId: RequestId(id),
        salt: undefined,
        prompt,
        maxTokens,
        ...SAMPLING,
        seed: n++,
        stopTokenIds: [],
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

function tokens(rng: Rng, n: number, vocab: number): number[] {
  return Array.from({ length: n }, () => rng.nextU32() % vocab);
}

function gaps(t: readonly number[], from = 1, to = t.length): number[] {
  const out: number[] = [];
  for (let i = Math.max(1, from); i < Math.min(to, t.length); i++) out.push(t[i]! - t[i - 1]!);
  return out;
}

function checkEnds(traces: readonly Trace[], what: string): void {
  const bad = traces.filter((t) => t.end !== "length" && t.end !== "cancelled");
  if (bad.length > 0) throw new Error(`${what}: ${bad.length} requests ended with ${bad[0]!.end}`);
}

/** Totals of closed-loop runs of N requests at once, summed over rounds. */
class BatchTotals {
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
async function concurrent(
  s: Session,
  n: number,
  promptLen: number,
  maxTokens: number,
  vocab: number,
  into: BatchTotals,
): Promise<void> {
  const rng = new Rng(seedRng(n, "bench-serve-concurrent"));
  const traces = await Promise.all(
    Array.from(
      { length: n },
      (_, i) => s.submit(`c${n}-${i}`, tokens(rng, promptLen, vocab), maxTokens).trace,
    ),
  );
  checkEnds(traces, `concurrency ${n}`);
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

const DECODES = 8;
const DECODE_PROMPT = 32;
/** 4088 + 8 generated = the small preset's 4096 positions. */
const LONG_PROMPT = 4088;
const WARM_TOKENS = 4;

interface Interference {
  /** Inter-token gaps of the decodes that ended while a long prompt was prefilling ("on") or not. */
  on: number[];
  off: number[];
  longPrefilledTokens: number;
  longPrefillMs: number;
  /** Submission to first token of each long prompt that got one (full run: the one "on" phase). */
  longTtftMs: number[];
  phases: string[];
}

/**
 * The same 8 decodes run throughout while phases alternate: "off" (the
 * decodes alone for `offSteps` steps) and "on" (a long prompt submitted and
 * prefilled in tiles beside them, until its first token, or for `onSteps`
 * steps and then cancelled). Alternating within one run exposes both sides
 * to the same machine conditions, which on a shared machine drift more than
 * the effect being measured; for the same reason an "off" after an "on"
 * lasts as many steps as that "on" did (up to `matchSteps`), so a long
 * prefill is not compared with a short, luckier quiet window. A gap belongs
 * to the phase its later token arrived in.
 */
async function interference(
  s: Session,
  vocab: number,
  plan: readonly ("off" | "on")[],
  offSteps: number,
  onSteps: number,
  matchSteps: number,
  decodeTokens: number,
): Promise<Interference> {
  const rng = new Rng(seedRng(1, "bench-serve-interference"));
  const decodes = Array.from({ length: DECODES }, (_, i) =>
    s.submit(`d${i}`, tokens(rng, DECODE_PROMPT, vocab), decodeTokens),
  );
  const generated = () => s.rt.stats().generatedTokens;
  await waitFor(() => generated() >= DECODES * WARM_TOKENS);
  const windows: { kind: "on" | "off"; from: number; to: number }[] = [];
  let prefilled = 0;
  let prefillMs = 0;
  const ttft: number[] = [];
  let lastOnSteps = 0;
  for (const [i, kind] of plan.entries()) {
    const from = performance.now();
    const start = generated();
    if (kind === "off") {
      const steps = Math.max(offSteps, Math.min(lastOnSteps, matchSteps));
      await waitFor(() => generated() - start >= steps * DECODES);
    } else {
      const computed = s.rt.stats().computedPromptTokens;
      const long = s.submit(`long${i}`, tokens(rng, LONG_PROMPT, vocab), 8);
      await waitFor(() => long.live.tokenAt.length > 0 || generated() - start >= onSteps * DECODES);
      if (long.live.tokenAt.length > 0) ttft.push(long.live.tokenAt[0]! - long.live.submittedAt);
      prefilled += s.rt.stats().computedPromptTokens - computed;
      prefillMs += performance.now() - from;
      long.cancel();
      await long.trace;
      lastOnSteps = Math.ceil((generated() - start) / DECODES);
    }
    windows.push({ kind, from, to: performance.now() });
    if (decodes.some((d) => d.live.end !== "")) throw new Error("the decodes ended before the phases did");
  }
  for (const d of decodes) d.cancel();
  const traces = await Promise.all(decodes.map((d) => d.trace));
  const out: Interference = {
    on: [],
    off: [],
    longPrefilledTokens: prefilled,
    longPrefillMs: prefillMs,
    longTtftMs: ttft,
    phases: [],
  };
  for (const t of traces) {
    for (let k = 1; k < t.tokenAt.length; k++) {
      const at = t.tokenAt[k]!;
      const w = windows.find((x) => at > x.from && at <= x.to);
      if (w) out[w.kind].push(at - t.tokenAt[k - 1]!);
    }
  }
  out.phases = windows.map((w) => `${w.kind} ${round(w.to - w.from)} ms`);
  return out;
}

async function waitFor(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setTimeout(r, 5));
}

interface WorkloadRun {
  wallS: number;
  generated: number;
  promptTokens: number;
  computedPromptTokens: number;
  cachedPromptTokens: number;
  ttft: number[];
  itl: number[];
  maxRunning: number;
}

/** Open loop: request i arrives at its Poisson time whatever the runtime is doing. */
async function poisson(s: Session, vocab: number, z: Sizes, ratePerS: number): Promise<WorkloadRun> {
  const rng = new Rng(seedRng(3, "bench-serve-poisson"));
  const prefixes = z.prefixes.map((n) => tokens(rng, n, vocab));
  const pick = (r: readonly [number, number]) => r[0] + (rng.nextU32() % (r[1] - r[0] + 1));
  const before = s.rt.stats();
  const start = performance.now();
  let at = 0;
  let maxRunning = 0;
  const runs: Promise<Trace>[] = [];
  let promptTokens = 0;
  for (let i = 0; i < z.requests; i++) {
    // Exponential inter-arrival gaps: −ln(U)/λ.
    at += (-Math.log(1 - rng.nextFloat()) / ratePerS) * 1000;
    const prompt = [...prefixes[rng.nextU32() % prefixes.length]!, ...tokens(rng, pick(z.suffix), vocab)];
    const maxTokens = pick(z.gen);
    promptTokens += prompt.length;
    const wait = start + at - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    runs.push(s.submit(`p${i}`, prompt, maxTokens).trace);
    const st = s.rt.stats();
    maxRunning = Math.max(maxRunning, st.running + st.waiting);
  }
  const traces = await Promise.all(runs);
  checkEnds(traces, "poisson");
  const end = Math.max(...traces.map((t) => t.tokenAt[t.tokenAt.length - 1]!));
  const after = s.rt.stats();
  return {
    wallS: (end - start) / 1000,
    generated: traces.reduce((a, t) => a + t.tokenAt.length, 0),
    promptTokens,
    computedPromptTokens: after.computedPromptTokens - before.computedPromptTokens,
    cachedPromptTokens: after.cachedPromptTokens - before.cachedPromptTokens,
    ttft: traces.map((t) => t.tokenAt[0]! - t.submittedAt),
    itl: traces.flatMap((t) => gaps(t.tokenAt)),
    maxRunning,
  };
}

/** Run sizes: the full run follows the issue; quick shrinks every part to fit in a minute. */
interface Sizes {
  readonly genTokens: number;
  /** Quick: steps of each interference phase (the long prompt is cancelled after them). */
  readonly windowSteps: number;
  /** Alternating rounds of the 1- and 16-request runs. */
  readonly rounds: number;
  readonly prefixes: readonly number[];
  readonly suffix: readonly [number, number];
  readonly gen: readonly [number, number];
  readonly requests: number;
}
const FULL: Sizes = {
  genTokens: 64,
  windowSteps: Number.POSITIVE_INFINITY,
  rounds: 3,
  prefixes: [256, 512, 768, 1024],
  suffix: [16, 64],
  gen: [32, 64],
  requests: 48,
};
const QUICK: Sizes = {
  genTokens: 16,
  windowSteps: 12,
  rounds: 2,
  prefixes: [64, 128, 192, 256],
  suffix: [8, 24],
  gen: [8, 16],
  requests: 12,
};

const mean = (r: readonly [number, number]) => (r[0] + r[1]) / 2;

const BURST = 16;
const BURST_SUFFIX = 16;

/** BURST requests sharing one `system`-token prompt, submitted at once; the prompt rows the runtime computed. */
async function burst(s: Session, vocab: number, system: number, gen: number) {
  const rng = new Rng(seedRng(4, "bench-serve-burst"));
  const shared = tokens(rng, system, vocab);
  const computed = s.rt.stats().computedPromptTokens;
  const traces = await Promise.all(
    Array.from(
      { length: BURST },
      (_, i) => s.submit(`b${i}`, [...shared, ...tokens(rng, BURST_SUFFIX, vocab)], gen).trace,
    ),
  );
  checkEnds(traces, "burst");
  return {
    computed: s.rt.stats().computedPromptTokens - computed,
    prompt: BURST * (system + BURST_SUFFIX),
    shared: s.rt.stats().sharedInFlightTokens,
    ttft: traces.map((t) => t.tokenAt[0]! - t.submittedAt),
  };
}

const bench: Bench = {
  summary:
    "worker runtime on the small preset: batching gain, prefill interference, Poisson load with shared prefixes",
  async run({ quick, log }) {
    const z = quick ? QUICK : FULL;
    const model = await smallModel(log);
    const vocab = model.config.spec.vocab;
    const engine = new MeteredEngine(
      await loadEngine(model, { physicalPages: PHYSICAL_PAGES, pageTokens: PAGE_TOKENS }),
    );
    const figures: Record<string, number> = {};
    const ratios: Record<string, number | null> = {};
    /** Runs one part on a fresh runtime; returns its result and the part's wall and device ms. */
    const part = async <T>(f: (s: Session) => Promise<T>) => {
      const s = session(engine, model, SCHED);
      engine.steps = [];
      const t0 = performance.now();
      try {
        return { value: await f(s), wallMs: performance.now() - t0, rt: s.rt };
      } finally {
        await s.close();
      }
    };
    try {
      // Warm-up: page in the weights and the kernels' buffers.
      await part((s) => s.submit("warm", tokens(new Rng(seedRng(9)), 64, vocab), 4).trace);

      const batchPrompt = 16;
      // Rounds alternate 1 and 16 so both see the same (shared, drifting) machine; totals are summed.
      const c = { 1: new BatchTotals(), 16: new BatchTotals() };
      const prefill = { rows: 0, ms: 0 };
      for (let r = 0; r < z.rounds; r++) {
        for (const n of [1, 16] as const) {
          const t = c[n];
          const run = await part((s) => concurrent(s, n, batchPrompt, z.genTokens, vocab, t));
          const m = engine.summary(n);
          // The 16 prompts' first step is pure prefill: 16 × 15 rows, since each prompt's last
          // token is its first decode row. Its time per row is the prefill cost per row.
          if (n === 16) {
            const rows = n * (batchPrompt - 1);
            const p = engine.summary(rows);
            prefill.rows += p.atRows * rows;
            prefill.ms += p.atRowsMs;
          }
          t.steps += m.steps;
          t.deviceMs += m.deviceMs;
          t.decodeSteps += m.atRows;
          t.decodeStepMs += m.atRowsMs;
          t.wallMs += run.wallMs;
        }
      }
      for (const n of [1, 16] as const) {
        const t = c[n];
        figures[`c${n}_gen_tok_per_s`] = round(t.endToEndTokPerS);
        figures[`c${n}_decode_tok_per_s`] = round(t.decodeTokPerS);
        figures[`c${n}_decode_step_ms`] = round(t.meanDecodeStepMs);
        figures[`c${n}_runtime_ms_per_step`] = round(t.runtimeMsPerStep);
        log(
          `concurrency ${n}: ${round(t.endToEndTokPerS)} tok/s end to end, ${round(t.decodeTokPerS)} tok/s decoding; native decode step ${round(t.meanDecodeStepMs)} ms, runtime ${round(t.runtimeMsPerStep)} ms/step`,
        );
      }
      ratios.throughput_16_over_1 = round(c[16].endToEndTokPerS / c[1].endToEndTokPerS);
      ratios.decode_throughput_16_over_1 = round(c[16].decodeTokPerS / c[1].decodeTokPerS);
      // What the engine alone allows: 16 rows per batch-16 step against 1 per batch-1 step.
      ratios.engine_decode_16_over_1 = round((16 * c[1].meanDecodeStepMs) / c[16].meanDecodeStepMs);

      // Quick: short alternating phases, the long prompt cancelled after each "on".
      // Full: the decodes alone, then beside the whole long prompt, then alone again.
      const plan = quick ? (["off", "on", "off", "on", "off"] as const) : (["off", "on", "off"] as const);
      const offSteps = quick ? z.windowSteps : 100;
      // Decodes of 32 + 3500 tokens outlast 100 + ≤ 2044 (a 4088-token prompt at ≥ 2 rows a step)
      // + 1300 steps, and their reservations (8 × 222 pages) leave the long prompt its 256 of 2048.
      const w = await part((s) => interference(s, vocab, plan, offSteps, z.windowSteps, 1300, 3500));
      const iv = w.value;
      const ratio = percentile(iv.on, 99) / percentile(iv.off, 99);
      log(
        `long prompt: ${iv.longPrefilledTokens} tokens prefilled in ${round(iv.longPrefillMs)} ms; decode ITL p99 ${round(percentile(iv.on, 99))} ms beside it, ${round(percentile(iv.off, 99))} ms alone (${iv.phases.join(", ")})`,
      );
      figures.itl_p99_with_long_prompt_ms = round(percentile(iv.on, 99));
      figures.itl_p50_with_long_prompt_ms = round(percentile(iv.on, 50));
      figures.itl_p99_without_long_prompt_ms = round(percentile(iv.off, 99));
      figures.itl_p50_without_long_prompt_ms = round(percentile(iv.off, 50));
      figures.long_prompt_prefilled_tokens = iv.longPrefilledTokens;
      figures.long_prompt_prefill_tok_per_s = round(iv.longPrefilledTokens / (iv.longPrefillMs / 1000));
      if (iv.longTtftMs.length > 0) figures.long_prompt_ttft_ms = round(Math.max(...iv.longTtftMs));
      ratios.itl_p99_with_long_prompt_over_without = round(ratio);
      ratios.itl_p50_with_long_prompt_over_without = round(percentile(iv.on, 50) / percentile(iv.off, 50));

      // (With maxBatchTokens under 256 no step is pure prefill: the runtime's own calibration then.)
      const prefillPerTokenMs =
        prefill.rows > 0 ? prefill.ms / prefill.rows : w.rt.stats().calibration.prefillPerTokenMs.value;
      figures.prefill_tok_per_s = round(1000 / prefillPerTokenMs);
      // Offered load: LOAD_FACTOR of the capacity the measured costs imply for
      // this run's work (each request's suffix rows and its tokens at the
      // batched decode rate, plus each shared prefix computed once).
      const perRequestS = (mean(z.suffix) * prefillPerTokenMs) / 1000 + mean(z.gen) / c[16].decodeTokPerS;
      const prefixS = (z.prefixes.reduce((a, b) => a + b, 0) * prefillPerTokenMs) / 1000;
      const rate = (LOAD_FACTOR * z.requests) / (z.requests * perRequestS + prefixS);
      log(`poisson: ${z.requests} requests at ${round(rate)} req/s`);
      const p = await part((s) => poisson(s, vocab, z, rate));
      const pm = engine.summary();
      const pv = p.value;
      figures.gen_tok_per_s = round(pv.generated / pv.wallS);
      figures.prompt_tok_per_s = round(pv.promptTokens / pv.wallS);
      figures.computed_prompt_tok_per_s = round(pv.computedPromptTokens / pv.wallS);
      figures.ttft_p50_ms = round(percentile(pv.ttft, 50));
      figures.ttft_p99_ms = round(percentile(pv.ttft, 99));
      figures.itl_p50_ms = round(percentile(pv.itl, 50));
      figures.itl_p99_ms = round(percentile(pv.itl, 99));
      figures.prefix_reuse_fraction = round(
        pv.cachedPromptTokens / (pv.cachedPromptTokens + pv.computedPromptTokens),
      );
      figures.max_in_flight = pv.maxRunning;
      figures.poisson_wall_s = round(pv.wallS);
      figures.poisson_engine_busy_fraction = round(pm.deviceMs / p.wallMs);
      const system = quick ? 256 : 1024;
      const b = (await part((s) => burst(s, vocab, system, 4))).value;
      log(
        `burst: ${BURST} prompts sharing a ${system}-token prefix, ${b.computed} of ${b.prompt} prompt tokens computed, ${b.shared} shared in flight; TTFT p50 ${round(percentile(b.ttft, 50))} ms`,
      );
      figures.burst_computed_prompt_tokens = b.computed;
      figures.burst_prompt_tokens = b.prompt;
      figures.burst_shared_in_flight_tokens = b.shared;
      figures.burst_ttft_p50_ms = round(percentile(b.ttft, 50));
      figures.burst_ttft_p99_ms = round(percentile(b.ttft, 99));
      ratios.burst_computed_over_prompt_tokens = round(b.computed / b.prompt);
      return {
        figures,
        ratios,
        env: {
          model: "small preset (seed 0)",
          backend: engine.backend,
          threads: engine.threads,
          page_tokens: PAGE_TOKENS,
          physical_pages: PHYSICAL_PAGES,
          scheduler: SCHED,
          sampling: SAMPLING,
          concurrency: { prompt_tokens: batchPrompt, gen_tokens: z.genTokens },
          interference: {
            decodes: DECODES,
            decode_prompt_tokens: DECODE_PROMPT,
            long_prompt_tokens: LONG_PROMPT,
            phases: iv.phases,
            itl_samples: { on: iv.on.length, off: iv.off.length },
          },
          burst: {
            requests: BURST,
            shared_prefix_tokens: system,
            suffix_tokens: BURST_SUFFIX,
            gen_tokens: 4,
          },
          poisson: {
            requests: z.requests,
            rate_req_per_s: round(rate),
            load_factor: LOAD_FACTOR,
            prefixes: z.prefixes,
            suffix_tokens: z.suffix,
            gen_tokens: z.gen,
            measured_prefill_per_token_ms: round(prefillPerTokenMs),
          },
        },
      };
    } finally {
      engine.free();
    }
  },
};
export default bench;
