import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EmbeddedLog } from "../../../catalog/log-embedded.ts";
import { RequestId } from "../../../schema/ids.ts";
import type { RestoreTier } from "../../../worker/calibration/calibration.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { PageHashChain } from "../../../worker/pages/page-hashes.ts";
import type { RuntimeEvent } from "../../../worker/runtime/sequence.ts";
import { tinyModel } from "../runtime/fixture.ts";
import {
  bitEqual,
  Device,
  generate,
  PAGE,
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
 * Exactness per source tier. Worker A computes a 420-token prompt through its
 * runtime; its checkpointer captures the three whole chunks (rows [0, 390),
 * boundaries at 130, 260, 390: inside pages of 16) into RAM, SSD and S3 and
 * publishes them. Then the prefix is restored from each tier into a fresh
 * engine and the rest of the prompt prefilled there: the first token's logits
 * and four greedy tokens must equal, bit for bit, a recompute from scratch.
 * Workers B and C share the catalog log and the S3 bucket but not A's disks.
 */
let model: LoadedModel;
let cleanupModel: () => Promise<void>;
let log: EmbeddedLog;
let writer: { stop(): Promise<void> };
let a: TestWorker;
let b: TestWorker;
let c: TestWorker;
let baseline: { logits: Float32Array; greedy: number[] };
let aTokens: number[];
let bucket: string;
const prompt = promptOf(420, 11);
const devices: Device[] = [];

async function device(): Promise<Device> {
  const d = await Device.open(model);
  devices.push(d);
  return d;
}

beforeAll(async () => {
  ({ model, cleanup: cleanupModel } = await tinyModel());
  log = await EmbeddedLog.open();
  writer = startWriter(log);
  bucket = uniqueBucket();
  a = await startWorker(model, { id: "w-a", log, s3Bucket: bucket });
  b = await startWorker(model, { id: "w-b", log, s3Bucket: bucket });
  c = await startWorker(model, { id: "w-c", log, s3Bucket: bucket });
  const base = await device();
  baseline = await base.continueGreedy(base.openRoute("base", 460), prompt, 4);
  aTokens = (await generate(a.runtime, prompt, 4)).tokens;
  await a.cache.idle();
  for (const w of [a, b, c]) await waitPublished(w, prompt, 3);
});

afterAll(async () => {
  for (const d of devices) d.close();
  for (const w of [a, b, c]) await w?.close();
  await writer?.stop();
  await log?.close();
  await cleanupModel?.();
});

describe("restore from each source tier is bit-exact", () => {
  it("the runtime's own greedy tokens match the reference decode", () => {
    expect(aTokens).toEqual(baseline.greedy.slice(0, 4));
  });

  const cases: [RestoreTier, () => TestWorker][] = [
    ["ram", () => a],
    ["ssd", () => a],
    ["peer", () => b],
    ["s3", () => c],
  ];
  for (const [tier, worker] of cases) {
    it(`${tier}: first-token logits and greedy tokens equal a recompute`, async () => {
      const dev = await device();
      const restorer = restorerFor(worker(), dev.engine);
      const r = await restoreInto(dev, restorer, prompt, preferring(tier));
      expect(r.ok).toBe(true);
      expect(r.restoreTo).toBe(390);
      expect(dev.pages.route(r.route).tokens).toBe(390);
      const st = restorer.stats();
      expect(st.chunks[tier]).toBe(3);
      expect(st.fallbacks).toEqual({ missing: 0, corrupt: 0, unavailable: 0 });
      const got = await dev.continueGreedy(r.route, prompt, 4);
      expect(bitEqual(got.logits, baseline.logits)).toBe(true);
      expect(got.greedy).toEqual(baseline.greedy);
      await restorer.idle();
    });
  }

  it("seals the restored pages with the page hashes the request carries, and restores nothing without enough of them", async () => {
    const dev = await device();
    const restorer = restorerFor(a, dev.engine);
    const hashes = new PageHashChain(PAGE, undefined).extend(prompt, prompt.length - 1);
    const r = await restoreInto(dev, restorer, prompt, preferring("ssd"));
    expect(r.ok).toBe(true);
    // 390 restored rows: 24 full pages, each found again by its hash.
    expect(dev.pages.matchPrefix(hashes)).toBe(Math.floor(390 / PAGE));
    const short = dev.openRoute("short", prompt.length + 16);
    const ticket = restorer.begin({
      routes: [short],
      tokens: prompt.slice(0, -1),
      pageHashes: hashes.slice(0, 10),
      salt: undefined,
      residentTokens: 0,
      pages: dev.pages,
      calibration: preferring("ssd"),
      record: () => undefined,
    });
    expect(ticket).toBeNull();
    expect(dev.pages.route(short)).toMatchObject({ tokens: 0, loading: false });
  });

  it("a restore that starts after a resident prefix ending mid-chunk is bit-exact", async () => {
    const dev = await device();
    const restorer = restorerFor(a, dev.engine);
    const r = await restoreInto(dev, restorer, prompt, preferring("ssd"), 160);
    expect(r.ok).toBe(true);
    expect(r.restoreTo).toBe(390);
    // Chunk 0 is resident; chunk 1 is read for its rows [160, 260) only.
    expect(restorer.stats().chunks.ssd).toBe(2);
    const got = await dev.continueGreedy(r.route, prompt, 4);
    expect(bitEqual(got.logits, baseline.logits)).toBe(true);
    expect(got.greedy).toEqual(baseline.greedy);
  });

  it("worker B's runtime continues, bit-exact, a prompt whose prefix only A computed", async () => {
    const out = await generate(b.runtime, prompt, 4);
    expect(out.cachedTokens).toBe(390);
    expect(out.tokens).toEqual(aTokens);
  });

  it("a request cancelled while its restore may be in flight ends cleanly; the next is unchanged", async () => {
    const gen = c.runtime.submit({
      requestId: RequestId("cancel-during-restore"),
      salt: undefined,
      prompt,
      maxTokens: 4,
      temperature: 0,
      topP: 1,
      topK: 0,
      seed: 1,
      stopTokenIds: [],
    });
    await new Promise((r) => setImmediate(r));
    gen.cancel();
    let last: RuntimeEvent | undefined;
    for await (const e of gen.events) last = e;
    expect(last?.type).toBe("end");
    await c.cache.idle();
    expect(c.runtime.pages.snapshot().loadingPages).toBe(0);
    const out = await generate(c.runtime, prompt, 4);
    expect(out.tokens).toEqual(aTokens);
    c.runtime.pages.checkInvariants();
  });

  it("a chunk fetched from a peer or S3 becomes a verified local replica of the reader", async () => {
    await c.cache.idle();
    const ok = await c.cache.catalog.waitUntil(() => {
      const db = c.cache.catalog.db;
      let n = 0;
      for (const [, ent] of db.entities()) {
        if (ent.get("replica/state") !== "ready" || ent.get("replica/tier") !== "ssd") continue;
        const w = ent.get("replica/worker") as number;
        if (db.get(w, "worker/id") === "w-c") n++;
      }
      return n === 3;
    }, 10_000);
    expect(ok).toBe(true);
  });
});

describe("a worker whose chunk files are full (store.dir.maxBytes)", () => {
  it("publishes its checkpoints as RAM and S3 replicas, no SSD one, and another worker restores them bit-exact", async () => {
    const full = await startWorker(model, { id: "w-full", log, s3Bucket: bucket, fileBytes: 1024 });
    try {
      const own = promptOf(420, 12);
      const reference = await generate(full.runtime, own, 4);
      await full.cache.idle();
      await waitPublished(full, own, 3);
      const db = full.cache.catalog.db;
      const tiers = new Set<string>();
      for (const [, ent] of db.entities()) {
        if (ent.get("replica/state") !== "ready") continue;
        if (db.get(ent.get("replica/worker") as number, "worker/id") === "w-full")
          tiers.add(ent.get("replica/tier") as string);
      }
      expect([...tiers].sort()).toEqual(["ram", "s3"]);
      const out = await generate(b.runtime, own, 4);
      expect(out.cachedTokens).toBe(390);
      expect(out.tokens).toEqual(reference.tokens);
    } finally {
      await full.close();
    }
  });
});
