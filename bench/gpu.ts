import { spawn } from "node:child_process";
import { access, mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { BackendChoice, BackendName } from "../native/backends.ts";
import type { Engine } from "../native/engine.ts";
import { cudaCopyGbPerS } from "../native/index.ts";
import { pagesFor, type TokenCount } from "../schema/ids.ts";
import { PageAllocator, PagedDecoder } from "../worker/model/decoder-paged.ts";
import { openEngine } from "../worker/model/engine.ts";
import { generateModel, type Preset } from "../worker/model/generate.ts";
import { type LoadedModel, loadModelDir } from "../worker/model/model-dir.ts";
import { chooseEngine } from "../worker/runtime/engine-load.ts";
import { BandwidthProbe } from "./_bandwidth.ts";
import { checkExactness, promptOf } from "./_exact.ts";
import { complete, decodeRate, metrics, readyReplicas, type ServeHandle, startServe } from "./_serve-load.ts";
import { type Bench, round } from "./contract.ts";

/**
 * A worker on the GPU end to end (native/gpu-serve-check.sh runs it on the
 * H200 machine; on a CPU machine it runs the same phases on the CPU engine):
 *
 * 1. `continuum serve` (a child process) over HTTP: decode tokens/s of 1, 16
 *    and 64 concurrent greedy streams, and the weight bandwidth that implies
 *    (weight bytes per step × steps/s) as a share of the device's copy
 *    bandwidth measured here (read + write, as native/gpu-check.sh); prefill
 *    tokens/s of concurrent 4096-token prompts.
 * 2. TTFT of a 4096-token prompt: cold; with 3840 tokens resident (a second
 *    prompt sharing them); restored from RAM (after an unrelated prompt
 *    evicted the pages; the chunks must have been checkpointed: the
 *    checkpointer's own cost decision, reported as found); from local files
 *    after a restart (which may be in the OS page cache).
 * 3. In process, the engine's step split by CUDA events (GEMM, attention,
 *    the rest) at each decode batch and a 4096-row prefill step, and the host
 *    time around it; then the determinism contract through the store path
 *    (bench/_exact.ts: restore bit-identical to recompute, batch of 16,
 *    prefill chunking).
 * 4. The same weights through a plain PyTorch Llama (bench/_torch_llama.py,
 *    bf16, SDPA): decode at batch 1 and 16, prefill; continuum / PyTorch
 *    ratios, and the two engines' last-row logits of one prompt compared.
 *
 * Environment: CONTINUUM_WORKER_BACKEND (auto|cpu|cuda, passed to serve too),
 * CONTINUUM_BENCH_GPU_MODEL_DIR (a model directory; default the generated
 * `bench` preset, `tiny` under --quick, in .continuum/models/),
 * CONTINUUM_BENCH_GPU_PYTHON (the interpreter for step 4, default python3;
 * "off" skips it). --quick: small sizes for a CPU machine (seconds).
 */
interface Sizes {
  readonly preset: Preset;
  readonly batches: readonly number[];
  readonly decodePrompt: number;
  readonly decodeTokens: number;
  readonly prefillTokens: number;
  readonly prefillCount: number;
  readonly ttftTokens: number;
  /** Tokens of the TTFT prompt shared by the second prompt: whole chunks. */
  readonly sharedTokens: number;
  readonly exactTokens: number;
  readonly profileSteps: number;
  readonly torchDecode: number;
}

const FULL: Sizes = {
  preset: "bench",
  batches: [1, 16, 64],
  decodePrompt: 64,
  decodeTokens: 256,
  prefillTokens: 4096,
  prefillCount: 4,
  ttftTokens: 4096,
  sharedTokens: 3840,
  exactTokens: 4096,
  profileSteps: 20,
  torchDecode: 128,
};

const QUICK: Sizes = {
  preset: "tiny",
  batches: [1, 4],
  decodePrompt: 32,
  decodeTokens: 24,
  prefillTokens: 512,
  prefillCount: 2,
  ttftTokens: 600,
  sharedTokens: 512,
  exactTokens: 600,
  profileSteps: 4,
  torchDecode: 16,
};

const PAGE = 16;

async function benchModel(sizes: Sizes, variant: string, log: (l: string) => void): Promise<LoadedModel> {
  let dir = process.env.CONTINUUM_BENCH_GPU_MODEL_DIR ?? "";
  if (dir === "") {
    dir = join(process.env.CONTINUUM_DATA_DIR ?? ".continuum", "models", sizes.preset);
    const have = await access(join(dir, "config.json")).then(
      () => true,
      () => false,
    );
    if (!have) {
      log(`generating the ${sizes.preset} preset into ${dir} (once)`);
      await generateModel({ preset: sizes.preset, out: dir, seed: 0, force: true });
    }
  }
  return loadModelDir(dir, { variant });
}

/** Bytes one decode step reads from weights: every matrix once (the embedding only a row a token). */
function weightBytesPerStep(model: LoadedModel): number {
  let bytes = 0;
  for (const [name, t] of model.weights.tensors)
    if (name !== "model.embed_tokens.weight" || model.config.spec.tiedEmbeddings) bytes += t.data.byteLength;
  return bytes;
}

/** The yardstick: device copy GB/s (read + write) on CUDA; on the CPU, twice memcpy's bytes copied/s. */
function copyBandwidth(backend: BackendName): number {
  if (backend === "cuda") return cudaCopyGbPerS();
  const probe = new BandwidthProbe();
  for (let i = 0; i < 5; i++) probe.sample();
  return 2 * probe.result().memcpy_gb_per_s;
}

interface StepSplit {
  readonly wallMs: number;
  readonly deviceMs: number | null;
  readonly gemmMs: number | null;
  readonly attentionMs: number | null;
}

/** Steps of `batch` sequences at `ctx` tokens, timed on the host and (CUDA) by part on the device. */
async function stepSplit(
  engine: Engine,
  dec: PagedDecoder,
  batch: number,
  ctx: number,
  steps: number,
  prefillRows: number,
): Promise<StepSplit> {
  const vocab = engine.spec.vocab;
  const seqs = Array.from({ length: batch }, () => dec.open());
  try {
    if (prefillRows === 0) {
      await dec.step(seqs.map((seq, i) => ({ seq, tokens: promptOf(ctx, 50 + i, vocab) })));
      await dec.step(seqs.map((seq) => ({ seq, tokens: [1] })));
    }
    let profiled = true;
    try {
      engine.setProfiling(true);
    } catch {
      profiled = false; // the CPU engine does not time its steps by part
    }
    const wall: number[] = [];
    for (let s = 0; s < steps; s++) {
      if (prefillRows > 0) {
        const seq = seqs[0]!;
        const t0 = performance.now();
        await dec.step([{ seq, tokens: promptOf(prefillRows, 70 + s, vocab) }]);
        wall.push(performance.now() - t0);
        dec.close(seq);
        seqs[0] = dec.open();
      } else {
        const t0 = performance.now();
        await dec.step(seqs.map((seq) => ({ seq, tokens: [(s * 7 + 3) % vocab] })));
        wall.push(performance.now() - t0);
      }
    }
    const p = engine.profile();
    if (profiled) engine.setProfiling(false);
    const n = Math.max(1, p.steps);
    return {
      wallMs: wall.reduce((a, b) => a + b, 0) / wall.length,
      deviceMs: profiled ? p.stepMs / n : null,
      gemmMs: profiled ? p.gemmMs / n : null,
      attentionMs: profiled ? p.attentionMs / n : null,
    };
  } finally {
    for (const s of seqs) dec.close(s);
  }
}

/** Runs the PyTorch side; null when it is off or fails (the reason is logged). */
async function torchSide(
  python: string,
  model: LoadedModel,
  backend: BackendName,
  sizes: Sizes,
  logitsPrompt: readonly number[],
  logitsOut: string,
  log: (l: string) => void,
): Promise<Record<string, unknown> | null> {
  const script = fileURLToPath(new URL("./_torch_llama.py", import.meta.url));
  const args = [
    script,
    "--model",
    model.dir,
    "--device",
    backend === "cuda" ? "cuda" : "cpu",
    "--batches",
    sizes.batches.slice(0, 2).join(","),
    "--prompt",
    String(sizes.decodePrompt),
    "--decode",
    String(sizes.torchDecode),
    "--prefill",
    String(sizes.prefillTokens),
    "--logits-prompt",
    logitsPrompt.join(","),
    "--logits-out",
    logitsOut,
  ];
  const out = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    const child = spawn(python, args, { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    child.on("error", (e) => resolve({ code: -1, stdout, stderr: String(e) }));
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
  if (out.code !== 0) {
    log(`pytorch side failed (exit ${out.code}): ${out.stderr.trim().split("\n").slice(-5).join(" | ")}`);
    return null;
  }
  return JSON.parse(out.stdout.trim().split("\n").at(-1)!) as Record<string, unknown>;
}

function relL2(a: Float32Array, b: Float32Array): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; i++) {
    num += (a[i]! - b[i]!) ** 2;
    den += b[i]! ** 2;
  }
  return Math.sqrt(num / den);
}

const bench: Bench = {
  summary:
    "serve on the GPU end to end: decode b1/16/64, prefill, TTFT cold/resident/RAM/SSD, step split, exactness, vs PyTorch",
  async run({ quick, log }) {
    const sizes = quick ? QUICK : FULL;
    const choice = chooseEngine((process.env.CONTINUUM_WORKER_BACKEND ?? "auto") as BackendChoice, "auto");
    const backend = choice.backend;
    const model = await benchModel(sizes, choice.variant, log);
    const spec = model.config.spec;
    const weightBytes = weightBytesPerStep(model);
    const copyGbs = copyBandwidth(backend);
    log(
      `engine ${backend} (${choice.variant}); model ${model.dir}; ${weightBytes} weight bytes a step; copy ${round(copyGbs)} GB/s`,
    );
    const figures: Record<string, number | string | boolean | null> = {
      backend,
      variant: choice.variant,
      copy_gb_per_s: round(copyGbs),
      weight_bytes_per_step: weightBytes,
    };
    const ratios: Record<string, number | null> = {};
    const dataDir = await mkdtemp(join(tmpdir(), "continuum-bench-gpu-"));
    const serveEnv = (pages: number, dir: string): Record<string, string> => ({
      CONTINUUM_MODEL_DIR: model.dir,
      CONTINUUM_STORE_DATA_DIR: dir,
      CONTINUUM_WORKER_BACKEND: backend,
      CONTINUUM_PAGES_PHYSICAL_PAGES: String(pages),
      CONTINUUM_SCHEDULER_MAX_BATCH_SEQS: String(Math.max(64, ...sizes.batches)),
      CONTINUUM_SCHEDULER_MAX_BATCH_TOKENS: String(Math.max(512, sizes.prefillTokens)),
      CONTINUUM_SCHEDULER_PREFILL_TILE: String(sizes.prefillTokens),
      CONTINUUM_LOG_LEVEL: "info",
    });
    const readyMs = quick ? 120_000 : 300_000;
    let serve: ServeHandle | undefined;
    try {
      // ---- 1. throughput -----------------------------------------------------
      const maxB = Math.max(...sizes.batches);
      const pages =
        Math.max(
          maxB * pagesFor((sizes.decodePrompt + sizes.decodeTokens + 1) as TokenCount, PAGE),
          sizes.prefillCount * pagesFor((sizes.prefillTokens + 1) as TokenCount, PAGE),
        ) + 64;
      serve = await startServe(serveEnv(pages, join(dataDir, "a")), readyMs);
      await complete(serve, promptOf(sizes.decodePrompt, 1, spec.vocab), 4); // warm-up
      const serveTokPerS: Record<number, number> = {};
      for (const b of sizes.batches) {
        const prompts = Array.from({ length: b }, (_, i) =>
          promptOf(sizes.decodePrompt, 1000 * b + i, spec.vocab),
        );
        const r = await decodeRate(serve, prompts, sizes.decodeTokens);
        serveTokPerS[b] = r.tokPerS;
        const gbs = (weightBytes * (r.tokPerS / b)) / 1e9;
        figures[`decode_b${b}_tok_per_s`] = round(r.tokPerS);
        figures[`decode_b${b}_weight_gb_per_s`] = round(gbs);
        ratios[`decode_b${b}_weights_over_copy`] = round(gbs / copyGbs);
        log(`decode batch ${b}: ${round(r.tokPerS)} tok/s (${r.tokens} tokens), weights ${round(gbs)} GB/s`);
      }
      if (sizes.batches.includes(16)) ratios.decode_b16_over_b1 = round(serveTokPerS[16]! / serveTokPerS[1]!);
      const t0 = performance.now();
      await Promise.all(
        Array.from({ length: sizes.prefillCount }, (_, i) =>
          complete(serve!, promptOf(sizes.prefillTokens, 7000 + i, spec.vocab), 1),
        ),
      );
      const prefillTokPerS = (sizes.prefillCount * sizes.prefillTokens) / ((performance.now() - t0) / 1000);
      figures.prefill_tok_per_s = round(prefillTokPerS);
      log(`prefill ${sizes.prefillCount} x ${sizes.prefillTokens} tokens: ${round(prefillTokPerS)} tok/s`);
      await serve.stop();
      serve = undefined;

      // ---- 2. TTFT -----------------------------------------------------------
      // A pool that holds one long prompt and a second one's unshared tail, never two long prompts.
      const L = sizes.ttftTokens;
      const S = sizes.sharedTokens;
      const ttftPages = pagesFor((L + 1) as TokenCount, PAGE) + pagesFor((L - S + 1) as TokenCount, PAGE) + 2;
      const ttftDir = join(dataDir, "b");
      serve = await startServe(serveEnv(ttftPages, ttftDir), readyMs);
      const base = promptOf(L, 11, spec.vocab);
      const variantOf = (seed: number) => [...base.slice(0, S), ...promptOf(L - S, seed, spec.vocab)];
      const cold = await complete(serve, base, 1);
      const resident = await complete(serve, variantOf(12), 1);
      figures.ttft_cold_ms = round(cold.ms);
      figures.ttft_resident_ms = round(resident.ms);
      figures.ttft_resident_cached_tokens = resident.cachedTokens;
      ratios.ttft_resident_over_cold = round(resident.ms / cold.ms);
      const chunks = S / 256;
      const captured = await readyReplicas(serve, "ram", chunks, 15_000);
      figures.ttft_chunks_checkpointed = captured;
      if (captured) {
        await complete(serve, promptOf(L, 13, spec.vocab), 1); // evicts the shared prefix's pages
        await restoredTtft(serve, "ram", variantOf(14), cold.ms, figures, ratios);
        await readyReplicas(serve, "ssd", chunks, 30_000);
        await serve.stop();
        serve = await startServe(serveEnv(ttftPages, ttftDir), readyMs);
        await restoredTtft(serve, "ssd", variantOf(15), cold.ms, figures, ratios);
      } else {
        log(
          `the prompt's ${chunks} chunks were not checkpointed in time (the checkpointer's cost decision): no RAM/SSD TTFT`,
        );
        figures.ttft_ram_ms = null;
        figures.ttft_ssd_ms = null;
      }
      log(
        `ttft ${L} tokens: cold ${figures.ttft_cold_ms} ms, ${S} resident ${figures.ttft_resident_ms} ms, ` +
          `RAM ${figures.ttft_ram_ms} ms, SSD ${figures.ttft_ssd_ms} ms`,
      );
      await serve.stop();
      serve = undefined;
    } finally {
      await serve?.stop();
      await rm(dataDir, { recursive: true, force: true });
    }

    // ---- 3. the step split, exactness ------------------------------------------
    const engine = await openEngine(spec, model.weights, { backend });
    const logitsPrompt = promptOf(64, 99, spec.vocab);
    let ourLogits = new Float32Array(0);
    try {
      const maxB = Math.max(...sizes.batches);
      const dec = new PagedDecoder(
        engine,
        new PageAllocator(
          maxB * pagesFor((sizes.decodePrompt + sizes.profileSteps + 4) as TokenCount, PAGE) +
            pagesFor((sizes.prefillTokens + 1) as TokenCount, PAGE) +
            8,
        ),
        PAGE,
        maxB + 1,
      );
      const splits: [string, StepSplit, number | null][] = [];
      for (const b of sizes.batches) {
        const s = await stepSplit(engine, dec, b, sizes.decodePrompt, sizes.profileSteps, 0);
        const serveStepMs = figures[`decode_b${b}_tok_per_s`]
          ? (1000 * b) / (figures[`decode_b${b}_tok_per_s`] as number)
          : null;
        splits.push([`b${b}`, s, serveStepMs]);
      }
      splits.push([
        `prefill${sizes.prefillTokens}`,
        await stepSplit(engine, dec, 1, 0, 3, sizes.prefillTokens),
        null,
      ]);
      for (const [label, s, serveStepMs] of splits) {
        figures[`step_${label}_wall_ms`] = round(s.wallMs);
        figures[`step_${label}_device_ms`] = s.deviceMs === null ? null : round(s.deviceMs);
        figures[`step_${label}_gemm_ms`] = s.gemmMs === null ? null : round(s.gemmMs);
        figures[`step_${label}_attention_ms`] = s.attentionMs === null ? null : round(s.attentionMs);
        figures[`step_${label}_rest_ms`] =
          s.deviceMs === null ? null : round(s.deviceMs - (s.gemmMs ?? 0) - (s.attentionMs ?? 0));
        figures[`step_${label}_host_ms`] = s.deviceMs === null ? null : round(s.wallMs - s.deviceMs);
        if (serveStepMs !== null) figures[`serve_${label}_step_ms`] = round(serveStepMs);
      }
      const lone = dec.open();
      ourLogits = Float32Array.from((await dec.step([{ seq: lone, tokens: logitsPrompt }]))[0]!);
      dec.close(lone);
    } finally {
      engine.free();
    }
    const exact = await checkExactness(model, backend, sizes.exactTokens);
    figures.exact_restore = exact.restore;
    figures.exact_restore_tokens = exact.restoredTokens;
    figures.exact_batch16 = exact.batch16;
    figures.exact_chunking = exact.chunking;
    figures.inproc_ttft_restored_ms = round(exact.restoredFirstTokenMs);
    figures.inproc_ttft_recomputed_ms = round(exact.recomputedFirstTokenMs);
    ratios.inproc_ttft_restored_over_recomputed = round(
      exact.restoredFirstTokenMs / exact.recomputedFirstTokenMs,
    );
    log(
      `exactness: restore ${exact.restore}, batch of 16 ${exact.batch16}, chunking ${exact.chunking} (${exact.detail})`,
    );

    // ---- 4. PyTorch ------------------------------------------------------------------
    const python = process.env.CONTINUUM_BENCH_GPU_PYTHON ?? "python3";
    if (python !== "off") {
      const logitsFile = join(tmpdir(), `continuum-torch-logits-${process.pid}.f32`);
      const t = await torchSide(python, model, backend, sizes, logitsPrompt, logitsFile, log);
      if (t !== null) {
        const dec = t.decode_tok_per_s as Record<string, number>;
        for (const [b, v] of Object.entries(dec)) {
          figures[`torch_decode_b${b}_tok_per_s`] = round(v);
          const ours = figures[`decode_b${b}_tok_per_s`];
          ratios[`continuum_over_torch_decode_b${b}`] = typeof ours === "number" ? round(ours / v) : null;
        }
        figures.torch_prefill_tok_per_s = round(t.prefill_tok_per_s as number);
        ratios.continuum_over_torch_prefill = round(
          prefillRatio(figures.prefill_tok_per_s, t.prefill_tok_per_s),
        );
        figures.torch_version = String(t.torch);
        const raw = await readFile(logitsFile);
        const theirs = new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
        figures.torch_logits_rel_l2 = round(relL2(ourLogits, theirs), 3);
        await rm(logitsFile, { force: true });
        log(
          `pytorch ${t.torch} (${t.dtype}): ${JSON.stringify(t)}; last-row logits rel. L2 vs ours ${figures.torch_logits_rel_l2}`,
        );
      }
    }
    for (const line of table(figures, ratios, sizes)) log(line);
    return {
      figures,
      ratios,
      env: { model: model.dir, params_bytes: weightBytes, sizes, variant: choice.variant },
    };
  },
};

/** TTFT of `prompt` whose shared prefix `tier` holds: the time, the tokens cached and those the tier restored. */
async function restoredTtft(
  serve: ServeHandle,
  tier: "ram" | "ssd",
  prompt: readonly number[],
  coldMs: number,
  figures: Record<string, number | string | boolean | null>,
  ratios: Record<string, number | null>,
): Promise<void> {
  const r = await complete(serve, prompt, 1);
  const m = await metrics(serve);
  figures[`ttft_${tier}_ms`] = round(r.ms);
  figures[`ttft_${tier}_cached_tokens`] = r.cachedTokens;
  figures[`ttft_${tier}_restored_tokens`] =
    m.get(`continuum_cache_restored_tokens_total{tier="${tier}"}`) ?? 0;
  ratios[`ttft_${tier}_over_cold`] = round(r.ms / coldMs);
}

function prefillRatio(ours: unknown, theirs: unknown): number {
  return typeof ours === "number" && typeof theirs === "number" && theirs > 0 ? ours / theirs : Number.NaN;
}

/** The one table the device run reports (markdown). */
function table(
  f: Record<string, number | string | boolean | null>,
  r: Record<string, number | null>,
  sizes: Sizes,
): string[] {
  const pct = (x: number | null | undefined) => (typeof x === "number" ? `${round(100 * x)} %` : "n/a");
  const v = (x: unknown) => (x === null || x === undefined ? "n/a" : String(x));
  const lines = ["", "| figure | value |", "|---|---|", `| engine | ${f.backend}, ${f.variant} |`];
  lines.push(`| device copy bandwidth (read + write) | ${v(f.copy_gb_per_s)} GB/s |`);
  for (const b of sizes.batches)
    lines.push(
      `| decode, batch ${b} | ${v(f[`decode_b${b}_tok_per_s`])} tok/s; weights ${v(f[`decode_b${b}_weight_gb_per_s`])} GB/s = ${pct(r[`decode_b${b}_weights_over_copy`])} of copy |`,
    );
  if (r.decode_b16_over_b1 !== undefined)
    lines.push(`| decode batch 16 / batch 1 | ${v(r.decode_b16_over_b1)}x (goal >= 10x) |`);
  lines.push(
    `| prefill, ${sizes.prefillCount} x ${sizes.prefillTokens}-token prompts | ${v(f.prefill_tok_per_s)} tok/s |`,
  );
  lines.push(`| TTFT ${sizes.ttftTokens} tokens, cold | ${v(f.ttft_cold_ms)} ms |`);
  lines.push(
    `| TTFT, ${sizes.sharedTokens} resident | ${v(f.ttft_resident_ms)} ms (${v(r.ttft_resident_over_cold)} of cold) |`,
  );
  lines.push(
    `| TTFT, ${sizes.sharedTokens} restored from RAM | ${v(f.ttft_ram_ms)} ms (${v(r.ttft_ram_over_cold)} of cold; goal <= 0.1) |`,
  );
  lines.push(
    `| TTFT, ${sizes.sharedTokens} restored from local files | ${v(f.ttft_ssd_ms)} ms (${v(r.ttft_ssd_over_cold)} of cold; goal <= 0.1) |`,
  );
  for (const label of [...sizes.batches.map((b) => `b${b}`), `prefill${sizes.prefillTokens}`])
    lines.push(
      `| step ${label}: device / GEMM / attention / rest / host | ${v(f[`step_${label}_device_ms`])} / ${v(f[`step_${label}_gemm_ms`])} / ${v(f[`step_${label}_attention_ms`])} / ${v(f[`step_${label}_rest_ms`])} / ${v(f[`step_${label}_host_ms`])} ms` +
        (f[`serve_${label}_step_ms`] !== undefined
          ? `; serve's step ${v(f[`serve_${label}_step_ms`])} ms |`
          : " |"),
    );
  lines.push(
    `| in process: ${v(f.exact_restore_tokens)} of ${sizes.exactTokens} tokens restored from RAM vs all recomputed, to the first logits | ${v(f.inproc_ttft_restored_ms)} vs ${v(f.inproc_ttft_recomputed_ms)} ms (${v(r.inproc_ttft_restored_over_recomputed)}) |`,
  );
  lines.push(
    `| restore through the store, bit-identical to recompute | ${v(f.exact_restore)} (${v(f.exact_restore_tokens)} tokens restored) |`,
  );
  lines.push(
    `| a row alone == in a batch of 16; prefill chunking | ${v(f.exact_batch16)}; ${v(f.exact_chunking)} |`,
  );
  if (f.torch_version !== undefined) {
    for (const b of sizes.batches.slice(0, 2))
      lines.push(
        `| PyTorch decode batch ${b} | ${v(f[`torch_decode_b${b}_tok_per_s`])} tok/s; continuum / PyTorch ${v(r[`continuum_over_torch_decode_b${b}`])} |`,
      );
    lines.push(
      `| PyTorch prefill ${sizes.prefillTokens} | ${v(f.torch_prefill_tok_per_s)} tok/s; continuum / PyTorch ${v(r.continuum_over_torch_prefill)} |`,
    );
    lines.push(
      `| last-row logits, continuum vs PyTorch (rel. L2) | ${v(f.torch_logits_rel_l2)} (PyTorch ${f.torch_version}) |`,
    );
  }
  return lines;
}

export default bench;
