import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmbeddedLog } from "../../../catalog/log-embedded.ts";
import { PausableRelay } from "../../../deploy/relay.ts";
import { catalogNodeId, prefixChain } from "../../../schema/identity.ts";
import { captureDecision } from "../../../worker/checkpoint/admission.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import {
  CHUNK,
  generate,
  promptOf,
  startWorker,
  startWriter,
  type TestWorker,
  uniqueBucket,
} from "../restore/harness.ts";
import { tinyModel } from "../runtime/fixture.ts";

/**
 * Checkpoint admission recovers after a slow S3. The admission charges each
 * chunk its measured capture cost; that cost once included the wait for the
 * S3 upload, so one slow upload priced every later chunk out, and with no
 * capture nothing re-measured it: writes never resumed. Now the capture cost
 * ends at the local writes (the S3 wait is measured apart), and a run of
 * declines is broken by a probe that re-measures.
 *
 * The slow S3 is the real test S3 server behind a TCP relay that holds every
 * byte while paused and forwards it when resumed.
 */

describe("checkpoint admission re-probe (pure)", () => {
  const costs = { prefillPerTokenMs: 0.1, capturePerByteMs: 1, restorePerByteMs: 1e-6 };
  const chunk = { tokens: 256, bytes: 1e6, hits: 0 };
  it("declines a chunk priced out by its capture cost until probeEvery declines in a row, then probes", () => {
    const before = captureDecision(chunk, costs, { declinedSinceSample: 7, probeEvery: 8 });
    expect(before).toMatchObject({ capture: false, probe: false });
    const at = captureDecision(chunk, costs, { declinedSinceSample: 8, probeEvery: 8 });
    expect(at).toMatchObject({ capture: true, probe: true });
    expect(at.expectedValueMs).toBeLessThan(0);
  });
  it("never probes a chunk whose restore costs more than recomputing it", () => {
    const d = captureDecision(
      chunk,
      { ...costs, restorePerByteMs: 1 },
      { declinedSinceSample: 99, probeEvery: 8 },
    );
    expect(d).toMatchObject({ capture: false, probe: false });
  });
  it("a chunk that pays is captured without being a probe; a bad probeEvery is refused", () => {
    const d = captureDecision(
      chunk,
      { ...costs, capturePerByteMs: 1e-9 },
      { declinedSinceSample: 0, probeEvery: 8 },
    );
    expect(d).toMatchObject({ capture: true, probe: false });
    expect(() => captureDecision(chunk, costs, { declinedSinceSample: 0, probeEvery: 0 })).toThrow(
      /probeEvery/,
    );
  });
});

describe("checkpoints resume after a slow S3 (real S3 server behind a relay, real worker runtime)", () => {
  let model: LoadedModel;
  let cleanupModel: () => Promise<void>;
  let log: EmbeddedLog;
  let writer: { stop(): Promise<void> };
  let relay: PausableRelay;
  let w: TestWorker;

  beforeAll(async () => {
    ({ model, cleanup: cleanupModel } = await tinyModel());
    log = await EmbeddedLog.open();
    writer = startWriter(log);
    relay = await PausableRelay.start(new URL(process.env.CONTINUUM_S3_ENDPOINT!));
    const bucket = uniqueBucket();
    // The bucket is created through the real endpoint first; the worker talks through the relay.
    const setup = await startWorker(model, { id: "cr-setup", log, s3Bucket: bucket });
    await setup.close();
    w = await startWorker(model, { id: "cr-w", log, s3Bucket: bucket, s3Endpoint: relay.endpoint });
  });

  afterAll(async () => {
    relay?.resume();
    await w?.close();
    await relay?.close();
    await writer?.stop();
    await log?.close();
    await cleanupModel?.();
  });

  function s3Ready(prompt: readonly number[]): number {
    const db = w.cache.catalog.db;
    const fp = w.cache.catalog.id.fingerprint;
    let n = 0;
    for (const node of prefixChain(prompt.slice(0, -1), CHUNK)) {
      const c = db.eidOf("chunk/node", catalogNodeId(fp, node.hash));
      if (c === undefined) continue;
      for (const r of db.replicasOf(c))
        if (db.get(r, "replica/tier") === "s3" && db.get(r, "replica/state") === "ready") n++;
    }
    return n;
  }

  it("a capture whose S3 upload waited seconds does not price out later chunks: they reach S3 and are published", async () => {
    // 400 tokens: 3 chunks of 130 (the pending last token is not hashed).
    const slow = promptOf(401, 51);
    relay.pause();
    await generate(w.runtime, slow, 2);
    // Hold the upload long enough that, charged per byte, it would exceed any chunk's recompute time.
    await new Promise((r) => setTimeout(r, 3_000));
    relay.resume();
    await w.cache.idle();
    const afterSlow = w.cache.checkpointer.stats();
    expect(afterSlow.chunksPublished).toBeGreaterThanOrEqual(1);
    expect(afterSlow.confirmWaitMs.value).toBeGreaterThan(1_000);
    // The capture cost stayed what the local work costs: a chunk's capture is far shorter than the upload wait.
    const s = model.config.spec;
    const chunkBytes = CHUNK * s.nLayers * s.nKvHeads * (s.headDim + s.vHeadDim) * 2;
    expect(afterSlow.capturePerByteMs.value * chunkBytes).toBeLessThan(afterSlow.confirmWaitMs.value / 2);

    // S3 is back. Whether a chunk of the tiny model pays for its capture is
    // the estimate's call (its capture, two fsyncs, can cost more than 130
    // tokens of recompute); either way it is re-measured: a new prefix is
    // captured outright, or as the probe after at most probeEvery (8) declines
    // in a row. So within 2 × 8 + 1 new prefixes, one reaches S3 and is published.
    let resumed: number | undefined;
    for (let i = 0; i < 17 && resumed === undefined; i++) {
      const next = promptOf(401, 100 + i);
      const published = w.cache.checkpointer.stats().chunksPublished;
      await generate(w.runtime, next, 2);
      await w.cache.idle();
      if (w.cache.checkpointer.stats().chunksPublished === published) continue;
      expect(await w.cache.catalog.waitUntil(() => s3Ready(next) === 3, 30_000)).toBe(true);
      resumed = i;
    }
    const after = w.cache.checkpointer.stats();
    expect(resumed, JSON.stringify(after)).toBeDefined();
    expect(after.chunksPublished).toBeGreaterThanOrEqual(afterSlow.chunksPublished + 3);
    expect(after.failed).toBe(0);
  }, 120_000);
});
