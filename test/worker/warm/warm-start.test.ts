import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmbeddedLog } from "../../../catalog/log-embedded.ts";
import { silentLogger } from "../../../schema/log.ts";
import { KvGeometry } from "../../../worker/checkpoint/chunk-format.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import {
  probeSamples,
  probeTiers,
  WARM_STEPS,
  WarmStart,
  warmCatalog,
  warmEngine,
  warmStep,
} from "../../../worker/warm/warm-start.ts";
import { startWorker, startWriter, uniqueBucket } from "../restore/harness.ts";
import { tinyModel } from "../runtime/fixture.ts";

/**
 * The warm-start steps against real parts: the tiers (RAM, files, the S3
 * server the test run started), the catalog (an embedded log on disk with
 * its writer) and the runtime on the native engine.
 */
let model: LoadedModel;
let cleanupModel: () => Promise<void>;
const cleanups: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  ({ model, cleanup: cleanupModel } = await tinyModel());
});
afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  await cleanupModel?.();
});

describe("WarmStart", () => {
  it("is ready only once every step is done, in order", () => {
    const w = new WarmStart();
    expect(w.ready).toBe(false);
    expect(() => w.mark("engine", 1)).toThrow(/engine before model, tiers, catalog/);
    for (const s of WARM_STEPS.slice(0, -1)) w.mark(s, 1);
    expect(w.ready).toBe(false);
    expect(w.missing()).toEqual(["registered"]);
    w.mark("registered", 2);
    expect(w.ready).toBe(true);
    expect(w.report()).toEqual({ model: 1, tiers: 1, catalog: 1, engine: 1, registered: 2 });
  });
});

describe("probeSamples", () => {
  it("turns each probed tier's best read into a restore sample, and skips a tier that is absent, full or failed", () => {
    const t = (readMs: number) => ({ ms: readMs * 3, readMs, bytes: 4096 });
    expect(probeSamples({ ram: t(0.1), ssd: "full", s3: "failed" })).toEqual([
      { kind: "restore", tier: "ram", bytes: 4096, deviceMs: 0.1, queueMs: 0 },
    ]);
    expect(probeSamples({ ram: null, ssd: t(0.5), s3: t(4) })).toEqual([
      { kind: "restore", tier: "ssd", bytes: 4096, deviceMs: 0.5, queueMs: 0 },
      { kind: "restore", tier: "s3", bytes: 4096, deviceMs: 4, queueMs: 0 },
    ]);
    expect(probeSamples({ ram: null, ssd: "full", s3: null })).toEqual([]);
  });
});

describe.skipIf(!process.env.CONTINUUM_S3_ENDPOINT)("the warm-up steps on a real worker", () => {
  it("probes every tier, runs the catalog queries, steps the engine and registers, leaving no probe behind", async () => {
    const dir = await mkdtemp(join(tmpdir(), "continuum-warm-"));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const log = await EmbeddedLog.open({ path: join(dir, "catalog.log") });
    cleanups.push(() => log.close());
    const writer = startWriter(log);
    cleanups.push(() => writer.stop());
    const w = await startWorker(model, {
      id: "warm-0",
      log,
      s3Bucket: uniqueBucket(),
      cache: { deferRegistration: true },
    });
    cleanups.push(() => w.close());
    // Deferred: the worker is not in the catalog until it is warm.
    expect(w.cache.catalog.db.eidOf("worker/id", "warm-0")).toBeUndefined();

    const warm = new WarmStart();
    warm.mark("model", 0);
    const chunkBytes = 128 * KvGeometry.of(model.config.spec).tokenBytes;
    const probe = await warmStep(warm, "tiers", () =>
      probeTiers(w.cache.tiers, "warm-0", silentLogger, chunkBytes),
    );
    for (const t of [probe.ram, probe.ssd, probe.s3]) {
      if (t === null || typeof t !== "object") throw new Error(`a tier did not probe: ${String(t)}`);
      expect(t.bytes).toBe(chunkBytes);
      expect(t.readMs).toBeGreaterThan(0);
      expect(t.ms).toBeGreaterThan(t.readMs);
    }
    // The reads become the tiers' first restore samples: measured, not the configured guess.
    const before = w.runtime.stats().calibration.restorePerByteMs;
    expect(before.s3.samples).toBe(0);
    const samples = probeSamples(probe);
    expect(samples.map((s) => s.kind === "restore" && s.tier)).toEqual(["ram", "ssd", "s3"]);
    for (const s of samples) w.runtime.calibrate(s);
    const after = w.runtime.stats().calibration.restorePerByteMs;
    const s3 = probe.s3 as { readMs: number; bytes: number };
    expect(after.s3).toEqual({ value: s3.readMs / s3.bytes, samples: 1 });
    expect(after.peer).toEqual(before.peer);
    expect(w.cache.tiers.ram!.stats().objects).toBe(0);
    // No object is left in the chunk files (objects/<2>/<2>/<id>) nor in S3.
    const files = await readdir(join(w.dir, "store", "objects"), { recursive: true, withFileTypes: true });
    expect(files.filter((f) => f.isFile())).toEqual([]);
    const inS3: unknown[] = [];
    for await (const o of w.cache.tiers.s3!.list()) inS3.push(o);
    expect(inS3).toEqual([]);

    await warmStep(warm, "catalog", () => warmCatalog(w.cache, w.runtime, 16, 10_000));
    const steps = w.runtime.stats().steps;
    await warmStep(warm, "engine", () => warmEngine(w.runtime, 16, model.config.spec.vocab));
    // A prefill step and a decode step ran.
    expect(w.runtime.stats().steps - steps).toBeGreaterThanOrEqual(2);
    // ... and left no page behind: the warm-up's pages are freed, not cached as a resident prefix.
    expect(w.runtime.stats().pagesFree).toBe(w.runtime.stats().pagesTotal);
    await warmStep(warm, "registered", () => w.cache.register());
    expect(w.cache.catalog.db.eidOf("worker/id", "warm-0")).toBeDefined();
    expect(warm.ready).toBe(true);
  });
});
