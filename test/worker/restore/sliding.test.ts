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
import { releaseWindow } from "../../../worker/model/layout.ts";
import { type LoadedModel, loadModelDir } from "../../../worker/model/model-dir.ts";
import { initialSamplerState, samplingParams } from "../../../worker/model/sampling.ts";
import { CPU_VARIANT } from "../../../worker/model/variant.ts";
import { windowDeadPages } from "../../../worker/pages/route.ts";
import {
  bitEqual,
  Device,
  generate,
  PAGE,
  preferring,
  promptOf,
  restoreInto,
  restorerFor,
  startWorker,
  startWriter,
  type TestWorker,
  waitPublished,
} from "./harness.ts";

/**
 * A sliding-window model at a context many times its window: the tiny
 * mistral-sw (every layer slides over 24 positions; pages of 16) on a
 * 420-token prompt, 17.5 windows. Every commit releases the pages dead for
 * the window; the outputs must not move a bit: against the same paged decode
 * that releases nothing, the contiguous oracle, a restore from the chunks
 * captured after the release, and a restore after the released pages were
 * evicted from the pool.
 */
let root: string;
let model: LoadedModel;
let log: EmbeddedLog;
let writer: { stop(): Promise<void> };
let a: TestWorker;
let window: number;
let baseline: { logits: Float32Array; greedy: number[] };
const engines: Engine[] = [];
const devices: Device[] = [];
const DECODE = 4;
let prompt: number[];

async function device(release = true): Promise<Device> {
  const d = await Device.open(model, { release });
  devices.push(d);
  return d;
}

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-sliding-"));
  const g = await generateModel({ preset: "tiny", out: join(root, "model"), arch: "mistral-sw", seed: 7 });
  model = await loadModelDir(g.dir, { variant: CPU_VARIANT });
  window = releaseWindow(model.config.spec.layers)!;
  prompt = promptOf(420, 11, model.config.spec.vocab);
  log = await EmbeddedLog.open();
  writer = startWriter(log);
  // Room for one request's whole reservation and little more: a second prompt evicts the first's cached pages.
  // Capture is priced so cheap that the checkpoint is taken whatever the prefill calibrates to:
  // on a fast host a cheap recompute made the offer lose, and the restore case had no chunks.
  a = await startWorker(model, {
    id: "w-sliding",
    log,
    runtime: { physicalPages: 40 },
    cache: { checkpoint: { capturePerByteMs: 1e-12 } },
  });
  const base = await device(false);
  baseline = await base.continueGreedy(base.openRoute("base", prompt.length + 16), prompt, DECODE);
});

afterAll(async () => {
  for (const d of devices) d.close();
  for (const e of engines) e.free();
  await a?.close();
  await writer?.stop();
  await log?.close();
  await rm(root, { recursive: true, force: true });
});

describe("a sliding-window model releases pages outside its window, exactly", () => {
  it("every layer of the model slides, so a page dead for the widest window is released", () => {
    expect(model.config.spec.layers.every((l) => l.kind === "sliding")).toBe(true);
    expect(window).toBe(24);
  });

  it("paged decoding that releases pages equals the one that keeps them and the contiguous oracle, bit for bit", async () => {
    const dev = await device();
    const route = dev.openRoute("released", prompt.length + 16);
    const got = await dev.continueGreedy(route, prompt, DECODE);
    expect(bitEqual(got.logits, baseline.logits)).toBe(true);
    expect(got.greedy).toEqual(baseline.greedy);
    // Rows fed: the prompt and every greedy token but the last.
    const rows = prompt.length + DECODE;
    const r = dev.pages.route(route);
    expect(r.tokens).toBe(rows);
    const dead = windowDeadPages(rows, window, PAGE, r.pages.length);
    expect(dead).toBe(Math.floor((rows - window + 1) / PAGE));
    expect(r.releasedPages).toBe(dead);
    expect(dev.pages.windowReleases).toBe(dead);
    // What the route holds: the window's pages and the tail, not the 27 of the context.
    expect(r.pages.length - r.releasedPages).toBeLessThanOrEqual(Math.ceil((window - 1) / PAGE) + 1);

    const engine = await openEngine(model.config.spec, model.weights, { threads: 1 });
    engines.push(engine);
    const [oracle] = await decode(
      new ContiguousDecoder(engine, 1, prompt.length + 16),
      [prompt],
      [initialSamplerState(samplingParams({ maxTokens: DECODE + 1 }))],
    );
    expect(oracle!.tokens).toEqual(baseline.greedy);
    expect(bitEqual(oracle!.logits[0]!, baseline.logits)).toBe(true);
  });

  it("the runtime counts the pages it released and generates the oracle's tokens", async () => {
    const before = a.runtime.stats().windowReleasedPages;
    const out = await generate(a.runtime, prompt, DECODE);
    expect(out.tokens).toEqual(baseline.greedy.slice(0, DECODE));
    // Rows the route held: the prompt and DECODE − 1 generated tokens.
    const rows = prompt.length + DECODE - 1;
    expect(a.runtime.stats().windowReleasedPages - before).toBe(Math.floor((rows - window + 1) / PAGE));
  });

  it("a restore of the prefix whose pages were released is bit-identical to a recompute", async () => {
    // The checkpoint captured the released pages while they were still cached.
    await a.cache.idle();
    await waitPublished(a, prompt, 3);
    const dev = await device();
    const restorer = restorerFor(a, dev.engine);
    const r = await restoreInto(dev, restorer, prompt, preferring("ram"));
    expect(r.ok).toBe(true);
    expect(r.restoreTo).toBe(390);
    const got = await dev.continueGreedy(r.route, prompt, DECODE);
    expect(dev.pages.route(r.route).releasedPages).toBeGreaterThan(0);
    expect(bitEqual(got.logits, baseline.logits)).toBe(true);
    expect(got.greedy).toEqual(baseline.greedy);
    await restorer.idle();
  });

  it("after another prompt evicted the released pages, the runtime restores the prefix and generates the same tokens", async () => {
    const evictedBefore = a.runtime.stats().evictedPages;
    await generate(a.runtime, promptOf(420, 12, model.config.spec.vocab), DECODE);
    await a.cache.idle();
    expect(a.runtime.stats().evictedPages).toBeGreaterThan(evictedBefore);
    const again = await generate(a.runtime, prompt, DECODE);
    expect(again.tokens).toEqual(baseline.greedy.slice(0, DECODE));
    expect(again.cachedTokens).toBeGreaterThan(0);
  });
});
