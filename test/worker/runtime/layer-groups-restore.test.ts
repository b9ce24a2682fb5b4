import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmbeddedLog } from "../../../catalog/log-embedded.ts";
import { longestPublishedPrefix } from "../../../catalog/queries.ts";
import { catalogNodeId, prefixChain } from "../../../schema/identity.ts";
import { type ContentId, RequestId } from "../../../schema/ids.ts";
import type { RestoreTier } from "../../../worker/calibration/calibration.ts";
import { groupChain } from "../../../worker/checkpoint/group-chunks.ts";
import { generate as decode } from "../../../worker/model/decoder.ts";
import { ContiguousDecoder } from "../../../worker/model/decoder-contiguous.ts";
import { openEngine } from "../../../worker/model/engine.ts";
import { generateModel } from "../../../worker/model/generate.ts";
import { layerGroups } from "../../../worker/model/layout.ts";
import type { TokenLogprob } from "../../../worker/model/logits.ts";
import { type LoadedModel, loadModelDir } from "../../../worker/model/model-dir.ts";
import { initialSamplerState, samplingParams } from "../../../worker/model/sampling.ts";
import { CPU_VARIANT } from "../../../worker/model/variant.ts";
import type { RouteSnapshot } from "../../../worker/pages/page-manager.ts";
import { durableGeometry } from "../../../worker/restore/durable-cache.ts";
import type { WorkerRuntime } from "../../../worker/runtime/runtime.ts";
import { CHUNK, PAGE, promptOf, startWorker, startWriter, type TestWorker } from "../restore/harness.ts";

/**
 * Durable reuse of a model served in its own layer groups, at a context many
 * windows long (420 rows, window 24, chunks of 130): worker a computes a
 * prompt and checkpoints every group's chain; worker b, holding nothing,
 * restores it from a (peer) into every group's route, a sliding group reading
 * only the chunk its window reaches at row 390, and generates exactly what a
 * computed, log-probabilities and all. The tiny gemma3: one global group and
 * five sliding ones; the tiny mistral-sw: one group, every layer sliding.
 */
const DECODE = 4;
const PROMPT = 420;
/** Rows restored: the end of the last whole chunk before the pending token. */
const RESTORED = 3 * CHUNK;

interface Run {
  tokens: number[];
  logprobs: (TokenLogprob | null)[];
  cachedTokens: number;
  /** The request's routes when its first token arrived (group 0 first). */
  routes: RouteSnapshot[];
}

async function run(runtime: WorkerRuntime, id: string, prompt: readonly number[]): Promise<Run> {
  const gen = runtime.submit({
    requestId: RequestId(id),
    salt: undefined,
    prompt,
    maxTokens: DECODE,
    temperature: 0,
    topP: 1,
    topK: 0,
    seed: 1,
    stopTokenIds: [],
    logprobs: 2,
  });
  const out: Run = { tokens: [], logprobs: [], cachedTokens: -1, routes: [] };
  for await (const e of gen.events) {
    if (e.type === "error") throw new Error(e.message);
    if (e.type === "end") out.cachedTokens = e.cachedTokens;
    if (e.type !== "token") continue;
    if (out.tokens.length === 0)
      out.routes = runtime.pages
        .snapshot()
        .routes.filter((r) => r.id === `r:${id}` || r.id.startsWith(`r:${id}#g`))
        .sort((x, y) => x.id.length - y.id.length || (x.id < y.id ? -1 : 1));
    out.tokens.push(e.token);
    out.logprobs.push(e.logprob);
  }
  return out;
}

const sum = (r: Readonly<Record<RestoreTier, number>>) => Object.values(r).reduce((x, y) => x + y, 0);

let root: string;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-groups-restore-"));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

describe.each(["gemma3", "mistral-sw"] as const)("durable reuse over layer groups (tiny %s)", (arch) => {
  let model: LoadedModel;
  let log: EmbeddedLog;
  let writer: { stop(): Promise<void> };
  let a: TestWorker;
  let b: TestWorker;
  /** The first test's prompt and what a computed for it. */
  let prompt: number[];
  let computed: Run;

  beforeAll(async () => {
    const g = await generateModel({ preset: "tiny", out: join(root, arch), arch, seed: 9 });
    model = await loadModelDir(g.dir, { variant: CPU_VARIANT });
    log = await EmbeddedLog.open();
    writer = startWriter(log);
    // Capture is priced so cheap that the first offer is taken whatever the prefill calibrates to.
    a = await startWorker(model, {
      id: `wa-${arch}`,
      log,
      cache: { checkpoint: { capturePerByteMs: 1e-12 } },
    });
    b = await startWorker(model, { id: `wb-${arch}`, log });
  });

  afterAll(async () => {
    await b?.close();
    await a?.close();
    await writer?.stop();
    await log?.close();
  });

  /** Waits until b's replica has every group's chain of `prompt` published to chunk 3. */
  async function waitAllGroups(prompt: readonly number[]): Promise<void> {
    const fp = a.cache.catalog.id.fingerprint;
    const chain = prefixChain(prompt.slice(0, -1), CHUNK);
    const published = () =>
      b.cache.restorer.groups.map(
        (gc) =>
          longestPublishedPrefix(
            b.cache.catalog.db,
            groupChain(chain, gc.group).map((n) => catalogNodeId(fp, n.hash)),
          ).length,
      );
    expect(await b.cache.catalog.waitUntil(() => published().every((n) => n >= 3), 30_000)).toBe(true);
  }

  it("restores every group from another worker's chunks and generates what recompute does, bit for bit", async () => {
    const spec = model.config.spec;
    const groups = layerGroups(spec.layers).groups;
    const windows = groups.map((g) => (g.layout.kind === "sliding" ? g.layout.window : null));
    expect(windows.some((w) => w !== null)).toBe(true);
    expect(b.runtime.routes.windows).toEqual(windows);
    prompt = promptOf(PROMPT, 31, spec.vocab);
    expect(PROMPT / windows.find((w) => w !== null)!).toBeGreaterThan(10);

    // Worker a computes the prompt; its tokens are the contiguous oracle's.
    const engine = await openEngine(spec, model.weights, { threads: 1 });
    const [oracle] = await decode(
      new ContiguousDecoder(engine, 1, PROMPT + DECODE + 1),
      [prompt],
      [initialSamplerState(samplingParams({ maxTokens: DECODE }))],
    ).finally(() => engine.free());
    computed = await run(a.runtime, "computed", prompt);
    expect(computed.tokens).toEqual(oracle!.tokens);
    expect(computed.cachedTokens).toBe(0);

    // Every group's chain is published to chunk 3 (a sliding group's captured while its pages were cached).
    await a.cache.idle();
    await waitAllGroups(prompt);

    const before = b.cache.restorer.stats();
    const restored = await run(b.runtime, "restored", prompt);
    const after = b.cache.restorer.stats();
    expect(restored.cachedTokens).toBe(RESTORED);
    expect(restored.tokens).toEqual(computed.tokens);
    expect(restored.logprobs).toEqual(computed.logprobs);
    expect(restored.logprobs.every((l) => l !== null)).toBe(true);
    expect(after.completed - before.completed).toBe(1);
    expect(after.abandoned).toBe(before.abandoned);

    // At row 390 a window of 24 reads rows ≥ 367, pages from 22 (row 352) on: chunk 2 alone.
    // A global group reads chunks 0, 1 and 2.
    const chunks = windows.reduce<number>((n, w) => n + (w === null ? 3 : 1), 0);
    expect(sum(after.chunks) - sum(before.chunks)).toBe(chunks);
    const { geometry } = durableGeometry(b.engine.spec);
    const perChunk = groups.map((g) => geometry.chunkBytes(CHUNK, g.layers.length));
    const bytes = windows.reduce<number>((n, w, g) => n + (w === null ? 3 : 1) * perChunk[g]!, 0);
    expect(sum(after.bytes) - sum(before.bytes)).toBe(bytes);
    // Rows served count once, not once per group.
    expect(sum(after.tokens) - sum(before.tokens)).toBe(RESTORED);

    // When the first token came: 420 rows; a sliding group held only its window's pages.
    const routes = restored.routes;
    expect(routes).toHaveLength(groups.length);
    const held = routes.map((r) => r.pages.length - r.releasedPages);
    const tablePages = Math.ceil(PROMPT / PAGE);
    windows.forEach((w, g) => {
      expect(routes[g]!.pages).toHaveLength(tablePages);
      if (w === null) {
        expect(held[g]).toBe(tablePages);
      } else {
        expect(routes[g]!.releasedPages).toBe(Math.floor((PROMPT - w + 1) / PAGE));
        expect(held[g]).toBeLessThanOrEqual(Math.ceil((w - 1) / PAGE) + 1);
      }
    });
    const globalHeld = held.filter((_, g) => windows[g] === null);
    for (const [g, h] of held.entries())
      if (windows[g] !== null) for (const gh of globalHeld) expect(h).toBeLessThan(gh);
    b.runtime.pages.checkInvariants();

    // Asked again, b hits every full page resident: a sliding group needs only its window's pages of the hit.
    const restores = b.cache.restorer.stats().restores;
    const again = await run(b.runtime, "again", prompt);
    expect(again.cachedTokens).toBe(Math.floor((PROMPT - 1) / PAGE) * PAGE);
    expect(again.logprobs).toEqual(computed.logprobs);
    expect(b.cache.restorer.stats().restores).toBe(restores);
  });

  it("abandons every group's load when a sliding group's needed chunk is gone, and recomputes exactly", async () => {
    // A third worker, holding nothing, restores the first prompt: every copy of the last group's
    // chunk 2 (the one its window needs at row 390) leaves a's and b's tiers; the catalog still lists them.
    await b.cache.restorer.idle();
    const c = await startWorker(model, { id: `wc-${arch}`, log });
    const last = c.cache.restorer.groups[c.cache.restorer.groups.length - 1]!;
    expect(last.window).not.toBeNull();
    const fp = a.cache.catalog.id.fingerprint;
    const node = groupChain(prefixChain(prompt.slice(0, -1), CHUNK), last.group)[2]!;
    const db = a.cache.catalog.db;
    const content = db.get(
      db.eidOf("chunk/node", catalogNodeId(fp, node.hash))!,
      "chunk/content",
    ) as ContentId;
    for (const w of [a, b]) {
      await w.cache.tiers.ram?.delete(content);
      await w.cache.tiers.file.delete(content);
    }
    try {
      const before = c.cache.restorer.stats();
      const again = await run(c.runtime, "abandoned", prompt);
      const after = c.cache.restorer.stats();
      expect(after.restores - before.restores).toBe(1);
      expect(after.abandoned - before.abandoned).toBe(1);
      expect(after.completed).toBe(before.completed);
      expect(after.tokens).toEqual(before.tokens);
      expect(after.fallbacks.missing - before.fallbacks.missing).toBeGreaterThan(0);
      // Nothing was kept of the groups read before the failure: every row was recomputed.
      expect(again.cachedTokens).toBe(0);
      expect(again.tokens).toEqual(computed.tokens);
      expect(again.logprobs).toEqual(computed.logprobs);
      const snap = c.runtime.pages.snapshot();
      expect(snap.reservedPages).toBe(0);
      expect(snap.loadingPages).toBe(0);
      c.runtime.pages.checkInvariants();
    } finally {
      await c.close();
    }
  });
});
