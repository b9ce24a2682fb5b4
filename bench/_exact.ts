import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { longestPublishedPrefix } from "../catalog/queries.ts";
import type { BackendName } from "../native/backends.ts";
import { defaultConfig } from "../schema/config.ts";
import { catalogNodeId, prefixChain } from "../schema/identity.ts";
import { silentLogger } from "../schema/log.ts";
import { type ConfiguredCosts, initialCalibration } from "../worker/calibration/calibration.ts";
import { PageAllocator, PagedDecoder } from "../worker/model/decoder-paged.ts";
import { openEngine } from "../worker/model/engine.ts";
import { layerGroups } from "../worker/model/layout.ts";
import type { LoadedModel } from "../worker/model/model-dir.ts";
import { PageHashChain } from "../worker/pages/page-hashes.ts";
import { durableGeometry } from "../worker/restore/durable-cache.ts";
import { openEmbeddedCache } from "../worker/restore/embedded.ts";
import { Restorer } from "../worker/restore/restorer.ts";
import { loadEngine } from "../worker/runtime/engine-load.ts";
import { WorkerRuntime } from "../worker/runtime/runtime.ts";
import { bitEqual, GreedyDevice, generateGreedy, xorshiftTokens } from "./_greedy-device.ts";

/**
 * The determinism contract on whatever engine `backend` is, through the
 * full engine step and the real store path (bench gpu runs it on the CUDA
 * engine; on the CPU it is the same check the restore tests make):
 *
 * - restore: engine A's runtime computes a prompt and its checkpointer
 *   captures the whole chunks (download → chunk → RAM and file tiers →
 *   catalog); a fresh engine B restores them through a Restorer (verify →
 *   upload into its pages), prefills the rest and decodes greedily; a fresh
 *   engine C recomputes the whole prompt. B's first-token logits and greedy
 *   tokens must be C's, bit for bit.
 * - batch: a prompt's last-row logits and its next decode step's, alone and
 *   at a random place among 15 random neighbours in the same steps.
 * - chunking: the same prompt prefilled in one step and in random chunks.
 */
export interface ExactnessResult {
  readonly restore: boolean;
  readonly restoredTokens: number;
  /** Restore from RAM (fetch, verify, upload) + the rest's prefill + first logits, on warm engines. */
  readonly restoredFirstTokenMs: number;
  /** The whole prompt recomputed + first logits. */
  readonly recomputedFirstTokenMs: number;
  readonly batch16: boolean;
  readonly chunking: boolean;
  readonly detail: string;
}

const PAGE = 16;
const CHUNK = 256;
/** Pages of each engine here: a prompt of up to 8k tokens. */
const DEVICE_PAGES = 512;

/** xorshift32 token ids in [0, vocab − 16) (clear of the generated tokenizers' special tokens). */
export function promptOf(n: number, seed: number, vocab: number): number[] {
  return xorshiftTokens(n, seed, Math.max(1, vocab - 16));
}

/** A bare engine and page manager of DEVICE_PAGES pages on `backend`. */
async function openDevice(model: LoadedModel, backend: BackendName): Promise<GreedyDevice> {
  const engine = await loadEngine(model, { physicalPages: DEVICE_PAGES, pageTokens: PAGE }, { backend });
  return new GreedyDevice(engine, { pageTokens: PAGE, physicalPages: DEVICE_PAGES });
}

/**
 * The checks restore into and run one page table (GreedyDevice); a model of
 * several layer groups holds a table per group, so it is refused by name.
 */
export function refuseGrouped(model: LoadedModel, what: string): void {
  const groups = layerGroups(model.config.spec.layers).groups.length;
  if (groups > 1)
    throw new Error(
      `${what} runs one page table; the model ${model.manifest.layout} holds ${groups} layer groups`,
    );
}

const routeName = () => `x-${randomUUID().slice(0, 8)}`;

/** Costs under which every whole chunk pays to capture and to restore, from RAM first (the check needs them captured). */
const COSTS: ConfiguredCosts = {
  prefillPerTokenMs: 1,
  firstTokenMs: 1,
  decodeStepMs: 1,
  restorePerByteMs: { ram: 1e-12, ssd: 1e-9, peer: 1, s3: 1 },
};

async function checkRestore(model: LoadedModel, backend: BackendName, promptTokens: number) {
  refuseGrouped(model, "the exactness check");
  const dir = await mkdtemp(join(tmpdir(), "continuum-exact-"));
  const prompt = promptOf(promptTokens, 11, model.config.spec.vocab);
  const engineA = await loadEngine(model, { physicalPages: DEVICE_PAGES, pageTokens: PAGE }, { backend });
  const config = {
    pages: { ...defaultConfig.pages, pageTokens: PAGE, chunkTokens: CHUNK },
    store: {
      ...defaultConfig.store,
      dataDir: dir,
      ram: { maxBytes: 2 << 30 },
      dir: { path: join(dir, "store"), maxObjectBytes: 256 << 20, maxBytes: 8 * 2 ** 30 },
    },
    worker: defaultConfig.worker,
    auth: { ...defaultConfig.auth, tokens: {}, clusterSecret: "" },
  };
  const cache = await openEmbeddedCache({
    engine: engineA,
    model,
    modelName: "exact",
    config,
    logger: silentLogger,
  });
  const runtime = new WorkerRuntime(engineA, {
    fingerprint: model.fingerprint,
    vocab: model.config.spec.vocab,
    maxContext: model.config.spec.maxPosition,
    layers: model.config.spec.layers,
    pageTokens: PAGE,
    physicalPages: DEVICE_PAGES,
    maxBatchTokens: 1024,
    maxBatchSeqs: 4,
    minPrefillTokens: 64,
    prefillTile: 512,
    maxQueued: 4,
    costs: COSTS,
    logger: silentLogger,
    ...cache.hooks,
  });
  runtime.start();
  const devices: GreedyDevice[] = [];
  try {
    await generateGreedy(runtime, prompt, 4, { requestId: "exact-a" });
    await cache.cache.idle();
    const fp = cache.cache.catalog.id.fingerprint;
    const nodes = prefixChain(prompt.slice(0, -1), CHUNK).map((n) => catalogNodeId(fp, n.hash));
    await cache.cache.catalog.waitUntil(
      () => longestPublishedPrefix(cache.cache.catalog.db, nodes).length === nodes.length,
      30_000,
    );
    const published = longestPublishedPrefix(cache.cache.catalog.db, nodes).length;
    const b = await openDevice(model, backend);
    devices.push(b);
    const c = await openDevice(model, backend);
    devices.push(c);
    const restorer = new Restorer({
      engine: b.engine,
      ...durableGeometry(b.engine.spec),
      tiers: cache.cache.tiers,
      catalog: cache.cache.catalog,
      pageTokens: PAGE,
      chunkTokens: CHUNK,
      peerSecret: "",
      fetchTimeoutMs: 10_000,
      logger: silentLogger,
    });
    // Warm both engines (first launches, scratch) on a short prompt of their own.
    for (const d of [b, c])
      await d.continueGreedy(d.openRoute(routeName(), 64), promptOf(32, 5, model.config.spec.vocab), 0);
    const route = b.openRoute(routeName(), prompt.length + 8);
    const t0 = performance.now();
    const ticket = restorer.begin({
      routes: [route],
      tokens: prompt.slice(0, -1),
      pageHashes: new PageHashChain(PAGE, undefined).extend(prompt, prompt.length - 1),
      salt: undefined,
      residentTokens: 0,
      pages: b.pages,
      calibration: initialCalibration(COSTS),
      record: () => undefined,
    });
    const restored = ticket !== null && (await ticket.done) ? b.pages.route(route).tokens : 0;
    const restoreMs = performance.now() - t0;
    await restorer.idle();
    const got = await b.continueGreedy(route, prompt, 4);
    const want = await c.continueGreedy(c.openRoute(routeName(), prompt.length + 8), prompt, 4);
    const same =
      restored > 0 && bitEqual(got.logits, want.logits) && got.greedy.join() === want.greedy.join();
    return {
      same,
      restored,
      restoredMs: restoreMs + got.firstMs,
      recomputedMs: want.firstMs,
      detail: `${published} of ${nodes.length} chunks published, ${restored} tokens restored`,
    };
  } finally {
    for (const d of devices) d.close();
    await runtime.stop();
    await cache.close();
    engineA.free();
    await rm(dir, { recursive: true, force: true });
  }
}

/** A prompt alone and among 15 random neighbours; in one step and in random chunks. */
async function checkBatchAndChunks(model: LoadedModel, backend: BackendName, promptTokens: number) {
  const vocab = model.config.spec.vocab;
  const engine = await openEngine(model.config.spec, model.weights, { backend });
  try {
    const pagesPerSeq = Math.ceil((promptTokens + 2) / PAGE);
    const dec = new PagedDecoder(engine, new PageAllocator(pagesPerSeq * 20), PAGE, 20);
    const a = promptOf(promptTokens, 3, vocab);
    const next = [a[0]!];
    const alone = dec.open();
    const [prefillAlone] = await dec.step([{ seq: alone, tokens: a }]);
    const [decodeAlone] = await dec.step([{ seq: alone, tokens: next }]);
    const keepPrefill = Float32Array.from(prefillAlone!);
    const keepDecode = Float32Array.from(decodeAlone!);
    dec.close(alone);

    const at = 7;
    const seqs = Array.from({ length: 16 }, () => dec.open());
    const prompts = seqs.map((_, i) =>
      i === at ? a : promptOf(1 + ((i * 97) % promptTokens), 100 + i, vocab),
    );
    const pre = await dec.step(seqs.map((seq, i) => ({ seq, tokens: prompts[i]! })));
    const dcd = await dec.step(seqs.map((seq, i) => ({ seq, tokens: i === at ? next : [i] })));
    const batch16 = bitEqual(pre[at]!, keepPrefill) && bitEqual(dcd[at]!, keepDecode);
    for (const s of seqs) dec.close(s);

    const chunked = dec.open();
    let last: Float32Array | undefined;
    const sizes: number[] = [];
    for (let p0 = 0, i = 0; p0 < a.length; i++) {
      const n = Math.min(a.length - p0, 1 + ((i * 37 + 11) % 97));
      [last] = await dec.step([{ seq: chunked, tokens: a.slice(p0, p0 + n) }]);
      sizes.push(n);
      p0 += n;
    }
    const keepLast = Float32Array.from(last!);
    const [decodeChunked] = await dec.step([{ seq: chunked, tokens: next }]);
    const chunking = bitEqual(keepLast, keepPrefill) && bitEqual(decodeChunked!, keepDecode);
    dec.close(chunked);
    return { batch16, chunking, sizes };
  } finally {
    engine.free();
  }
}

export async function checkExactness(
  model: LoadedModel,
  backend: BackendName,
  promptTokens: number,
): Promise<ExactnessResult> {
  const r = await checkRestore(model, backend, promptTokens);
  const bc = await checkBatchAndChunks(model, backend, Math.min(promptTokens, 300));
  return {
    restore: r.same,
    restoredTokens: r.restored,
    restoredFirstTokenMs: r.restoredMs,
    recomputedFirstTokenMs: r.recomputedMs,
    batch16: bc.batch16,
    chunking: bc.chunking,
    detail: `${r.detail}; prefill chunks ${bc.sizes.join("+")}`,
  };
}
