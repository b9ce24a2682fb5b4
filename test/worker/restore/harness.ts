import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { bitEqual, GreedyDevice, generateGreedy, xorshiftTokens } from "../../../bench/_greedy-device.ts";
import { CatalogDb } from "../../../catalog/db.ts";
import type { CatalogLog, TxLogReader, WriterLog } from "../../../catalog/log.ts";
import { longestPublishedPrefix } from "../../../catalog/queries.ts";
import { CatalogWriter } from "../../../catalog/writer.ts";
import type { Engine } from "../../../native/engine.ts";
import { type Config, defaultConfig } from "../../../schema/config.ts";
import { catalogNodeId, prefixChain } from "../../../schema/identity.ts";
import type { ContinuationId } from "../../../schema/ids.ts";
import { silentLogger } from "../../../schema/log.ts";
import {
  type Calibration,
  type ConfiguredCosts,
  initialCalibration,
} from "../../../worker/calibration/calibration.ts";
import { releaseWindow } from "../../../worker/model/layout.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { PageHashChain } from "../../../worker/pages/page-hashes.ts";
import {
  DurableCache,
  type DurableCacheOptions,
  durableGeometry,
} from "../../../worker/restore/durable-cache.ts";
import { Restorer } from "../../../worker/restore/restorer.ts";
import { loadEngine } from "../../../worker/runtime/engine-load.ts";
import { WorkerRuntime } from "../../../worker/runtime/runtime.ts";
import type { RuntimeOptions } from "../../../worker/runtime/runtime-api.ts";

export const PAGE = 16;
/** 130 is not a multiple of 16: chunk boundaries fall inside pages (rows 130, 260, 390). */
export const CHUNK = 130;

/** Test credentials of the S3 server the global setup started. */
export function s3Settings(bucket: string, endpoint?: string): Config["store"]["s3"] {
  return {
    ...defaultConfig.store.s3,
    enabled: true,
    endpoint: endpoint ?? process.env.CONTINUUM_S3_ENDPOINT!,
    accessKeyId: process.env.CONTINUUM_S3_ACCESS_KEY_ID!,
    secretAccessKey: process.env.CONTINUUM_S3_SECRET_ACCESS_KEY!,
    region: process.env.CONTINUUM_S3_REGION ?? "us-east-1",
    bucket,
    // A stand-in endpoint (a dead or silent server) is never asked to create the bucket.
    createBucket: endpoint === undefined,
    maxAttempts: 2,
    requestTimeoutMs: 5_000,
  };
}

export const uniqueBucket = (): string => `restore-${randomUUID().slice(0, 8)}`;

export const costs: ConfiguredCosts = {
  prefillPerTokenMs: 0.5,
  firstTokenMs: 1,
  decodeStepMs: 1,
  restorePerByteMs: { ram: 1e-7, ssd: 1e-6, peer: 1e-5, s3: 1e-4 },
};

/** A calibration in which only `tier` is cheaper than recompute, so a plan must take it first. */
export function preferring(tier: "ram" | "ssd" | "peer" | "s3"): Calibration {
  const per = { ram: 1, ssd: 1, peer: 1, s3: 1 };
  per[tier] = 1e-7;
  return initialCalibration({ ...costs, restorePerByteMs: per });
}

/** The catalog writer running over `log` until stop(). */
export function startWriter(log: TxLogReader & WriterLog): { stop(): Promise<void> } {
  const writer = new CatalogWriter({ log, newDb: () => CatalogDb.empty(), logger: silentLogger });
  const run = writer.run().catch(() => undefined);
  return {
    async stop() {
      await writer.stop();
      await run;
    },
  };
}

export interface TestWorker {
  readonly id: string;
  readonly engine: Engine;
  readonly cache: DurableCache;
  readonly runtime: WorkerRuntime;
  readonly dir: string;
  close(): Promise<void>;
}

export interface WorkerSpec {
  readonly id: string;
  readonly log: CatalogLog;
  readonly s3Bucket?: string;
  /** Another S3 endpoint than the test server (a dead or silent one). */
  readonly s3Endpoint?: string;
  readonly ramBytes?: number;
  /** store.dir.maxBytes (default 1 GiB). */
  readonly fileBytes?: number;
  readonly secret?: string;
  readonly runtime?: Partial<RuntimeOptions>;
  readonly cache?: Partial<DurableCacheOptions>;
  /** Reuse a data directory (a restarted worker); it is then left in place at close. */
  readonly dir?: string;
}

/** The test workers' runtime options for `model`, with `overrides`. */
export function runtimeOptions(model: LoadedModel, overrides: Partial<RuntimeOptions> = {}): RuntimeOptions {
  return {
    fingerprint: model.fingerprint,
    vocab: model.config.spec.vocab,
    maxContext: model.config.spec.maxPosition,
    layers: model.config.spec.layers,
    pageTokens: PAGE,
    physicalPages: 256,
    maxBatchTokens: 256,
    maxBatchSeqs: 16,
    minPrefillTokens: 32,
    prefillTile: 64,
    maxQueued: 64,
    costs,
    logger: silentLogger,
    ...overrides,
  };
}

/** One worker: engine, durable cache (own store dir, own replica, peer server) and a started runtime with its hooks. */
export async function startWorker(model: LoadedModel, spec: WorkerSpec): Promise<TestWorker> {
  const dir = spec.dir ?? (await mkdtemp(join(tmpdir(), `continuum-restore-${spec.id}-`)));
  const config = {
    pages: { ...defaultConfig.pages, pageTokens: PAGE, chunkTokens: CHUNK },
    store: {
      dataDir: dir,
      ram: { maxBytes: spec.ramBytes ?? 64 << 20 },
      dir: { path: join(dir, "store"), maxObjectBytes: 64 << 20, maxBytes: spec.fileBytes ?? 1 << 30 },
      s3: spec.s3Bucket ? s3Settings(spec.s3Bucket, spec.s3Endpoint) : defaultConfig.store.s3,
    },
    worker: { ...defaultConfig.worker, id: spec.id },
    auth: { ...defaultConfig.auth, clusterSecret: spec.secret ?? "cluster-secret" },
  };
  const ropts = runtimeOptions(model, spec.runtime);
  const engine = await loadEngine(model, ropts, { threads: 1 });
  const cache = await DurableCache.open({
    engine,
    fingerprint: model.fingerprint,
    modelName: "tiny",
    layout: model.manifest.layout,
    config,
    log: spec.log,
    logger: silentLogger,
    peerPort: 0,
    fetchTimeoutMs: 2_000,
    storeReport: () => undefined,
    ...spec.cache,
  });
  const runtime = new WorkerRuntime(engine, { ...ropts, ...cache.hooks });
  runtime.start();
  return {
    id: spec.id,
    engine,
    cache,
    runtime,
    dir,
    async close() {
      await runtime.stop();
      await cache.close();
      engine.free();
      if (spec.dir === undefined) await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Greedy generation through a runtime: the tokens and how many prompt tokens were reused. */
export const generate = (
  runtime: WorkerRuntime,
  prompt: readonly number[],
  maxTokens: number,
  salt?: string,
) => generateGreedy(runtime, prompt, maxTokens, { salt });

/** A deterministic prompt of `n` tokens below `vocab`. */
export function promptOf(n: number, seed: number, vocab = 512): number[] {
  return xorshiftTokens(n, seed, vocab);
}

/** A bare device for exactness checks (bench/_greedy-device.ts) of 256 pages, its invariants checked after each change. */
export class Device extends GreedyDevice {
  /** `release`: pages dead for every layer's window are released, as the runtime does (default true). */
  static async open(model: LoadedModel, opts: { readonly release?: boolean } = {}): Promise<Device> {
    const window = opts.release === false ? null : releaseWindow(model.config.spec.layers);
    const engine = await loadEngine(model, { physicalPages: 256, pageTokens: PAGE }, { threads: 1 });
    return new Device(engine, { pageTokens: PAGE, physicalPages: 256, debugInvariants: true, window });
  }
}

export { bitEqual };

/** A restorer over `worker`'s tiers and catalog identity that loads into another engine (a Device's). */
export function restorerFor(
  worker: TestWorker,
  engine: Engine,
  opts: { peerSecret?: string; fetchTimeoutMs?: number } = {},
): Restorer {
  return new Restorer({
    engine,
    ...durableGeometry(engine.spec),
    tiers: worker.cache.tiers,
    catalog: worker.cache.catalog,
    pageTokens: PAGE,
    chunkTokens: CHUNK,
    peerSecret: opts.peerSecret ?? "cluster-secret",
    fetchTimeoutMs: opts.fetchTimeoutMs ?? 2_000,
    logger: silentLogger,
  });
}

/** Waits until `worker`'s replica has `chunks` leading chunks of `prompt` published. */
export async function waitPublished(
  worker: TestWorker,
  prompt: readonly number[],
  chunks: number,
  salt?: string,
): Promise<void> {
  const fp = worker.cache.catalog.id.fingerprint;
  const nodes = prefixChain(prompt.slice(0, -1), CHUNK, salt).map((n) => catalogNodeId(fp, n.hash));
  const ok = await worker.cache.catalog.waitUntil(
    () => longestPublishedPrefix(worker.cache.catalog.db, nodes).length >= chunks,
    30_000,
  );
  if (!ok) throw new Error(`${worker.id}: ${chunks} chunks of the prompt were not published in time`);
}

/** Restores `prompt`'s prefix into a fresh route of `dev` through `restorer`, preferring `calibration`'s tier. */
export async function restoreInto(
  dev: Device,
  restorer: Restorer,
  prompt: readonly number[],
  calibration: Calibration,
  residentTokens = 0,
  name = `r-${randomUUID().slice(0, 8)}`,
): Promise<{ route: ContinuationId; restoreTo: number; ok: boolean }> {
  const route = dev.openRoute(name, prompt.length + 16);
  // A resident prefix computed here first (page-aligned), as admission would adopt it.
  if (residentTokens > 0) await dev.continueGreedy(route, prompt.slice(0, residentTokens), 0);
  const ticket = restorer.begin({
    routes: [route],
    tokens: prompt.slice(0, -1),
    pageHashes: new PageHashChain(PAGE, undefined).extend(prompt, prompt.length - 1),
    salt: undefined,
    residentTokens: dev.pages.route(route).tokens,
    pages: dev.pages,
    calibration,
    record: () => undefined,
  });
  if (ticket === null) return { route, restoreTo: dev.pages.route(route).tokens, ok: false };
  return { route, restoreTo: ticket.restoreTo, ok: await ticket.done };
}
