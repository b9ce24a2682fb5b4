import type { Engine } from "../native/engine.ts";
import { ContinuationId, TokenCount } from "../schema/ids.ts";
import { openEngine } from "../worker/model/engine.ts";
import {
  type AttentionLayout,
  GLOBAL_LAYER,
  type LayerGroups,
  layerGroups,
  releaseWindow,
} from "../worker/model/layout.ts";
import { Rng, seedRng } from "../worker/model/prng.ts";
import { buildGroupedBatch, GroupedRoutes } from "../worker/pages/layer-groups.ts";
import { PageHashChain } from "../worker/pages/page-hashes.ts";
import { PageManager } from "../worker/pages/page-manager.ts";
import { buildBatch } from "../worker/runtime/batch.ts";
import { benchModel } from "./_models.ts";
import { percentile, round } from "./contract.ts";

/**
 * The decode part of `bench decode` for a sliding-window model: the `small`
 * shape as MistralForCausalLM with a 256-position window on every layer
 * (generated once under .continuum/models/small-mistral-sw), decoding at a
 * context of 8 windows, beside the same weights with every layer global
 * (the spec's layers replaced, nothing else). Both run one sequence each
 * on the runtime's page policy (a PageManager route: the sliding one
 * releases the pages outside the window at every commit), prefilled once;
 * decode rounds alternate between the two so a burst of other load lands in
 * one round of one of them, and the medians of step times leave it out. A
 * global layer reads all 8 windows of K/V per token, a sliding one the last
 * window: the ratio is what the window saves in attention, against the
 * weight reads both pay. The K/V pages each holds at context 8 windows,
 * sliding over global, is what the release saves in memory (goal: the share
 * of global layers, 0 here, plus the window's own pages, 1/8).
 *
 * A third run, mixed: the same weights with Gemma 3's pattern (every 6th
 * layer global, the rest sliding), on a route per layer group over one pool
 * (worker/pages/layer-groups.ts). Its memory is counted in layer-pages (pages
 * held × layers a page holds), against the all-global run's pages × every
 * layer: mixed_layer_pages_over_global_layer_pages (goal: the share of global
 * layers, plus the sliding layers' window pages).
 */
const MODEL_NAME = "small-mistral-sw";
const PAGE = 16;

export interface SlidingFigures {
  readonly figures: Record<string, number>;
  readonly ratios: Record<string, number>;
  readonly env: Record<string, number>;
}

/** One sequence on a PageManager route, stepping the engine through the route's page tables. */
class RoutedSequence {
  private readonly pages: PageManager;
  private readonly chain = new PageHashChain(PAGE, undefined);
  private readonly tokens: number[] = [];
  private readonly route = ContinuationId("bench-sliding");

  constructor(
    private readonly engine: Engine,
    window: number | null,
    capacity: number,
  ) {
    const physicalPages = Math.ceil(capacity / PAGE);
    engine.createPool(physicalPages, PAGE);
    this.pages = new PageManager({ pageTokens: PAGE, physicalPages, window });
    this.pages.openRoute(this.route, { reserveTokens: TokenCount(capacity) });
  }

  async step(tokens: readonly number[]): Promise<void> {
    const first = this.tokens.length;
    const plan = this.pages.beginAppend(this.route, TokenCount(tokens.length));
    this.tokens.push(...tokens);
    const built = buildBatch([
      { tokens, firstPosition: first, slots: plan.slots, pageTable: plan.pageTable, wantLogits: true },
    ]);
    await this.engine.step(built.batch);
    const sealed = this.chain.extend(this.tokens, this.tokens.length).slice(Math.floor(first / PAGE));
    this.pages.commitAppend(this.route, sealed);
  }

  /** K/V pages the route holds: its table less the entries released outside the window. */
  get heldPages(): number {
    const r = this.pages.route(this.route);
    return r.pages.length - r.releasedPages;
  }
}

/** One sequence on a route per layer group (GroupedRoutes), stepping the engine through every group's table. */
class GroupedSequence {
  private readonly routes: GroupedRoutes;
  private readonly chain = new PageHashChain(PAGE, undefined);
  private readonly tokens: number[] = [];
  private readonly route = ContinuationId("bench-mixed");

  constructor(
    private readonly engine: Engine,
    private readonly groups: LayerGroups,
    capacity: number,
  ) {
    const physicalPages = groups.groups.length * Math.ceil(capacity / PAGE);
    engine.createPool(physicalPages, PAGE, groups.groupOf);
    this.routes = new GroupedRoutes(new PageManager({ pageTokens: PAGE, physicalPages }), groups);
    this.routes.open(this.route, { reserveTokens: TokenCount(capacity) });
  }

  async step(tokens: readonly number[]): Promise<void> {
    const first = this.tokens.length;
    const plans = this.routes.beginAppend(this.route, TokenCount(tokens.length));
    this.tokens.push(...tokens);
    await this.engine.step(
      buildGroupedBatch(
        [{ tokens, firstPosition: first, plans, wantLogits: true }],
        this.groups.groups.length,
      ),
    );
    const sealed = this.chain.extend(this.tokens, this.tokens.length).slice(Math.floor(first / PAGE));
    this.routes.commitAppend(this.route, sealed);
  }

  /** K/V pages held over every group, and in layer-pages (each page holds `slots` layers' rows). */
  get heldPages(): number {
    return this.routes.heldPages(this.route);
  }
  get heldLayerPages(): number {
    return this.heldPages * this.groups.slots;
  }
}

/** Gemma 3's pattern over these layers: every 6th global, the others as they are. */
function gemma3Pattern(layers: readonly AttentionLayout[]): AttentionLayout[] {
  return layers.map((l, i) => (i % 6 === 5 ? GLOBAL_LAYER : l));
}

export async function slidingDecode(quick: boolean, log: (l: string) => void): Promise<SlidingFigures> {
  const model = await benchModel(MODEL_NAME, { preset: "small", arch: "mistral-sw" }, log);
  const spec = model.config.spec;
  const layer = spec.layers[0]!;
  if (layer.kind !== "sliding") throw new Error(`${MODEL_NAME}: expected sliding layers`);
  const window = layer.window;
  const windows = quick ? 2 : 8;
  const context = windows * window;
  const steps = quick ? 4 : 32;
  const rounds = quick ? 1 : 5;
  const layouts = {
    sliding: spec,
    global: { ...spec, layers: spec.layers.map(() => GLOBAL_LAYER) },
    mixed: { ...spec, layers: gemma3Pattern(spec.layers) },
  };
  const rng = new Rng(seedRng(2, "bench-sliding"));
  const prompt = Array.from({ length: context }, () => rng.nextU32() % spec.vocab);
  const engines: Engine[] = [];
  try {
    const runs: Record<string, { seq: RoutedSequence | GroupedSequence; stepMs: number[] }> = {};
    const figures: Record<string, number> = {};
    for (const [name, s] of Object.entries(layouts)) {
      const engine = await openEngine(s, model.weights);
      engines.push(engine);
      const capacity = context + rounds * steps + 1;
      const seq =
        name === "mixed"
          ? new GroupedSequence(engine, layerGroups(s.layers), capacity)
          : new RoutedSequence(engine, releaseWindow(s.layers), capacity);
      const t0 = performance.now();
      await seq.step(prompt);
      figures[`${name}_ctx${windows}w_prefill_tok_per_s`] = round(
        context / ((performance.now() - t0) / 1000),
      );
      figures[`${name}_ctx${windows}w_kv_pages_held`] = seq.heldPages;
      figures[`${name}_ctx${windows}w_kv_layer_pages_held`] =
        seq instanceof GroupedSequence ? seq.heldLayerPages : seq.heldPages * s.layers.length;
      runs[name] = { seq, stepMs: [] };
    }
    for (let r = 0; r < rounds; r++) {
      const names = Object.keys(runs);
      if (r % 2 === 1) names.reverse();
      for (const name of names) {
        const run = runs[name]!;
        for (let s = 0; s < steps; s++) {
          const ts = performance.now();
          await run.seq.step([(s * 7 + 3) % spec.vocab]);
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
        sliding_pages_over_global_pages: round(
          f(`sliding_ctx${windows}w_kv_pages_held`) / f(`global_ctx${windows}w_kv_pages_held`),
        ),
        mixed_over_global_decode: round(
          f(`mixed_ctx${windows}w_decode_tok_per_s`) / f(`global_ctx${windows}w_decode_tok_per_s`),
        ),
        mixed_layer_pages_over_global_layer_pages: round(
          f(`mixed_ctx${windows}w_kv_layer_pages_held`) / f(`global_ctx${windows}w_kv_layer_pages_held`),
        ),
      },
      env: {
        sliding_window: window,
        sliding_context_tokens: context,
        sliding_decode_steps: steps * rounds,
        mixed_global_layers: layouts.mixed.layers.filter((l) => l.kind === "global").length,
        mixed_layers: layouts.mixed.layers.length,
      },
    };
  } finally {
    for (const e of engines) e.free();
  }
}
