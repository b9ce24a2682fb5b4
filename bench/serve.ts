import { Rng, seedRng } from "../worker/model/prng.ts";
import { loadEngine } from "../worker/runtime/engine-load.ts";
import type { SubmitRequest } from "../worker/runtime/runtime-api.ts";
import { ConstraintCompiler } from "../worker/structured/constraint.ts";
import { smallModel } from "./_models.ts";
import {
  BatchTotals,
  concurrent,
  MeteredEngine,
  PAGE_TOKENS,
  PHYSICAL_PAGES,
  SAMPLING,
  type SchedulerSettings,
  type Session,
  session,
  tokens,
} from "./_serve-session.ts";
import {
  BURST,
  BURST_SUFFIX,
  burst,
  DECODE_PROMPT,
  DECODES,
  FULL,
  interference,
  LONG_PROMPT,
  poisson,
  QUICK,
} from "./_serve-workloads.ts";
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
const SCHED: SchedulerSettings = {
  maxBatchTokens: envInt("CONTINUUM_SERVE_MAX_BATCH_TOKENS", 256),
  prefillTile: envInt("CONTINUUM_SERVE_PREFILL_TILE", 128),
  minPrefillTokens: envInt("CONTINUUM_SERVE_MIN_PREFILL_TOKENS", 2),
  maxBatchSeqs: 64,
  /** 0 = unpaced (fixed tiles). */
  decodePace: envNumber("CONTINUUM_SERVE_DECODE_PACE", 1.8),
};

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
const LOAD_FACTOR = 0.5;

const mean = (r: readonly [number, number]) => (r[0] + r[1]) / 2;

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

      // The API's per-token extras at batch 16: top-5 log-probabilities, and a JSON-schema
      // constraint (a token mask each step). Cost per step = wall time of the runs over their
      // steps (device and runtime); rounds alternate the three so drift hits each alike.
      const compiler = new ConstraintCompiler(model.tokenizer.tokenBytes());
      const schema = {
        type: "object",
        properties: { name: { type: "string" }, tags: { type: "array", items: { type: "string" } } },
        required: ["name", "tags"],
      };
      const variants = {
        plain: {},
        logprobs: { logprobs: 5 },
        json_schema: { constraint: compiler.machine({ kind: "json_schema", schema }) },
      } satisfies Record<string, Partial<SubmitRequest>>;
      // 64 generated: more than the schema's shortest document (21 tokens here), in quick runs too.
      const EXTRAS_GEN = 64;
      const per = { plain: new BatchTotals(), logprobs: new BatchTotals(), json_schema: new BatchTotals() };
      for (let r = 0; r < z.rounds; r++) {
        for (const k of ["plain", "logprobs", "json_schema"] as const) {
          const t = per[k];
          const run = await part((s) => concurrent(s, 16, batchPrompt, EXTRAS_GEN, vocab, t, variants[k]));
          t.steps += engine.summary(16).steps;
          t.wallMs += run.wallMs;
        }
      }
      const msPerStep = (t: BatchTotals) => t.wallMs / t.steps;
      for (const k of ["plain", "logprobs", "json_schema"] as const)
        figures[`c16_${k}_ms_per_step`] = round(msPerStep(per[k]));
      ratios.logprobs_step_over_plain_b16 = round(msPerStep(per.logprobs) / msPerStep(per.plain));
      ratios.json_schema_step_over_plain_b16 = round(msPerStep(per.json_schema) / msPerStep(per.plain));
      log(
        `batch 16 per step: plain ${round(msPerStep(per.plain))} ms, top-5 logprobs ${round(msPerStep(per.logprobs))} ms, JSON schema ${round(msPerStep(per.json_schema))} ms`,
      );
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
