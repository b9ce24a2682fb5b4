import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KafkaLog } from "../../../catalog/kafka/log.ts";
import { readyReplicasOfChunk } from "../../../catalog/queries.ts";
import { type CatalogOp, ProposalMsg } from "../../../schema/catalog.ts";
import { catalogNodeId, prefixChain } from "../../../schema/identity.ts";
import type { NodeId } from "../../../schema/ids.ts";
import type { Logger } from "../../../schema/log.ts";
import { encodeMessage } from "../../../schema/wire.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import type { PlacedTier } from "../../../worker/prefetch/plan.ts";
import { Prefetcher, type PrefetcherOptions } from "../../../worker/prefetch/prefetcher.ts";
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

/**
 * Prefetch against the real fleet parts: a Kafka catalog with one writer, a
 * shared S3 bucket, workers with their own disks. Worker A computes prompts
 * (its checkpoints publish them, with S3 copies); placements addressed to
 * other workers (proposed here under a lease, as the placement authority
 * would) make those workers pull the chunks ahead of any request.
 */
let model: LoadedModel;
let cleanupModel: () => Promise<void>;
const cleanups: (() => Promise<unknown>)[] = [];
const brokers = process.env.CONTINUUM_KAFKA_BROKERS;

beforeAll(async () => {
  ({ model, cleanup: cleanupModel } = await tinyModel());
});
afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
  await cleanupModel?.();
});

/** A logger that keeps every line (the skips must be logged). */
function recordingLogger(): Logger & { lines: { event: string; fields: Record<string, unknown> }[] } {
  const lines: { event: string; fields: Record<string, unknown> }[] = [];
  const l = {
    lines,
    log: (_level: string, event: string, fields?: Record<string, unknown>) => {
      lines.push({ event, fields: fields ?? {} });
    },
    child: () => l,
  };
  return l;
}

const MIB = 1 << 20;

describe.skipIf(!brokers)("prefetch: placements pulled ahead of demand (real Kafka and S3)", () => {
  const suffix = randomUUID().slice(0, 8);
  const topics = {
    proposals: `pf-${suffix}.proposals`,
    tx: `pf-${suffix}.tx`,
    rejections: `pf-${suffix}.rejections`,
  };
  const open = (who: string) =>
    KafkaLog.open({ brokers: brokers!.split(","), clientId: `pf-${who}-${suffix}`, topics });
  let control: KafkaLog;
  const bucket = uniqueBucket();
  let epoch = 0;
  let seq = 0;

  const propose = (ops: CatalogOp[]) =>
    control.propose(encodeMessage(ProposalMsg, { id: `test-${suffix}-${++seq}`, clientId: "test", ops }));
  /** Placement changes under the test's own lease (acquired at a fresh epoch each time). */
  const place = async (worker: string, nodes: readonly NodeId[], tier: PlacedTier, desired: boolean) => {
    epoch++;
    await propose([
      { op: "lease.acquire", key: "placement", holder: "test-authority", epoch, ttlMs: 600_000 },
      ...nodes.map((node) => ({
        op: "placement.set" as const,
        node,
        worker,
        tier,
        desired,
        lease: "placement",
        epoch,
      })),
    ]);
  };
  const nodesOf = (w: TestWorker, prompt: readonly number[], salt?: string) =>
    prefixChain(prompt.slice(0, -1), CHUNK, salt).map((n) =>
      catalogNodeId(w.cache.catalog.id.fingerprint, n.hash),
    );

  const worker = async (id: string, ramBytes?: number, fileBytes?: number) => {
    const log = await open(id);
    cleanups.push(() => log.close());
    const w = await startWorker(model, {
      id,
      log,
      s3Bucket: bucket,
      ...(ramBytes ? { ramBytes } : {}),
      ...(fileBytes ? { fileBytes } : {}),
    });
    cleanups.push(() => w.close());
    return w;
  };
  const prefetcher = (w: TestWorker, over: Partial<PrefetcherOptions> = {}) => {
    const p = new Prefetcher({
      tiers: w.cache.tiers,
      catalog: w.cache.catalog,
      // Peers off: S3 is the only tier the workers share.
      peerSecret: "",
      maxQueued: 8,
      ramBytes: 32 * MIB,
      ssdBytes: 64 * MIB,
      fetchTimeoutMs: 5_000,
      maxDeferMs: 5_000,
      retryMs: 500,
      busy: () => false,
      logger: recordingLogger(),
      ...over,
    });
    cleanups.push(() => p.stop());
    return p;
  };
  /**
   * A prompt computed and checkpointed by a fresh publisher (its first
   * prefill is priced at the configured cost, so its capture pays; a worker's
   * later captures of the tiny model's cheap prefill do not), published with
   * its S3 copies uploaded.
   */
  let publishers = 0;
  const computed = async (
    seed: number,
    salt?: string,
  ): Promise<{ prompt: number[]; nodes: NodeId[]; by: string }> => {
    const by = `pf-a${++publishers}`;
    const a = await worker(by);
    const prompt = promptOf(420, seed);
    await generate(a.runtime, prompt, 2, salt);
    await a.cache.idle();
    await a.cache.tiers.store.drain();
    await waitPublished(a, prompt, 3, salt);
    return { prompt, nodes: nodesOf(a, prompt, salt), by };
  };
  /** Polls `pred` (catalog state or log lines) every 20 ms, for at most 30 s. */
  const waitFor = async (what: string, pred: () => boolean) => {
    const deadline = Date.now() + 30_000;
    while (!pred()) {
      if (Date.now() > deadline) throw new Error(`${what}: not reached in 30 s`);
      await new Promise((r) => setTimeout(r, 20));
    }
  };

  beforeAll(async () => {
    control = await open("control");
    cleanups.push(() => control.close());
    const writer = startWriter(control);
    cleanups.push(() => writer.stop());
  });

  it("a placed prefix is pulled into the worker's RAM; a later request there restores it from RAM with no fetch on its token path", async () => {
    const b = await worker("pf-b");
    const { prompt, nodes } = await computed(41);
    const log = recordingLogger();
    const pf = prefetcher(b, { logger: log });
    await place("pf-b", nodes, "ram", true);
    await waitFor("B holds the placed chunks in RAM", () =>
      nodes.every((n) => b.cache.catalog.holdsReady(n, "ram")),
    );
    await pf.idle();
    expect(pf.stats().fetched.ram).toBe(3);
    expect(log.lines.filter((l) => l.event === "prefetch.stored")).toHaveLength(3);

    const before = b.cache.restorer.stats();
    const out = await generate(b.runtime, prompt, 2);
    expect(out.cachedTokens).toBe(390);
    const after = b.cache.restorer.stats();
    expect(after.chunks.ram - before.chunks.ram).toBe(3);
    expect(after.chunks.s3 - before.chunks.s3).toBe(0);
    expect(after.chunks.peer - before.chunks.peer).toBe(0);
    // The placed copies served those reads.
    expect(pf.stats().hits).toBe(3);
  });

  it("a tenant's salted prefix is pulled too: its root chunk's parent is the salted root, which the catalog does not hold", async () => {
    const b = await worker("pf-salted");
    const salt = "tenant-7";
    const { prompt, nodes } = await computed(44, salt);
    const log = recordingLogger();
    const pf = prefetcher(b, { logger: log });
    await place("pf-salted", nodes, "ram", true);
    await waitFor("the salted chunks held in RAM", () =>
      nodes.every((n) => b.cache.catalog.holdsReady(n, "ram")),
    );
    await pf.idle();
    expect(pf.stats().fetched.ram).toBe(3);
    expect(log.lines.filter((l) => l.event === "prefetch.wrong_chunk")).toHaveLength(0);
    const out = await generate(b.runtime, prompt, 2, salt);
    expect(out.cachedTokens).toBe(390);
    expect(pf.stats().hits).toBe(3);
  });

  it("a full queue and a full store skip the prefetch and log it; nothing waits for room", async () => {
    const c = await worker("pf-c");
    const one = await computed(42);
    const two = await computed(43);
    // The runtime looks busy, so the first job waits (deferred) and the queue of 1 stays full.
    let busy = true;
    const qlog = recordingLogger();
    const pq = prefetcher(c, { maxQueued: 1, busy: () => busy, maxDeferMs: 60_000, logger: qlog });
    await place("pf-c", one.nodes, "ram", true);
    await waitFor("a queue_full skip", () => qlog.lines.some((l) => l.event === "prefetch.skipped"));
    const skips = qlog.lines.filter((l) => l.event === "prefetch.skipped");
    expect(skips.every((l) => l.fields.reason === "queue_full")).toBe(true);
    expect(pq.stats().skipped.queue_full).toBeGreaterThanOrEqual(2);
    busy = false;
    await pq.stop();

    // A RAM budget below one chunk: every placed chunk is skipped as store_full.
    const slog = recordingLogger();
    const ps = prefetcher(c, { ramBytes: 1024, logger: slog });
    await place("pf-c", two.nodes, "ram", true);
    await waitFor(
      "three store_full skips",
      () => slog.lines.filter((l) => l.fields.reason === "store_full").length >= 3,
    );
    await ps.idle();
    expect(ps.stats().fetched.ram).toBe(0);
    expect(two.nodes.some((n) => c.cache.catalog.holdsReady(n, "ram"))).toBe(false);

    // Files at their byte bound (store.dir.maxBytes, below one chunk): SSD placements skip as store_full.
    const e = await worker("pf-e", undefined, 1024);
    const flog = recordingLogger();
    const pf = prefetcher(e, { logger: flog });
    await place("pf-e", two.nodes, "ssd", true);
    await waitFor(
      "three store_full skips at the file bound",
      () => flog.lines.filter((l) => l.fields.reason === "store_full").length >= 3,
    );
    await pf.idle();
    expect(flog.lines.some((l) => /store\.dir\.maxBytes/.test(String(l.fields.detail)))).toBe(true);
    expect(pf.stats().fetched.ssd).toBe(0);
    const s3 = e.cache.tiers.s3!.stats();
    expect(s3.hits + s3.misses).toBe(0); // skipped before any fetch, not after
    expect(two.nodes.some((n) => e.cache.catalog.holdsReady(n, "ssd"))).toBe(false);
  });

  it("a withdrawn placement lets its copy go, but never the last durable copy", async () => {
    const d = await worker("pf-d");
    const { nodes, by } = await computed(44);
    const log = recordingLogger();
    const pf = prefetcher(d, { logger: log });
    await place("pf-d", nodes, "ssd", true);
    await waitFor("D holds the placed chunks on SSD", () =>
      nodes.every((n) => d.cache.catalog.holdsReady(n, "ssd")),
    );
    await pf.idle();
    const content = (n: NodeId) => {
      const db = d.cache.catalog.db;
      return db.get(db.eidOf("chunk/node", n)!, "chunk/content") as never;
    };
    // The last chunk's other durable copies go (its S3 object and the publisher's SSD copy are withdrawn):
    // pf-d's copy is now the only durable one.
    const last = nodes[2]!;
    await propose([
      { op: "replica.removed", node: last, worker: by, tier: "s3", verifiedAt: Date.now() },
      { op: "replica.removed", node: last, worker: by, tier: "ssd", verifiedAt: Date.now() },
    ]);
    await waitFor("the other copies withdrawn", () => {
      const db = d.cache.catalog.db;
      return readyReplicasOfChunk(db, db.eidOf("chunk/node", last)!).every(
        (r) => r.worker !== by || r.tier === "ram",
      );
    });
    await place("pf-d", nodes, "ssd", false);
    // The first two (S3 still holds them) are deleted and their replicas withdrawn…
    await waitFor(
      "the first two deleted",
      () => !d.cache.catalog.holdsReady(nodes[0]!, "ssd") && !d.cache.catalog.holdsReady(nodes[1]!, "ssd"),
    );
    await pf.idle();
    expect(await d.cache.tiers.file.has(content(nodes[0]!))).toBe(false);
    expect(await d.cache.tiers.file.has(content(nodes[1]!))).toBe(false);
    // …the last durable copy stays, ready, and says why.
    expect(d.cache.catalog.holdsReady(last, "ssd")).toBe(true);
    expect(await d.cache.tiers.file.has(content(last))).toBe(true);
    expect(log.lines.some((l) => l.event === "prefetch.kept_last_copy" && l.fields.node === last)).toBe(true);
    expect(pf.stats().deleted).toBe(2);
  });
});
