import { open } from "node:fs/promises";
import { createServer, type Server, type Socket } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmbeddedLog } from "../../../catalog/log-embedded.ts";
import { longestPublishedPrefix } from "../../../catalog/queries.ts";
import { PausableRelay } from "../../../deploy/relay.ts";
import { catalogNodeId, prefixChain } from "../../../schema/identity.ts";
import type { ContentId, NodeId } from "../../../schema/ids.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { tinyModel } from "../runtime/fixture.ts";
import {
  bitEqual,
  CHUNK,
  Device,
  generate,
  preferring,
  promptOf,
  restoreInto,
  restorerFor,
  startWorker,
  startWriter,
  type TestWorker,
  uniqueBucket,
  waitPublished,
} from "./harness.ts";

/**
 * Failures never change the output and never publish a partial chunk: a
 * corrupt or missing replica is proposed bad and the restore falls back (next
 * source, or recompute); a silent S3 is abandoned at its deadline; a worker
 * that dies between the store write and the publication leaves nothing
 * visible; an S3 upload that fails is never published.
 */
let model: LoadedModel;
let cleanupModel: () => Promise<void>;
let log: EmbeddedLog;
let writer: { stop(): Promise<void> };
const workers: TestWorker[] = [];
const devices: Device[] = [];
let silent: Server;
const sockets = new Set<Socket>();
let silentEndpoint: string;
let deadEndpoint: string;

async function worker(spec: Omit<Parameters<typeof startWorker>[1], "log">): Promise<TestWorker> {
  const w = await startWorker(model, { ...spec, log });
  workers.push(w);
  return w;
}
async function device(): Promise<Device> {
  const d = await Device.open(model);
  devices.push(d);
  return d;
}
async function reference(prompt: readonly number[]) {
  const d = await device();
  return d.continueGreedy(d.openRoute("ref", prompt.length + 16), prompt, 4);
}
function chunkEntity(
  w: TestWorker,
  prompt: readonly number[],
  i: number,
): { node: NodeId; content: ContentId } {
  const fp = w.cache.catalog.id.fingerprint;
  const node = catalogNodeId(fp, prefixChain(prompt.slice(0, -1), CHUNK)[i]!.hash);
  const e = w.cache.catalog.db.eidOf("chunk/node", node)!;
  return { node, content: w.cache.catalog.db.get(e, "chunk/content") as ContentId };
}
function replicaState(w: TestWorker, node: NodeId, worker: string, tier: string): string | undefined {
  const db = w.cache.catalog.db;
  const c = db.eidOf("chunk/node", node);
  if (c === undefined) return undefined;
  for (const r of db.replicasOf(c)) {
    if (db.get(r, "replica/tier") !== tier) continue;
    if (db.get(db.get(r, "replica/worker") as number, "worker/id") === worker)
      return db.get(r, "replica/state") as string;
  }
  return undefined;
}

beforeAll(async () => {
  ({ model, cleanup: cleanupModel } = await tinyModel());
  log = await EmbeddedLog.open();
  writer = startWriter(log);
  // A server that accepts connections and never answers: a stalled S3.
  silent = createServer((s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((r) => silent.listen(0, "127.0.0.1", r));
  silentEndpoint = `http://127.0.0.1:${(silent.address() as { port: number }).port}`;
  // A port nothing listens on: a stopped S3.
  const probe = createServer();
  await new Promise<void>((r) => probe.listen(0, "127.0.0.1", r));
  deadEndpoint = `http://127.0.0.1:${(probe.address() as { port: number }).port}`;
  await new Promise<void>((r) => probe.close(() => r()));
});

afterAll(async () => {
  for (const d of devices) d.close();
  for (const w of workers) await w.close();
  for (const s of sockets) s.destroy();
  await new Promise<void>((r) => silent?.close(() => r()));
  await writer?.stop();
  await log?.close();
  await cleanupModel?.();
});

describe("restore failures fall back and change nothing", () => {
  it("a corrupt SSD copy is detected, proposed bad, and the next source gives the same logits", async () => {
    const a = await worker({ id: "f-a" });
    const prompt = promptOf(300, 21);
    await generate(a.runtime, prompt, 2);
    await a.cache.idle();
    await waitPublished(a, prompt, 2);
    const { node, content } = chunkEntity(a, prompt, 0);
    // Flip bytes at the end of the stored object (the payload).
    const fh = await open(a.cache.tiers.file.pathOf(content), "r+");
    const { size } = await fh.stat();
    await fh.write(Buffer.alloc(64, 0x5a), 0, 64, size - 64);
    await fh.close();
    const dev = await device();
    const restorer = restorerFor(a, dev.engine);
    const r = await restoreInto(dev, restorer, prompt, preferring("ssd"));
    expect(r.ok).toBe(true);
    expect(r.restoreTo).toBe(260);
    expect(restorer.stats().fallbacks.corrupt).toBe(1);
    expect(restorer.stats().chunks.ram).toBe(1);
    const got = await dev.continueGreedy(r.route, prompt, 4);
    const ref = await reference(prompt);
    expect(bitEqual(got.logits, ref.logits)).toBe(true);
    expect(got.greedy).toEqual(ref.greedy);
    expect(await a.cache.catalog.waitUntil(() => replicaState(a, node, "f-a", "ssd") === "bad", 10_000)).toBe(
      true,
    );
    expect(replicaState(a, node, "f-a", "ram")).toBe("ready");
  });

  it("a chunk missing from every source abandons the load; recompute gives the same logits", async () => {
    const d = await worker({ id: "f-d" });
    const prompt = promptOf(300, 22);
    await generate(d.runtime, prompt, 2);
    await d.cache.idle();
    await waitPublished(d, prompt, 2);
    const { node, content } = chunkEntity(d, prompt, 1);
    await d.cache.tiers.ram?.delete(content);
    await d.cache.tiers.file.delete(content);
    const dev = await device();
    const free = dev.pages.availablePages;
    const restorer = restorerFor(d, dev.engine);
    const r = await restoreInto(dev, restorer, prompt, preferring("ssd"));
    expect(r.ok).toBe(false);
    // Nothing of the load is visible: the route holds no rows, its pages went back.
    expect(dev.pages.route(r.route).tokens).toBe(0);
    expect(dev.pages.snapshot().loadingPages).toBe(0);
    expect(restorer.stats().fallbacks.missing).toBe(2);
    const got = await dev.continueGreedy(r.route, prompt, 4);
    const ref = await reference(prompt);
    expect(bitEqual(got.logits, ref.logits)).toBe(true);
    expect(got.greedy).toEqual(ref.greedy);
    dev.pages.releaseRoute(r.route);
    expect(dev.pages.availablePages).toBe(free);
    expect(await d.cache.catalog.waitUntil(() => replicaState(d, node, "f-d", "ssd") === "bad", 10_000)).toBe(
      true,
    );
    expect(replicaState(d, node, "f-d", "ram")).toBe("bad");
  });

  it("a silent S3 is abandoned at the fetch deadline: the peer serves instead, bit-exact", async () => {
    const bucket = uniqueBucket();
    const a = await worker({ id: "f-s3a", s3Bucket: bucket });
    const prompt = promptOf(300, 23);
    await generate(a.runtime, prompt, 2);
    await a.cache.idle();
    const f = await worker({ id: "f-s3f", s3Bucket: bucket, s3Endpoint: silentEndpoint });
    await waitPublished(f, prompt, 2);
    // With no other source (peers off, nothing local yet), the silent S3 leaves recompute.
    const dev2 = await device();
    const alone = restorerFor(f, dev2.engine, { fetchTimeoutMs: 300, peerSecret: "" });
    const r2 = await restoreInto(dev2, alone, prompt, preferring("s3"));
    expect(r2.ok).toBe(false);
    expect(dev2.pages.route(r2.route).tokens).toBe(0);
    const got2 = await dev2.continueGreedy(r2.route, prompt, 4);
    const ref = await reference(prompt);
    expect(bitEqual(got2.logits, ref.logits)).toBe(true);

    // With the peer allowed, it serves after the deadline.
    const dev = await device();
    const restorer = restorerFor(f, dev.engine, { fetchTimeoutMs: 300 });
    const t0 = performance.now();
    const r = await restoreInto(dev, restorer, prompt, preferring("s3"));
    const ms = performance.now() - t0;
    expect(r.ok).toBe(true);
    expect(restorer.stats().fallbacks.unavailable).toBe(2);
    expect(restorer.stats().chunks.peer).toBe(2);
    // Two deadlines of 300 ms plus the peer reads; generous for a loaded machine.
    expect(ms).toBeLessThan(20_000);
    const got = await dev.continueGreedy(r.route, prompt, 4);
    expect(bitEqual(got.logits, ref.logits)).toBe(true);
    expect(got.greedy).toEqual(ref.greedy);
  });

  it("a worker killed between the store write and the publication leaves no visible chunk", async () => {
    let stored: NodeId | undefined;
    const g = await worker({
      id: "f-g",
      cache: {
        checkpoint: {
          beforePublish: async (node) => {
            stored = node;
            throw new Error("killed before publishing");
          },
        },
      },
    });
    const prompt = promptOf(300, 24);
    await generate(g.runtime, prompt, 2);
    await g.cache.idle();
    expect(stored).toBeDefined();
    expect(g.cache.checkpointer.stats().chunksStored).toBe(1);
    expect(g.cache.checkpointer.stats().chunksPublished).toBe(0);
    const fp = g.cache.catalog.id.fingerprint;
    const nodes = prefixChain(prompt.slice(0, -1), CHUNK).map((n) => catalogNodeId(fp, n.hash));
    // The bytes are on disk (every chunk of the route is stored before the first is published), but no one can see them.
    let files = 0;
    for await (const _ of g.cache.tiers.file.list()) files++;
    expect(nodes.length).toBeGreaterThan(1);
    expect(files).toBe(nodes.length);
    await log.endOffset().then((end) => g.cache.replica.waitFor(end, 10_000));
    expect(g.cache.catalog.db.eidOf("chunk/node", stored!)).toBeUndefined();
    expect(longestPublishedPrefix(g.cache.catalog.db, nodes).length).toBe(0);
    const dev = await device();
    const r = await restoreInto(dev, restorerFor(g, dev.engine), prompt, preferring("ssd"));
    expect(r.restoreTo).toBe(0);
  });

  it("a slow S3 does not cut a capture short: once its chunks are stored, the route may be evicted", async () => {
    const bucket = uniqueBucket();
    // A worker on the S3 server itself creates the bucket; the next one reaches it through the relay (paused).
    await worker({ id: "f-i0", s3Bucket: bucket });
    const s3 = await PausableRelay.start(new URL(process.env.CONTINUUM_S3_ENDPOINT!));
    s3.pause();
    try {
      // 24 pages: a finished 300-token prompt keeps 18 of them as its cache route, so the next prompt evicts it.
      const w = await worker({
        id: "f-i",
        s3Bucket: bucket,
        s3Endpoint: s3.endpoint,
        runtime: { physicalPages: 24 },
      });
      const a = promptOf(300, 26);
      await generate(w.runtime, a, 2);
      const fp = w.cache.catalog.id.fingerprint;
      const nodes = prefixChain(a.slice(0, -1), CHUNK).map((n) => catalogNodeId(fp, n.hash));
      expect(nodes.length).toBeGreaterThan(1);
      // Every chunk of the route reaches the local tiers while S3 holds the first upload.
      const deadline = Date.now() + 20_000;
      for (;;) {
        let files = 0;
        for await (const _ of w.cache.tiers.file.list()) files++;
        if (files === nodes.length) break;
        if (Date.now() > deadline)
          throw new Error(`only ${files} of ${nodes.length} chunks stored while S3 was held`);
        await new Promise((r) => setTimeout(r, 20));
      }
      expect(w.cache.checkpointer.stats().chunksPublished).toBe(0);
      // The next prompt needs the pages the first one left cached.
      const evicted = w.runtime.stats().evictedPages;
      await generate(w.runtime, promptOf(300, 27), 2);
      expect(w.runtime.stats().evictedPages).toBeGreaterThan(evicted);
      s3.resume();
      await w.cache.idle();
      await log.endOffset().then((end) => w.cache.replica.waitFor(end, 10_000));
      expect(longestPublishedPrefix(w.cache.catalog.db, nodes).length).toBe(nodes.length);
      for (const node of nodes) expect(replicaState(w, node, "f-i", "s3")).toBe("ready");
    } finally {
      s3.resume();
      await s3.close();
    }
  });

  it("an S3 upload that fails is never published", async () => {
    const h = await worker({ id: "f-h", s3Bucket: uniqueBucket(), s3Endpoint: deadEndpoint });
    const prompt = promptOf(300, 25);
    await generate(h.runtime, prompt, 2);
    await h.cache.idle();
    const st = h.cache.checkpointer.stats();
    expect(st.failed).toBe(1);
    expect(st.chunksPublished).toBe(0);
    await log.endOffset().then((end) => h.cache.replica.waitFor(end, 10_000));
    const fp = h.cache.catalog.id.fingerprint;
    const nodes = prefixChain(prompt.slice(0, -1), CHUNK).map((n) => catalogNodeId(fp, n.hash));
    expect(longestPublishedPrefix(h.cache.catalog.db, nodes).length).toBe(0);
  });
});

describe("a damaged durable cache heals", () => {
  it("a chunk whose only replica went bad is captured again by the next request that computes it; restores recover their full length", async () => {
    // No RAM tier: each chunk's one replica is its SSD file.
    const w = await worker({ id: "f-heal", ramBytes: 0 });
    const prompt = promptOf(4 * CHUNK + 11, 28);
    await generate(w.runtime, prompt, 2);
    await w.cache.idle();
    await waitPublished(w, prompt, 4);
    const { node, content } = chunkEntity(w, prompt, 1);
    const fh = await open(w.cache.tiers.file.pathOf(content), "r+");
    const { size } = await fh.stat();
    await fh.write(Buffer.alloc(64, 0x5a), 0, 64, size - 64);
    await fh.close();
    // A restore meets the damage and proposes the replica bad.
    const dev = await device();
    await restoreInto(dev, restorerFor(w, dev.engine), prompt, preferring("ssd"));
    expect(
      await w.cache.catalog.waitUntil(() => replicaState(w, node, "f-heal", "ssd") === "bad", 10_000),
    ).toBe(true);
    // From then on restores stop at the damaged chunk.
    const dev2 = await device();
    expect((await restoreInto(dev2, restorerFor(w, dev2.engine), prompt, preferring("ssd"))).restoreTo).toBe(
      CHUNK,
    );
    // The next finished requests over the prompt capture the damaged chunk again. Each capture is
    // still weighed (admission.ts): after at most 8 declines on value in a row the 9th is a probe.
    let healed = false;
    for (let i = 0; i < 9 && !healed; i++) {
      await generate(w.runtime, prompt, 2);
      await w.cache.idle();
      healed = await w.cache.catalog.waitUntil(
        () => replicaState(w, node, "f-heal", "ssd") === "ready",
        3_000,
      );
    }
    expect(healed).toBe(true);
    const dev3 = await device();
    const r = await restoreInto(dev3, restorerFor(w, dev3.engine), prompt, preferring("ssd"));
    expect(r.ok).toBe(true);
    expect(r.restoreTo).toBe(4 * CHUNK);
    const got = await dev3.continueGreedy(r.route, prompt, 4);
    const ref = await reference(prompt);
    expect(bitEqual(got.logits, ref.logits)).toBe(true);
    expect(got.greedy).toEqual(ref.greedy);
  });
});
