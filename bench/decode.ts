import { join } from "node:path";
import type { Engine } from "../native/engine.ts";
import { defaultThreads, features, kernels } from "../native/index.ts";
import type { Decoder } from "../worker/model/decoder.ts";
import { ContiguousDecoder } from "../worker/model/decoder-contiguous.ts";
import { PageAllocator, PagedDecoder } from "../worker/model/decoder-paged.ts";
import { openEngine } from "../worker/model/engine.ts";
import { quantizeModelDir } from "../worker/model/gguf-quantize.ts";
import { type LoadedModel, loadModelDir } from "../worker/model/model-dir.ts";
import { Rng, seedRng } from "../worker/model/prng.ts";
import { BANDWIDTH_BYTES, BandwidthProbe } from "./_bandwidth.ts";
import { BENCH_MODELS, SMALL_MODEL_DIR, smallModel } from "./_models.ts";
import { slidingDecode } from "./_sliding.ts";
import { type Bench, percentile, round } from "./contract.ts";

const median = (xs: readonly number[]): number => percentile(xs, 50);

/**
 * Decode throughput of the `small` preset (12 layers, hidden 768, bf16),
 * paged and contiguous side by side, at batch 1, 4 and 16: prefill tokens/s
 * (one step of batch × prompt rows) and decode tokens/s (steps of one token
 * per sequence), medians over rounds that alternate the layouts. Memory bandwidth is measured in the same run by the shared
 * probe (bench/_bandwidth.ts: memcpy bytes copied/s and streaming-read
 * bytes/s) and compared with what batch-1 decode implies: weight bytes read
 * per token × tokens/s. Decode only reads weights, so the goal ratio
 * (issue 5: ≥ 0.6) is paged_b1_decode_over_read_bandwidth; the memcpy ratio
 * is printed beside it. The probe's buffer is larger than any last-level
 * cache, but the preset's 164 MB of weights may partly stay in a large one
 * between steps, so the ratio can exceed 1 there.
 *
 * Issue 22: the same model quantized to Q8_0 and Q4_0 (GGUF, written once
 * beside it) decodes at batch 1 beside bf16 in the same rounds:
 * q8_0_over_bf16_decode_b1 (goal ≥ 1.7) and q4_0_over_bf16_decode_b1 (goal
 * ≥ 2.5), each format's weight bytes per token × tokens/s over the read
 * bandwidth; prefill_over_gemm_rate divides the batch-16 prefill's weight
 * math (prefillMultiplyAdds: the LM head only for each sequence's last row)
 * by the bf16 GEMM rate at the model's up-projection shape, measured in the
 * rounds of the prefills it divides (goal ≥ 0.8).
 *
 * The model is generated once under .continuum/models/small (seed 0) and
 * reused. Then a sliding-window run (bench/_sliding.ts): decode tokens/s of
 * the small shape with a 256-position window on every layer at a context of
 * 8 windows, beside the same weights with every layer global, and with
 * Gemma 3's pattern (every 6th layer global) on a route per layer group.
 */
/** The same model in GGUF block formats, beside bf16 (issue 22). */
const QUANTIZED = ["q8_0", "q4_0"] as const;
const PAGE = 16;
const BATCHES = [1, 4, 16] as const;

/** The small model quantized to `scheme` (written once beside the bf16 one). */
async function quantizedModel(
  scheme: (typeof QUANTIZED)[number],
  log: (l: string) => void,
): Promise<LoadedModel> {
  const file = join(BENCH_MODELS, `small-${scheme}.gguf`);
  try {
    return await loadModelDir(file, { variant: "bench" });
  } catch {
    log(`quantizing the small preset to ${file} (once)`);
    await quantizeModelDir(SMALL_MODEL_DIR, file, scheme, { force: true });
    return loadModelDir(file, { variant: "bench" });
  }
}

/** Bytes one decode token streams from weights: every matrix once, the embedding only one row. */
function weightBytesPerToken(model: LoadedModel): number {
  let n = 0;
  for (const [name, t] of model.weights.tensors)
    n += name === "model.embed_tokens.weight" && !model.config.spec.tiedEmbeddings ? 0 : t.data.byteLength;
  return n;
}

/**
 * Multiply-adds of the weight matrices a prefill of `batch` sequences of
 * `promptLen` tokens runs: every layer's matrices once per token, the LM head
 * (lm_head, or the tied embedding) only for each sequence's last row, the one
 * that needs logits; the untied embedding is a lookup. FLOPs = 2 · this.
 */
function prefillMultiplyAdds(model: LoadedModel, batch: number, promptLen: number): number {
  const tied = model.config.spec.tiedEmbeddings;
  let n = 0;
  for (const [name, t] of model.weights.tensors) {
    if (t.shape.length !== 2) continue;
    const params = t.shape[0]! * t.shape[1]!;
    const head = name === "lm_head.weight" || (tied && name === "model.embed_tokens.weight");
    if (head) n += params * batch;
    else if (name !== "model.embed_tokens.weight") n += params * batch * promptLen;
  }
  return n;
}

/** GFLOP/s of the bf16 GEMM at the model's up-projection shape with `T` rows (kernels.matmul, the fastest of `reps`). */
function gemmRate(K: number, N: number, T: number, reps: number): number {
  const x = new Float32Array(T * K).map((_, i) => Math.cos(i) * 0.1);
  const w = new Uint16Array(N * K).map((_, i) => 0x3c00 + (i % 977));
  const y = new Float32Array(T * N);
  const wb = new Uint8Array(w.buffer);
  kernels.matmul(x, T, K, wb, "bf16", N, null, y);
  const ts: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    kernels.matmul(x, T, K, wb, "bf16", N, null, y);
    ts.push((performance.now() - t0) / 1000);
  }
  // The fastest rep: the rate the kernel reaches at this shape, which load on a shared host only lowers.
  return (2 * T * K * N) / Math.min(...ts) / 1e9;
}

interface Run {
  prefillMs: number;
  /** Wall time of each decode step. */
  stepMs: number[];
  /** Process CPU time (all threads) per decode step: on a shared machine it moves less than wall time. */
  decodeCpuMsPerStep: number;
}

async function measure(
  d: Decoder,
  batch: number,
  promptLen: number,
  steps: number,
  vocab: number,
): Promise<Run> {
  const rng = new Rng(seedRng(1, "bench-prompts"));
  const seqs = Array.from({ length: batch }, () => d.open());
  try {
    const prompts = seqs.map(() => Array.from({ length: promptLen }, () => rng.nextU32() % vocab));
    const t0 = performance.now();
    await d.step(seqs.map((seq, i) => ({ seq, tokens: prompts[i]! })));
    const prefillMs = performance.now() - t0;
    await d.step(seqs.map((seq) => ({ seq, tokens: [1] }))); // warm the decode path
    const cpu0 = process.cpuUsage();
    const stepMs: number[] = [];
    for (let s = 0; s < steps; s++) {
      const ts = performance.now();
      await d.step(seqs.map((seq) => ({ seq, tokens: [(s * 7 + 3) % vocab] })));
      stepMs.push(performance.now() - ts);
    }
    const cpu = process.cpuUsage(cpu0);
    return { prefillMs, stepMs, decodeCpuMsPerStep: (cpu.user + cpu.system) / 1000 / steps };
  } finally {
    for (const s of seqs) d.close(s);
  }
}

const bench: Bench = {
  summary:
    "prefill/decode tokens/s, paged vs contiguous, batch 1/4/16, vs measured memory bandwidth; sliding-window and mixed sliding/global vs all-global decode and K/V held",
  async run({ quick, log }) {
    const promptLen = quick ? 16 : 128;
    const steps = quick ? 4 : 32;
    const rounds = quick ? 2 : 5;
    const model = await smallModel(log);
    const spec = model.config.spec;
    // Bytes one decode token streams from weights: every matrix once, the embedding only one row.
    let weightBytes = 0;
    for (const [name, t] of model.weights.tensors)
      weightBytes += name === "model.embed_tokens.weight" && !spec.tiedEmbeddings ? 0 : t.data.byteLength;
    const probe = new BandwidthProbe();
    for (let i = 0; i < (quick ? 3 : 7); i++) probe.sample();
    const bw = probe.result();
    log(
      `bandwidth: memcpy ${round(bw.memcpy_gb_per_s)} GB/s copied, read ${round(bw.read_gb_per_s)} GB/s; weight bytes per token ${weightBytes}`,
    );

    const ctx = promptLen + steps + 2;
    const engines: Engine[] = [];
    const gemm: number[] = [];
    const figures: Record<string, number> = {
      memcpy_gb_per_s: round(bw.memcpy_gb_per_s),
      read_gb_per_s: round(bw.read_gb_per_s),
      weight_bytes_per_token: weightBytes,
    };
    try {
      // One engine, so one copy of the weights, serves both layouts (it holds a
      // page pool and a contiguous cache side by side): with two engines the
      // comparison also measured where each copy of the 164 MB landed in
      // memory and in the last-level cache.
      const engine = await openEngine(spec, model.weights);
      engines.push(engine);
      const decoders: Record<string, Decoder> = {
        contiguous: new ContiguousDecoder(engine, 16, ctx),
        paged: new PagedDecoder(engine, new PageAllocator(16 * Math.ceil(ctx / PAGE)), PAGE, 16),
      };
      // Rounds, each measuring every (batch, layout) pair, the layouts' order
      // alternating between rounds: a burst of other load on this shared
      // machine lands in one round of one pair, and the medians over rounds
      // (of step times, prefill times and CPU per step) leave it out.
      const runs = new Map<string, Run[]>();
      for (let round_ = 0; round_ < rounds; round_++) {
        // The GEMM reference in the same rounds as the prefills it divides.
        gemm.push(gemmRate(spec.hidden, spec.ffn, 16 * promptLen, 10));
        for (const batch of BATCHES) {
          const kinds = Object.keys(decoders);
          if (round_ % 2 === 1) kinds.reverse();
          for (const kind of kinds) {
            const r = await measure(decoders[kind]!, batch, promptLen, steps, spec.vocab);
            const key = `${kind}_b${batch}`;
            runs.set(key, [...(runs.get(key) ?? []), r]);
          }
        }
      }
      for (const [key, rs] of runs) {
        const batch = Number(key.slice(key.lastIndexOf("_b") + 2));
        const stepMs = median(rs.flatMap((r) => r.stepMs));
        const prefillMs = median(rs.map((r) => r.prefillMs));
        const cpuMs = median(rs.map((r) => r.decodeCpuMsPerStep));
        figures[`${key}_prefill_tok_per_s`] = round((batch * promptLen) / (prefillMs / 1000));
        figures[`${key}_decode_tok_per_s`] = round(batch / (stepMs / 1000));
        figures[`${key}_decode_cpu_ms_per_step`] = round(cpuMs);
        log(
          `${key.replace("_b", " batch ")}: prefill ${figures[`${key}_prefill_tok_per_s`]} tok/s, decode ` +
            `${figures[`${key}_decode_tok_per_s`]} tok/s (median step ${round(stepMs)} ms, ${round(cpuMs)} ms CPU)`,
        );
      }
    } finally {
      for (const e of engines) e.free();
    }
    // The same model at Q8_0 and Q4_0 beside bf16: batch-1 paged decode,
    // rounds alternating the formats' order; and the bf16 prefill's weight
    // math against the GEMM rate measured here.
    const formats: { key: string; model: LoadedModel }[] = [{ key: "bf16", model }];
    for (const q of QUANTIZED) formats.push({ key: q, model: await quantizedModel(q, log) });
    const qRuns = new Map<string, Run[]>();
    const qEngines: Engine[] = [];
    try {
      const decoders = new Map<string, Decoder>();
      for (const { key, model: m } of formats) {
        const e = await openEngine(m.config.spec, m.weights);
        qEngines.push(e);
        decoders.set(key, new PagedDecoder(e, new PageAllocator(16 * Math.ceil(ctx / PAGE)), PAGE, 16));
      }
      for (let round_ = 0; round_ < rounds; round_++) {
        const keys = [...decoders.keys()];
        if (round_ % 2 === 1) keys.reverse();
        for (const key of keys) {
          const r = await measure(decoders.get(key)!, 1, promptLen, steps, spec.vocab);
          qRuns.set(key, [...(qRuns.get(key) ?? []), r]);
        }
      }
    } finally {
      for (const e of qEngines) e.free();
    }
    for (const { key, model: m } of formats) {
      const rs = qRuns.get(key)!;
      const tokS = 1 / (median(rs.flatMap((r) => r.stepMs)) / 1000);
      const bytes = weightBytesPerToken(m);
      figures[`${key}_b1_decode_tok_per_s`] = round(tokS);
      figures[`${key}_weight_bytes_per_token`] = bytes;
      figures[`${key}_b1_decode_weight_gb_per_s`] = round((bytes * tokS) / 1e9);
      log(`${key}: batch-1 decode ${round(tokS)} tok/s, ${bytes} weight bytes per token`);
    }
    // The fastest over every round: what the kernel reaches at this shape (load only lowers it),
    // so a burst of other work on a shared host cannot flatter the ratio.
    const gemmGflops = Math.max(...gemm);
    const prefillMs = (16 * promptLen) / (figures.paged_b16_prefill_tok_per_s! / 1000);
    const prefillGflops = (2 * prefillMultiplyAdds(model, 16, promptLen)) / prefillMs / 1e6;
    figures.gemm_bf16_gflop_per_s = round(gemmGflops);
    figures.paged_b16_prefill_weight_gflop_per_s = round(prefillGflops);
    log(
      `prefill (16 × ${promptLen} tokens) ${round(prefillGflops)} GFLOP/s of weight math; GEMM ${round(gemmGflops)} GFLOP/s`,
    );
    const sliding = await slidingDecode(quick, log);
    Object.assign(figures, sliding.figures);
    const f = (k: string) => figures[k]!;
    const b1Bw = (weightBytes * f("paged_b1_decode_tok_per_s")) / 1e9;
    figures.paged_b1_decode_weight_gb_per_s = round(b1Bw);
    return {
      figures,
      ratios: {
        paged_over_contiguous_decode_b1: round(
          f("paged_b1_decode_tok_per_s") / f("contiguous_b1_decode_tok_per_s"),
        ),
        paged_over_contiguous_decode_b16: round(
          f("paged_b16_decode_tok_per_s") / f("contiguous_b16_decode_tok_per_s"),
        ),
        paged_over_contiguous_prefill_b16: round(
          f("paged_b16_prefill_tok_per_s") / f("contiguous_b16_prefill_tok_per_s"),
        ),
        paged_b16_over_b1_decode: round(f("paged_b16_decode_tok_per_s") / f("paged_b1_decode_tok_per_s")),
        // The same ratio from CPU time per step (16 · b1 CPU / b16 CPU): what
        // the batch saves in work, less moved by other load on the machine.
        paged_b16_over_b1_decode_cpu: round(
          (16 * f("paged_b1_decode_cpu_ms_per_step")) / f("paged_b16_decode_cpu_ms_per_step"),
        ),
        paged_b1_decode_over_read_bandwidth: round(b1Bw / bw.read_gb_per_s),
        q8_0_over_bf16_decode_b1: round(f("q8_0_b1_decode_tok_per_s") / f("bf16_b1_decode_tok_per_s")),
        q4_0_over_bf16_decode_b1: round(f("q4_0_b1_decode_tok_per_s") / f("bf16_b1_decode_tok_per_s")),
        bf16_b1_decode_over_read_bandwidth: round(f("bf16_b1_decode_weight_gb_per_s") / bw.read_gb_per_s),
        q8_0_b1_decode_over_read_bandwidth: round(f("q8_0_b1_decode_weight_gb_per_s") / bw.read_gb_per_s),
        q4_0_b1_decode_over_read_bandwidth: round(f("q4_0_b1_decode_weight_gb_per_s") / bw.read_gb_per_s),
        prefill_over_gemm_rate: round(prefillGflops / gemmGflops),
        paged_b1_decode_over_memcpy_bandwidth: round(b1Bw / bw.memcpy_gb_per_s),
        ...sliding.ratios,
      },
      env: {
        model: "small preset (seed 0)",
        params_bytes: weightBytes,
        prompt_tokens: promptLen,
        decode_steps: steps,
        rounds,
        page_tokens: PAGE,
        bandwidth_bytes: BANDWIDTH_BYTES,
        threads: defaultThreads,
        cpu_features: features,
        int8_tiles: kernels.int8Tiles(),
        ...sliding.env,
      },
    };
  },
};
export default bench;
