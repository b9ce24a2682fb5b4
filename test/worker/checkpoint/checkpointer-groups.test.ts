import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmbeddedLog } from "../../../catalog/log-embedded.ts";
import type { Engine } from "../../../native/engine.ts";
import { catalogNodeId, prefixChain } from "../../../schema/identity.ts";
import type { ContentId } from "../../../schema/ids.ts";
import { silentLogger } from "../../../schema/log.ts";
import { initialCalibration } from "../../../worker/calibration/calibration.ts";
import { Checkpointer } from "../../../worker/checkpoint/checkpointer.ts";
import { KvGeometry, layerMask } from "../../../worker/checkpoint/chunk-format.ts";
import { groupChain, groupChunksOf } from "../../../worker/checkpoint/group-chunks.ts";
import { openEngine } from "../../../worker/model/engine.ts";
import { generateModel } from "../../../worker/model/generate.ts";
import { GLOBAL_LAYER, type LayerGroups, layerGroups } from "../../../worker/model/layout.ts";
import { type LoadedModel, loadModelDir } from "../../../worker/model/model-dir.ts";
import { CPU_VARIANT } from "../../../worker/model/variant.ts";
import { PageHashChain } from "../../../worker/pages/page-hashes.ts";
import { loadEngine } from "../../../worker/runtime/engine-load.ts";
import { WorkerRuntime } from "../../../worker/runtime/runtime.ts";
import {
  CHUNK,
  costs,
  generate,
  PAGE,
  promptOf,
  runtimeOptions,
  startWorker,
  startWriter,
  type TestWorker,
  waitPublished,
} from "../restore/harness.ts";

/**
 * Checkpoints of a runtime holding a mixed model (tiny gemma2) in its own
 * layer groups: each group's pages become chunks of that group's layers on a
 * chain of its own. Worker `a` gives the store and catalog; a runtime over a
 * pool of one table of every layer, checkpointed as one group, gives
 * all-layer chunks of the same rows (under a salt, so another chain): the
 * reference the group chunks are cut from.
 */
let root: string;
let model: LoadedModel;
let log: EmbeddedLog;
let writer: { stop(): Promise<void> };
let a: TestWorker;
let engine: Engine;
let runtime: WorkerRuntime;
let refEngine: Engine;
let refRuntime: WorkerRuntime;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-cp-groups-"));
  const g = await generateModel({ preset: "tiny", out: join(root, "model"), arch: "gemma2", seed: 5 });
  model = await loadModelDir(g.dir, { variant: CPU_VARIANT });
  log = await EmbeddedLog.open();
  writer = startWriter(log);
  a = await startWorker(model, { id: "w-cp", log });
  engine = await loadEngine(model, { physicalPages: 256, pageTokens: PAGE }, { threads: 1 });
  runtime = new WorkerRuntime(engine, runtimeOptions(model));
  runtime.start();
  // One table of every layer: the engine still attends each layer by its own window (the spec's).
  refEngine = await openEngine(model.config.spec, model.weights, { threads: 1 });
  refEngine.createPool(256, PAGE, undefined);
  refRuntime = new WorkerRuntime(
    refEngine,
    runtimeOptions(model, { layers: model.config.spec.layers.map(() => GLOBAL_LAYER) }),
  );
  refRuntime.start();
});

afterAll(async () => {
  await runtime?.stop();
  engine?.free();
  await refRuntime?.stop();
  refEngine?.free();
  await a?.close();
  await writer?.stop();
  await log?.close();
  await rm(root, { recursive: true, force: true });
});

describe("checkpoint per layer group", () => {
  it("writes each group's pages as chunks of its layers on its own chain, equal to those layers of an all-layer chunk", async () => {
    const layers = model.config.spec.layers;
    const groups = layerGroups(layers);
    expect(groups.groups.length).toBe(2);
    const window = groups.groups.find((x) => x.layout.kind === "sliding")!.layout;
    const prompt = promptOf(420, 31, model.config.spec.vocab);
    // Several windows of context: the sliding group's early pages were released (cached) at commits.
    expect(prompt.length).toBeGreaterThan(3 * (window as { window: number }).window);
    await generate(runtime, prompt, 2);
    await generate(refRuntime, prompt, 2, "ref");
    const checkpointer = (e: Engine, g: LayerGroups) =>
      new Checkpointer({
        engine: e,
        geometry: KvGeometry.of(e.spec, g.slots),
        groups: g,
        tiers: a.cache.tiers,
        catalog: a.cache.catalog,
        pageTokens: PAGE,
        chunkTokens: CHUNK,
        maxQueued: 4,
        maxStagingBytes: 64 << 20,
        capturePerByteMs: 1e-9,
        publishTimeoutMs: 30_000,
        logger: silentLogger,
      });
    const rows = 3 * CHUNK;
    const tokens = prompt.slice(0, Math.ceil(rows / PAGE) * PAGE);
    const offerOf = (pages: WorkerRuntime["pages"], salt: string | undefined) => ({
      prefix: new PageHashChain(PAGE, salt).extend(tokens, tokens.length),
      tokens,
      salt,
      hits: 0,
      pages,
      calibration: initialCalibration(costs),
      released: () => undefined,
    });
    const all = layers.map((_, l) => l);
    const refCp = checkpointer(refEngine, {
      groups: [{ layout: GLOBAL_LAYER, layers: all }],
      groupOf: new Int32Array(layers.length),
      slots: layers.length,
    });
    expect(refCp.offer(offerOf(refRuntime.pages, "ref"))).toBe("queued");
    await refCp.idle();
    await waitPublished(a, prompt, 3, "ref");

    const geometry = KvGeometry.of(engine.spec, groups.slots);
    const cp = checkpointer(engine, groups);
    const offer = offerOf(runtime.pages, undefined);
    expect(cp.offer(offer)).toBe("queued");
    await cp.idle();
    expect(cp.stats()).toMatchObject({ chunksPublished: 6, failed: 0, durablePrefixes: 1 });
    // Offered again, every group's chain is servable: nothing to capture.
    expect(cp.offer(offer)).toBe("skipped");

    const db = a.cache.catalog.db;
    const fp = a.cache.catalog.id.fingerprint;
    const chunkOf = async (hash: string) => {
      const e = db.eidOf("chunk/node", catalogNodeId(fp, hash as never));
      expect(e).toBeDefined();
      const got = await a.cache.tiers.file.get(db.get(e!, "chunk/content") as ContentId);
      return got!;
    };
    const chain = prefixChain(tokens, CHUNK);
    const ref = prefixChain(tokens, CHUNK, "ref");
    const layerBlock = CHUNK * (geometry.kRow + geometry.vRow);
    const nodes = new Set<string>();
    for (const gc of groupChunksOf(groups)) {
      const mine = groupChain(chain, gc.group);
      expect(mine).toHaveLength(3);
      for (let i = 0; i < mine.length; i++) {
        nodes.add(mine[i]!.hash);
        const got = await chunkOf(mine[i]!.hash);
        expect(got.meta.layers).toBe(gc.mask);
        expect(got.bytes.byteLength).toBe(geometry.chunkBytes(CHUNK, gc.held));
        const whole = await chunkOf(ref[i]!.hash);
        expect(whole.meta.layers).toBe(layerMask(all, layers.length));
        // Held layer j of the group chunk is layer groups[g].layers[j] of the all-layer chunk, bit for bit.
        groups.groups[gc.group]!.layers.forEach((l, j) => {
          const want = Buffer.from(whole.bytes.subarray(l * layerBlock, (l + 1) * layerBlock));
          expect(Buffer.from(got.bytes.subarray(j * layerBlock, (j + 1) * layerBlock)).equals(want)).toBe(
            true,
          );
        });
      }
    }
    // Six distinct nodes: the groups' chains never share a node.
    expect(nodes.size).toBe(6);
  });
});
