import { join } from "node:path";
import type { Engine } from "../native/index.ts";
import { PageAllocator, PagedDecoder } from "../worker/model/decoder-paged.ts";
import { openEngine } from "../worker/model/engine.ts";
import { generateModel } from "../worker/model/generate.ts";
import { GLOBAL_LAYER } from "../worker/model/layout.ts";
import { type LoadedModel, loadModelDir } from "../worker/model/model-dir.ts";
import { Rng, seedRng } from "../worker/model/prng.ts";
import { percentile, round } from "./contract.ts";

/**
 * The decode part of `bench decode` for a sliding-window model: the `small`
 * shape as MistralForCausalLM with a 256-position window on every layer
 * (generated once under .continuum/models/small-mistral-sw), decoding at a
 * context of 8 windows, beside the same weights with every layer global
 * (the spec's layers replaced, nothing else). Both run on the paged decoder,
 * one sequence each, prefilled once; decode rounds alternate between the two
 * so a burst of other load lands in one round of one of them, and the
 * medians of step times leave it out. A global layer reads all 8 windows of
 * K/V per token, a sliding one the last window: the ratio is what the window
 * saves in attention, against the weight reads both pay.
 */
const MODEL_DIR = join(process.env.CONTINUUM_DATA_DIR ?? ".continuum", "models", "small-mistral-sw");
const PAGE = 16;

export interface SlidingFigures {
  readonly figures: Record<string, number>;
  readonly ratios: Record<string, number>;
  readonly env: Record<string, number>;
}

async function slidingModel(log: (l: string) => void): Promise<LoadedModel> {
  try {
    return await loadModelDir(MODEL_DIR, { variant: "bench" });
  } catch {
    log(`generating the small preset as mistral-sw into ${MODEL_DIR} (once)`);
    await generateModel({ preset: "small", arch: "mistral-sw", out: MODEL_DIR, seed: 0, force: true });
    return loadModelDir(MODEL_DIR, { variant: "bench" });
  }
}

export async function slidingDecode(quick: boolean, log: (l: string) => void): Promise<SlidingFigures> {
  const model = await slidingModel(log);
  const spec = model.config.spec;
  const layer = spec.layers[0]!;
  if (layer.kind !== "sliding") throw new Error(`${MODEL_DIR}: expected sliding layers`);
  const window = layer.window;
  const windows = quick ? 2 : 8;
  const context = windows * window;
  const steps = quick ? 4 : 32;
  const rounds = quick ? 1 : 5;
  const layouts = {
    sliding: spec,
    global: { ...spec, layers: spec.layers.map(() => GLOBAL_LAYER) },
  };
  const rng = new Rng(seedRng(2, "bench-sliding"));
  const prompt = Array.from({ length: context }, () => rng.nextU32() % spec.vocab);
  const engines: Engine[] = [];
  try {
    const runs: Record<
      string,
      { decoder: PagedDecoder; seq: ReturnType<PagedDecoder["open"]>; stepMs: number[] }
    > = {};
    const figures: Record<string, number> = {};
    for (const [name, s] of Object.entries(layouts)) {
      const engine = await openEngine(s, model.weights);
      engines.push(engine);
      const pages = Math.ceil((context + rounds * steps + 1) / PAGE);
      const decoder = new PagedDecoder(engine, new PageAllocator(pages), PAGE, 1);
      const seq = decoder.open();
      const t0 = performance.now();
      await decoder.step([{ seq, tokens: prompt }]);
      figures[`${name}_ctx${windows}w_prefill_tok_per_s`] = round(
        context / ((performance.now() - t0) / 1000),
      );
      runs[name] = { decoder, seq, stepMs: [] };
    }
    for (let r = 0; r < rounds; r++) {
      const names = Object.keys(runs);
      if (r % 2 === 1) names.reverse();
      for (const name of names) {
        const run = runs[name]!;
        for (let s = 0; s < steps; s++) {
          const ts = performance.now();
          await run.decoder.step([{ seq: run.seq, tokens: [(s * 7 + 3) % spec.vocab] }]);
          run.stepMs.push(performance.now() - ts);
        }
      }
    }
    for (const [name, run] of Object.entries(runs)) {
      const ms = percentile(run.stepMs, 50);
      figures[`${name}_ctx${windows}w_decode_tok_per_s`] = round(1000 / ms);
      log(
        `${name} layers at context ${context} (${windows} windows): decode ${round(1000 / ms)} tok/s (median step ${round(ms)} ms)`,
      );
    }
    const f = (k: string) => figures[k]!;
    return {
      figures,
      ratios: {
        sliding_over_global_decode: round(
          f(`sliding_ctx${windows}w_decode_tok_per_s`) / f(`global_ctx${windows}w_decode_tok_per_s`),
        ),
      },
      env: { sliding_window: window, sliding_context_tokens: context, sliding_decode_steps: steps * rounds },
    };
  } finally {
    for (const e of engines) e.free();
  }
}
