import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Engine } from "../../../native/engine.ts";
import { generate as decode } from "../../../worker/model/decoder.ts";
import { ContiguousDecoder } from "../../../worker/model/decoder-contiguous.ts";
import { openEngine } from "../../../worker/model/engine.ts";
import { generateModel } from "../../../worker/model/generate.ts";
import { layerGroups } from "../../../worker/model/layout.ts";
import { type LoadedModel, loadModelDir } from "../../../worker/model/model-dir.ts";
import { initialSamplerState, samplingParams } from "../../../worker/model/sampling.ts";
import { CPU_VARIANT } from "../../../worker/model/variant.ts";
import type { SubmitRequest } from "../../../worker/runtime/runtime-api.ts";
import {
  collect,
  countingPrefill,
  greedyRequest,
  prompt,
  type RuntimeFixture,
  startRuntime,
} from "./fixture.ts";

/**
 * Serving a model of sliding and global layers (the tiny gemma2: alternating;
 * the tiny gemma3: five sliding, then one global) through the runtime, one page table per layer group: at a context many
 * windows long the sliding group's pages outside its window are released
 * while the global group keeps its own, and the tokens are the contiguous
 * oracle's, also when the prefix is shared and when the request is preempted.
 */
let root: string;
const engines: Engine[] = [];
const PAGE = 16;
const DECODE = 12;

function request(id: string, tokens: number[], extra: Partial<SubmitRequest> = {}): SubmitRequest {
  return greedyRequest(id, tokens, DECODE, extra);
}

async function oracle(model: LoadedModel, tokens: number[]): Promise<number[]> {
  const engine = await openEngine(model.config.spec, model.weights, { threads: 2 });
  engines.push(engine);
  const [out] = await decode(
    new ContiguousDecoder(engine, 1, tokens.length + DECODE + 1),
    [tokens],
    [initialSamplerState(samplingParams({ maxTokens: DECODE }))],
  );
  return out!.tokens;
}

function expectNoLeak(f: RuntimeFixture) {
  const snap = f.runtime.pages.snapshot();
  expect(snap.reservedPages).toBe(0);
  expect(snap.routes.every((r) => r.id.startsWith("cache:"))).toBe(true);
  f.runtime.pages.checkInvariants();
}

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-groups-"));
});

afterAll(async () => {
  for (const e of engines) e.free();
  await rm(root, { recursive: true, force: true });
});

describe.each(["gemma2", "gemma3"] as const)("runtime over layer groups (tiny %s)", (arch) => {
  let model: LoadedModel;
  let window: number;
  beforeAll(async () => {
    const g = await generateModel({ preset: "tiny", out: join(root, arch), arch, seed: 7 });
    model = await loadModelDir(g.dir, { variant: CPU_VARIANT });
    const sliding = model.config.spec.layers.find((l) => l.kind === "sliding");
    if (sliding?.kind !== "sliding") throw new Error(`${arch} tiny has no sliding layer`);
    window = sliding.window;
  });

  it("releases the sliding group's out-of-window pages while serving, with the oracle's tokens", async () => {
    const groups = layerGroups(model.config.spec.layers).groups;
    expect(groups.length).toBeGreaterThan(1);
    const slidingGroups = groups.filter((g) => g.layout.kind === "sliding").length;
    const long = prompt(3, 6 * window + 5);
    const expected = await oracle(model, long);
    const f = await startRuntime(model, { pageTokens: PAGE });
    try {
      const a = await collect(f.runtime.submit(request("a", long)).events);
      expect(a.tokens).toEqual(expected);
      // Rows the routes held: the prompt and DECODE − 1 generated tokens.
      const rows = long.length + DECODE - 1;
      const dead = Math.floor((rows - window + 1) / PAGE);
      expect(dead).toBeGreaterThan(3);
      expect(f.runtime.stats().windowReleasedPages).toBe(slidingGroups * dead);
      f.runtime.pages.checkInvariants();

      // The prefix is shared from the cache (the sliding group's released pages stay cached while findable).
      const b = await collect(f.runtime.submit(request("b", long)).events);
      expect(b.tokens).toEqual(expected);
      expect(f.runtime.stats().cachedPromptTokens).toBeGreaterThan(0);
      expectNoLeak(f);
    } finally {
      await f.close();
    }
  });

  it("concurrent requests over one long prefix compute it once, every group adopting it in flight, with the oracle's tokens", async () => {
    const N = 4;
    const shared = prompt(5, 5 * window + 7);
    const reqs = Array.from({ length: N }, (_, i) => request(`f${i}`, [...shared, ...prompt(40 + i, 3 + i)]));
    const expected: number[][] = [];
    for (const r of reqs) expected.push(await oracle(model, [...r.prompt]));
    const { seen, wrap } = countingPrefill();
    // Tiles of 4 pages, longer than the window: a waiter's sliding groups leave the pages it jumps over released.
    const f = await startRuntime(model, { pageTokens: PAGE, prefillTile: 4 * PAGE }, wrap);
    try {
      const results = await Promise.all(reqs.map((r) => collect(f.runtime.submit(r).events)));
      for (const [i, r] of results.entries()) expect(r.tokens, `request ${i}`).toEqual(expected[i]);
      // The shared full pages once, then each request's own rows before its pending token.
      const sharedRows = Math.floor(shared.length / PAGE) * PAGE;
      const own = reqs.reduce((a, r) => a + (r.prompt.length - 1 - sharedRows), 0);
      expect(seen.prefillRows).toBe(sharedRows + own);
      expect(f.runtime.stats().sharedInFlightTokens).toBe((N - 1) * sharedRows);
      expectNoLeak(f);
    } finally {
      await f.close();
    }
  });

  it("preempted long requests on a sliding model resume with the oracle's tokens", async () => {
    const lows = [0, 1].map((i) => request(`low${i}`, prompt(20 + i, 4 * window + 3), { priority: 0 }));
    const highs = [0, 1].map((i) => request(`high${i}`, prompt(30 + i, 4 * window + 3), { priority: 1 }));
    const expected = new Map<string, number[]>();
    for (const r of [...lows, ...highs]) expected.set(r.requestId, await oracle(model, [...r.prompt]));
    const rowsPages = Math.ceil((4 * window + 3 + DECODE) / PAGE);
    const groups = layerGroups(model.config.spec.layers).groups.length;
    // Room for about two requests' reservations in every group: the high ones preempt the low.
    const f = await startRuntime(model, { pageTokens: PAGE, physicalPages: 2 * groups * rowsPages + 2 });
    try {
      const iters = lows.map((r) => f.runtime.submit(r).events[Symbol.asyncIterator]());
      const firsts = await Promise.all(iters.map((it) => it.next()));
      const highResults = Promise.all(highs.map((r) => collect(f.runtime.submit(r).events)));
      const lowResults = await Promise.all(
        iters.map(async (it, i) => {
          const rest = await collect({ [Symbol.asyncIterator]: () => it });
          return [(firsts[i]!.value as { token: number }).token, ...rest.tokens];
        }),
      );
      expect(f.runtime.stats().preemptions).toBeGreaterThan(0);
      for (const [i, r] of lows.entries())
        expect(lowResults[i], r.requestId).toEqual(expected.get(r.requestId));
      for (const [i, r] of highs.entries())
        expect((await highResults)[i]!.tokens, r.requestId).toEqual(expected.get(r.requestId));
      expectNoLeak(f);
    } finally {
      await f.close();
    }
  });
});
