import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmbeddedLog } from "../../../catalog/log-embedded.ts";
import { catalogNodeId, prefixChain } from "../../../schema/identity.ts";
import { ContentId, type NodeId } from "../../../schema/ids.ts";
import { silentLogger } from "../../../schema/log.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { FileReclaimer, pickReclaim } from "../../../worker/reclaim/file-reclaimer.ts";
import { fileHeadroom } from "../../../worker/restore/durable-cache.ts";
import {
  CHUNK,
  generate,
  promptOf,
  startWorker,
  startWriter,
  type TestWorker,
  uniqueBucket,
  waitPublished,
} from "../restore/harness.ts";
import { tinyModel } from "../runtime/fixture.ts";

const id = (c: string) => ContentId(c.repeat(64));

describe("pickReclaim (pure)", () => {
  const coldest = [
    { id: id("a"), storedBytes: 100 },
    { id: id("b"), storedBytes: 100 },
    { id: id("c"), storedBytes: 100 },
    { id: id("d"), storedBytes: 100 },
  ];
  it("takes the coldest droppable objects until the bytes needed are free", () => {
    const got = pickReclaim(coldest, 150, (x) => x !== id("a"), 64);
    expect(got.map((c) => c.id)).toEqual([id("b"), id("c")]);
  });
  it("stops at maxDelete, and picks nothing when nothing is droppable or nothing is needed", () => {
    expect(pickReclaim(coldest, 1000, () => true, 3)).toHaveLength(3);
    expect(pickReclaim(coldest, 1000, () => false, 64)).toEqual([]);
    expect(pickReclaim(coldest, 0, () => true, 64)).toEqual([]);
  });
  it("keeps a sixteenth of the files free, at least two chunks, at most all of them", () => {
    expect(fileHeadroom(32 * 2 ** 30, 8 << 20)).toBe(2 * 2 ** 30);
    expect(fileHeadroom(64 << 20, 8 << 20)).toBe(16 << 20);
    expect(fileHeadroom(1 << 20, 8 << 20)).toBe(1 << 20);
  });
});

/**
 * Real workers (runtime, durable cache, embedded catalog, the test S3
 * server). A worker's first capture always pays (its capture cost is not yet
 * measured), so each worker here computes one long prompt and checkpoints it
 * in one capture.
 */
describe("the file reclaimer (real workers, catalog and S3)", () => {
  let model: LoadedModel;
  let cleanupModel: () => Promise<void>;
  let log: EmbeddedLog;
  let writer: { stop(): Promise<void> };
  let bucket: string;
  let chunkBytes: number;
  let epoch = 0;

  beforeAll(async () => {
    ({ model, cleanup: cleanupModel } = await tinyModel());
    log = await EmbeddedLog.open();
    writer = startWriter(log);
    bucket = uniqueBucket();
    const s = model.config.spec;
    chunkBytes = CHUNK * s.nLayers * s.nKvHeads * (s.headDim + s.vHeadDim) * 2;
  });

  afterAll(async () => {
    await writer?.stop();
    await log?.close();
    await cleanupModel?.();
  });

  const nodesOf = (w: TestWorker, prompt: readonly number[]): NodeId[] =>
    prefixChain(prompt.slice(0, -1), CHUNK).map((n) => catalogNodeId(w.cache.catalog.id.fingerprint, n.hash));
  const contentOf = (w: TestWorker, node: NodeId) => {
    const db = w.cache.catalog.db;
    return ContentId(db.get(db.eidOf("chunk/node", node)!, "chunk/content"));
  };

  it("deletes only the coldest chunks S3 holds and this worker's SSD is not placed to hold, withdrawing their SSD replicas first", async () => {
    // No S3 tier here (so no reclaimer of its own): S3 copies are stated in the catalog, a reclaimer built by hand.
    const w = await startWorker(model, { id: "rc-a", log });
    try {
      const prompt = promptOf(5 * CHUNK + 11, 31); // five whole chunks
      await generate(w.runtime, prompt, 2);
      await w.cache.idle();
      await waitPublished(w, prompt, 5);
      const nodes = nodesOf(w, prompt);
      const cat = w.cache.catalog;
      // S3 holds chunks 1-4, not chunk 0; chunk 1 is placed on this worker's SSD.
      epoch++;
      await cat.propose([
        ...nodes.slice(1).map((node) => ({
          op: "replica.ready" as const,
          node,
          worker: "rc-a",
          tier: "s3" as const,
          verifiedAt: Date.now(),
        })),
        { op: "lease.acquire", key: "placement", holder: "test-authority", epoch, ttlMs: 600_000 },
        {
          op: "placement.set",
          node: nodes[1]!,
          worker: "rc-a",
          tier: "ssd",
          desired: true,
          lease: "placement",
          epoch,
        },
      ]);
      expect(await cat.waitUntil(() => nodes.slice(1).every((n) => cat.holdsReady(n, "s3")), 10_000)).toBe(
        true,
      );
      const file = w.cache.tiers.file;
      const one = file.stats().bytes! / 5;
      // Headroom that needs two more chunks' room than is free now.
      const reclaimer = new FileReclaimer({
        file,
        catalog: cat,
        logger: silentLogger,
        headroomBytes: Math.ceil(file.freeBytes() + 1.5 * one),
        intervalMs: 3_600_000,
        maxScan: 1024,
        maxDelete: 64,
      });
      try {
        await reclaimer.tick();
        // Chunk 0 (only durable here) and chunk 1 (placed) stay; the next coldest, 2 and 3, go.
        const held = await Promise.all(nodes.map((n) => file.has(contentOf(w, n))));
        expect(held).toEqual([true, true, false, false, true]);
        expect(reclaimer.stats()).toMatchObject({ rounds: 1, deleted: 2, stuck: 0 });
        expect(
          await cat.waitUntil(
            () => !cat.holdsReady(nodes[2]!, "ssd") && !cat.holdsReady(nodes[3]!, "ssd"),
            10_000,
          ),
        ).toBe(true);
        expect([0, 1, 4].map((i) => cat.holdsReady(nodes[i]!, "ssd"))).toEqual([true, true, true]);
        // Enough room now: a tick does nothing.
        await reclaimer.tick();
        expect(reclaimer.stats().rounds).toBe(1);
      } finally {
        await reclaimer.stop();
      }
    } finally {
      await w.close();
    }
  }, 120_000);

  it("looks at only the maxScan coldest objects, and backs off after rounds that find nothing to delete", async () => {
    const w = await startWorker(model, { id: "rc-b", log });
    try {
      const prompt = promptOf(5 * CHUNK + 11, 33);
      await generate(w.runtime, prompt, 2);
      await w.cache.idle();
      await waitPublished(w, prompt, 5);
      const nodes = nodesOf(w, prompt);
      const cat = w.cache.catalog;
      // Only the warmest chunk has an S3 copy: beyond the two coldest a round looks at.
      await cat.propose([
        { op: "replica.ready", node: nodes[4]!, worker: "rc-b", tier: "s3", verifiedAt: Date.now() },
      ]);
      expect(await cat.waitUntil(() => cat.holdsReady(nodes[4]!, "s3"), 10_000)).toBe(true);
      const file = w.cache.tiers.file;
      const reclaimer = new FileReclaimer({
        file,
        catalog: cat,
        logger: silentLogger,
        headroomBytes: file.freeBytes() + 1,
        intervalMs: 3_600_000,
        maxScan: 2,
        maxDelete: 64,
      });
      try {
        for (let i = 0; i < 10; i++) await reclaimer.tick();
        // Rounds at ticks 1, 3 and 7 (after each stuck round, 2^streak − 1 ticks are passed over).
        expect(reclaimer.stats()).toMatchObject({ rounds: 3, stuck: 3, deleted: 0 });
        expect(await file.has(contentOf(w, nodes[4]!))).toBe(true);
      } finally {
        await reclaimer.stop();
      }
    } finally {
      await w.close();
    }
  }, 120_000);

  it("in a worker with S3, keeps headroom in files too small for its prompt, and the prompt is still served exactly", async () => {
    // Files for five chunks and their frames; the prompt has nine.
    const w = await startWorker(model, {
      id: "rc-w",
      log,
      s3Bucket: bucket,
      fileBytes: 5 * (chunkBytes + 2048),
    });
    try {
      const prompt = promptOf(9 * CHUNK + 30, 32); // nine whole chunks, all in sealed pages
      const first = await generate(w.runtime, prompt, 2);
      await w.cache.idle();
      await waitPublished(w, prompt, 9);
      const nodes = nodesOf(w, prompt);
      const cat = w.cache.catalog;
      expect(await cat.waitUntil(() => nodes.every((n) => cat.holdsReady(n, "s3")), 30_000)).toBe(true);
      const file = w.cache.tiers.file;
      const headroom = fileHeadroom(file.maxBytes, chunkBytes);
      const reclaimer = w.cache.reclaimer!;
      for (let i = 0; i < 20 && file.freeBytes() < headroom; i++) await reclaimer.tick();
      expect(file.freeBytes()).toBeGreaterThanOrEqual(headroom);
      expect(reclaimer.stats().deleted).toBeGreaterThan(0);
      // A chunk not in the files has no SSD replica here; every chunk is still in S3.
      for (const n of nodes) {
        if (await file.has(contentOf(w, n))) continue;
        expect(await cat.waitUntil(() => !cat.holdsReady(n, "ssd"), 10_000)).toBe(true);
      }
      expect(nodes.every((n) => cat.holdsReady(n, "s3"))).toBe(true);
      // A fresh worker on the same catalog and bucket serves the whole prefix from what is left, exactly.
      const other = await startWorker(model, { id: "rc-o", log, s3Bucket: bucket });
      try {
        const again = await generate(other.runtime, prompt, 2);
        expect(again.cachedTokens).toBe(9 * CHUNK);
        expect(again.tokens).toEqual(first.tokens);
      } finally {
        await other.close();
      }
    } finally {
      await w.close();
    }
  }, 120_000);
});
