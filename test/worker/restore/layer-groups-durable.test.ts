import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmbeddedLog } from "../../../catalog/log-embedded.ts";
import type { Engine } from "../../../native/engine.ts";
import { generate as decode } from "../../../worker/model/decoder.ts";
import { ContiguousDecoder } from "../../../worker/model/decoder-contiguous.ts";
import { openEngine } from "../../../worker/model/engine.ts";
import { generateModel } from "../../../worker/model/generate.ts";
import { layerGroups } from "../../../worker/model/layout.ts";
import { type LoadedModel, loadModelDir } from "../../../worker/model/model-dir.ts";
import { initialSamplerState, samplingParams } from "../../../worker/model/sampling.ts";
import { CPU_VARIANT } from "../../../worker/model/variant.ts";
import { generate, promptOf, startWorker, startWriter, type TestWorker, waitPublished } from "./harness.ts";

/**
 * A model of sliding and global layers (the tiny gemma2) with durable reuse
 * on: the runtime given restore/checkpoint hooks holds its pages in the
 * model's own layer groups, each checkpointed on its own chain, and a prefix
 * is restored into every group exactly.
 */
let root: string;
let model: LoadedModel;
let log: EmbeddedLog;
let writer: { stop(): Promise<void> };
let a: TestWorker;
const engines: Engine[] = [];
const DECODE = 4;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-groups-durable-"));
  const g = await generateModel({ preset: "tiny", out: join(root, "model"), arch: "gemma2", seed: 5 });
  model = await loadModelDir(g.dir, { variant: CPU_VARIANT });
  log = await EmbeddedLog.open();
  writer = startWriter(log);
  // Room for about one request in both groups: a second prompt evicts the first's cached pages.
  // Capture priced cheap, so the checkpoint is taken whatever the prefill calibrates to on this host.
  a = await startWorker(model, {
    id: "w-groups",
    log,
    runtime: { physicalPages: 80 },
    cache: { checkpoint: { capturePerByteMs: 1e-12 } },
  });
});

afterAll(async () => {
  for (const e of engines) e.free();
  await a?.close();
  await writer?.stop();
  await log?.close();
  await rm(root, { recursive: true, force: true });
});

describe("a layer-grouped model with durable reuse on", () => {
  it("is held in its own layer groups with its hooks on", () => {
    const groups = layerGroups(model.config.spec.layers);
    expect(groups.groups.length).toBeGreaterThan(1);
    expect(a.runtime.routes.groups).toEqual(groups);
    expect(a.cache.restorer.groups.map((g) => g.window)).toEqual(a.runtime.routes.windows);
  });

  it("starts with its hooks, checkpoints a prefix, and after eviction restores it to the oracle's tokens", async () => {
    const prompt = promptOf(420, 21, model.config.spec.vocab);
    const engine = await openEngine(model.config.spec, model.weights, { threads: 1 });
    engines.push(engine);
    const [oracle] = await decode(
      new ContiguousDecoder(engine, 1, prompt.length + 16),
      [prompt],
      [initialSamplerState(samplingParams({ maxTokens: DECODE }))],
    );
    const first = await generate(a.runtime, prompt, DECODE);
    expect(first.tokens).toEqual(oracle!.tokens);
    await a.cache.idle();
    await waitPublished(a, prompt, 3);
    const evictedBefore = a.runtime.stats().evictedPages;
    await generate(a.runtime, promptOf(420, 22, model.config.spec.vocab), DECODE);
    await a.cache.idle();
    expect(a.runtime.stats().evictedPages).toBeGreaterThan(evictedBefore);
    const restored = () => Object.values(a.cache.restorer.stats().tokens).reduce((x, y) => x + y, 0);
    const restoredBefore = restored();
    const again = await generate(a.runtime, prompt, DECODE);
    expect(again.tokens).toEqual(oracle!.tokens);
    expect(restored()).toBeGreaterThan(restoredBefore);
  });
});
