import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { resolveConfig } from "../../../schema/config-load.ts";
import type { StoreEvent } from "../../../worker/store/chunk.ts";
import { ChunkTiers } from "../../../worker/store/chunk-tiers.ts";
import {
  CorruptChunkError,
  FileFullError,
  InvalidChunkError,
  ObjectTooLargeError,
  StoreClosedError,
} from "../../../worker/store/errors.ts";
import { FileTier } from "../../../worker/store/file.ts";
import { openConfiguredTiers } from "../../../worker/store/index.ts";
import { RamTier } from "../../../worker/store/ram.ts";
import { S3Tier } from "../../../worker/store/s3.ts";
import { TieredChunkStore } from "../../../worker/store/tiered.ts";
import { bucketName, chunkOf, collect, recorder, s3Env } from "./fixtures.ts";

const MiB = 1 << 20;
/** A tier over the test S3 server, in a fresh bucket named after `name`. */
const openTestS3 = (name: string, report: (e: StoreEvent) => void) =>
  S3Tier.open({
    ...s3Env(),
    bucket: bucketName(name),
    maxObjectBytes: 32 * MiB,
    multipartThresholdBytes: 8 * MiB,
    partBytes: 5 * MiB,
    partConcurrency: 2,
    maxAttempts: 3,
    retryBaseMs: 50,
    requestTimeoutMs: 30_000,
    createBucket: true,
    report,
  });
const writeBehind = { capacity: 8, maxBytes: 64 * MiB, concurrency: 2, requiredWaitMs: 30_000 };

describe("tiered chunk store (RAM → files → real S3)", () => {
  let dir: string;
  let ram: RamTier;
  let file: FileTier;
  let s3: S3Tier;
  let store: TieredChunkStore;
  let rec: ReturnType<typeof recorder>;

  beforeEach(async () => {
    rec = recorder();
    dir = await mkdtemp(join(tmpdir(), "continuum-tiered-"));
    ram = new RamTier({ maxBytes: 4 * MiB, report: rec.report });
    file = await FileTier.open({ dir, maxObjectBytes: 32 * MiB, maxBytes: 1 << 30, report: rec.report });
    s3 = await openTestS3("tiered", rec.report);
    store = new TieredChunkStore({
      ram,
      file,
      s3,
      maxObjectBytes: 32 * MiB,
      writeBehind,
      report: rec.report,
    });
  });

  afterEach(async () => {
    await store.close();
    await rm(dir, { recursive: true, force: true });
  });

  it("put writes the local tiers at once and S3 behind; durable resolves once S3 holds it", async () => {
    const c = chunkOf(300_000, "put");
    const r = await store.put(c.id, c.bytes, c.meta);
    expect(r.status).toBe("stored");
    expect(await ram.has(c.id)).toBe(true);
    expect(await file.has(c.id)).toBe(true);
    if (r.status === "stored") {
      expect(r.remote).toBe("queued");
      await r.durable;
    }
    expect(await s3.has(c.id)).toBe(true);
    const got = await store.get(c.id);
    expect(Buffer.compare(Buffer.from(got!.bytes), Buffer.from(c.bytes))).toBe(0);
    const stats = store.stats();
    expect(stats.tiers.map((t) => t.tier)).toEqual(["ram", "file", "s3"]);
    expect(stats.tiers[0]).toMatchObject({ objects: 1, bytes: 300_000, hits: 1 });
    expect(stats.writeBehind).toMatchObject({ depth: 0, uploaded: 1, failed: 0 });
  });

  it("reads through to S3 and promotes to the faster tiers", async () => {
    const c = chunkOf(200_000, "promote");
    await store.put(c.id, c.bytes, c.meta);
    expect(await store.drain()).toEqual({ uploaded: 1, failed: [] });
    await ram.delete(c.id);
    await file.delete(c.id);
    const got = await store.get(c.id);
    expect(Buffer.compare(Buffer.from(got!.bytes), Buffer.from(c.bytes))).toBe(0);
    expect(await ram.has(c.id)).toBe(true); // promoted at once
    await store.close(); // waits for the background file promotion
    const reopened = await FileTier.open({ dir, maxObjectBytes: 32 * MiB, maxBytes: 1 << 30 });
    expect(Buffer.compare(Buffer.from((await reopened.get(c.id))!.bytes), Buffer.from(c.bytes))).toBe(0);
    await reopened.close();
  });

  it("a corrupt copy in one tier is reported and the next tier serves good bytes", async () => {
    const c = chunkOf(100_000, "corrupt-file");
    await store.put(c.id, c.bytes, c.meta);
    await store.drain();
    await ram.delete(c.id);
    const raw = await readFile(file.pathOf(c.id));
    raw[raw.length - 1]! ^= 0xff;
    await writeFile(file.pathOf(c.id), raw);
    const got = await store.get(c.id);
    expect(Buffer.compare(Buffer.from(got!.bytes), Buffer.from(c.bytes))).toBe(0);
    expect(rec.events).toContainEqual(expect.objectContaining({ kind: "corrupt", tier: "file", id: c.id }));

    // Corrupt in RAM as well as files, and absent from S3: an error, never bytes.
    const d = chunkOf(1000, "corrupt-everywhere");
    await store.put(d.id, d.bytes, d.meta);
    await store.drain();
    await s3.delete(d.id);
    ram.heldBytesForTest(d.id)![0]! ^= 1;
    await writeFile(file.pathOf(d.id), Buffer.from("garbage"));
    await expect(store.get(d.id)).rejects.toThrow(CorruptChunkError);
    expect(
      rec.events
        .filter((e) => e.kind === "corrupt" && e.id === d.id)
        .map((e) => e.kind === "corrupt" && e.tier),
    ).toEqual(["ram", "file"]);
  });

  it("bad input gets a clear error and leaves every tier unchanged", async () => {
    const ok = chunkOf(1000, "ok");
    await store.put(ok.id, ok.bytes, ok.meta);
    await store.drain();
    const snapshot = async () => ({
      ram: (await collect(ram.list())).map((i) => i.id),
      file: (await collect(file.list())).map((i) => i.id),
      s3: (await collect(s3.list())).map((i) => i.id),
    });
    const before = await snapshot();
    const c = chunkOf(1000, "bad");
    await expect(store.put("not-an-id", c.bytes, c.meta)).rejects.toThrow(InvalidChunkError);
    await expect(store.put(c.id, chunkOf(1000, "else").bytes, c.meta)).rejects.toThrow(/hash to content id/);
    const big = chunkOf(32 * MiB + 1, "big");
    await expect(store.put(big.id, big.bytes, big.meta)).rejects.toThrow(ObjectTooLargeError);
    await expect(store.get("g".repeat(64))).rejects.toThrow(InvalidChunkError);
    await store.drain();
    expect(await snapshot()).toEqual(before);
  });

  it("objects larger than RAM skip RAM; delete removes every copy; list merges tiers", async () => {
    const big = chunkOf(6 * MiB, "bigger-than-ram");
    const small = chunkOf(10, "small");
    await store.put(big.id, big.bytes, big.meta);
    await store.put(small.id, small.bytes, small.meta);
    await store.drain();
    expect(await ram.has(big.id)).toBe(false);
    expect((await collect(store.list())).map((i) => i.id).sort()).toEqual([big.id, small.id].sort());
    expect(await store.delete(big.id)).toBe(true);
    expect(await store.has(big.id)).toBe(false);
    expect(await s3.has(big.id)).toBe(false);
    expect(await store.get(big.id)).toBeUndefined();
    await store.close();
    await expect(store.get(small.id)).rejects.toThrow(StoreClosedError);
  });
});

describe("a full file tier (store.dir.maxBytes)", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "continuum-full-"));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("refuses a checkpoint put with a reason, storing nothing in any tier; keepLocal keeps RAM only", async () => {
    const a = chunkOf(50_000, "a");
    const b = chunkOf(50_000, "b");
    const ram = new RamTier({ maxBytes: 4 * MiB });
    // Room for one object of this size (header and meta are well under 10 kB).
    const file = await FileTier.open({ dir, maxObjectBytes: 32 * MiB, maxBytes: 60_000 });
    const store = new TieredChunkStore({
      ram,
      file,
      maxObjectBytes: 32 * MiB,
      writeBehind,
    });
    try {
      expect((await store.put(a.id, a.bytes, a.meta)).status).toBe("stored");
      const r = await store.put(b.id, b.bytes, b.meta);
      expect(r).toMatchObject({ status: "refused" });
      expect(r.status === "refused" && r.reason).toMatch(/store\.dir\.maxBytes/);
      expect(await file.has(b.id)).toBe(false);
      expect(await ram.has(b.id)).toBe(false);

      const tiers = new ChunkTiers(store, file, ram, undefined);
      const checked = (await file.get(a.id))!;
      await file.delete(a.id);
      await file.put(b.id, b.bytes, b.meta); // the files are full again, with b
      expect(await tiers.keepLocal(checked)).toEqual(["ram"]);
      expect(await file.has(a.id)).toBe(false);
      await expect(file.put(a.id, a.bytes, a.meta)).rejects.toThrow(FileFullError);
    } finally {
      await store.close();
    }
  });
});

describe("a full file tier beside S3", () => {
  it("stores past full files in RAM and S3 (files: false), and promotes nothing into them", async () => {
    const dir = await mkdtemp(join(tmpdir(), "continuum-full-s3-"));
    const rec = recorder();
    const a = chunkOf(50_000, "fa");
    const b = chunkOf(50_000, "fb");
    const ram = new RamTier({ maxBytes: 4 * MiB, report: rec.report });
    const file = await FileTier.open({ dir, maxObjectBytes: 32 * MiB, maxBytes: 60_000, report: rec.report });
    const s3 = await openTestS3("full", rec.report);
    const store = new TieredChunkStore({
      ram,
      file,
      s3,
      maxObjectBytes: 32 * MiB,
      writeBehind,
      report: rec.report,
    });
    try {
      const ra = await store.put(a.id, a.bytes, a.meta);
      expect(ra).toMatchObject({ status: "stored", remote: "queued", files: true });
      const rb = await store.put(b.id, b.bytes, b.meta);
      expect(rb).toMatchObject({ status: "stored", remote: "queued", files: false });
      if (rb.status === "stored") await rb.durable;
      expect(await s3.has(b.id)).toBe(true);
      expect(await ram.has(b.id)).toBe(true);
      expect(await file.has(b.id)).toBe(false);
      // Read from S3 once RAM lost it: served, and not promoted into the full files.
      await ram.delete(b.id);
      expect((await store.get(b.id))?.meta).toEqual(b.meta);
      await store.close(); // waits for promotions in flight
      const after = await FileTier.open({ dir, maxObjectBytes: 32 * MiB, maxBytes: 60_000 });
      expect(await after.has(b.id)).toBe(false);
      await after.close();
      expect(rec.events.filter((e) => e.kind === "promote-failed")).toEqual([]);
    } finally {
      await store.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe("openConfiguredTiers: the store the configuration describes", () => {
  it("close finishes the write-behind uploads, then closes", async () => {
    const dir = await mkdtemp(join(tmpdir(), "continuum-layer-"));
    const env = s3Env();
    const bucket = bucketName("layer");
    const config = resolveConfig(
      { store: { dataDir: dir, s3: { enabled: true, createBucket: true, bucket } } },
      {
        CONTINUUM_STORE_S3_ENDPOINT: env.endpoint,
        CONTINUUM_STORE_S3_ACCESS_KEY_ID: env.accessKeyId,
        CONTINUUM_STORE_S3_SECRET_ACCESS_KEY: env.secretAccessKey,
      },
    );
    const c = chunkOf(2 * MiB, "layer");
    try {
      const { store } = await openConfiguredTiers(config.store, () => {});
      const r = await store.put(c.id, c.bytes, c.meta, "optional");
      expect(r.status).toBe("stored");
      await store.close();
      await expect(store.get(c.id)).rejects.toThrow(StoreClosedError);
      // The write-behind upload was finished by close, not dropped.
      const check = await S3Tier.open({
        ...env,
        bucket,
        maxObjectBytes: 32 * MiB,
        multipartThresholdBytes: 16 * MiB,
        partBytes: 8 * MiB,
        partConcurrency: 1,
        maxAttempts: 2,
        retryBaseMs: 50,
        requestTimeoutMs: 30_000,
      });
      expect((await check.get(c.id))?.meta).toEqual(c.meta);
      await check.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("builds RAM, file and S3 tiers from config (env overrides) and round-trips", async () => {
    const dir = await mkdtemp(join(tmpdir(), "continuum-cfg-"));
    const env = s3Env();
    const config = resolveConfig(
      { store: { dataDir: dir, s3: { enabled: true, createBucket: true, bucket: bucketName("cfg") } } },
      {
        CONTINUUM_STORE_S3_ENDPOINT: env.endpoint,
        CONTINUUM_STORE_S3_ACCESS_KEY_ID: env.accessKeyId,
        CONTINUUM_STORE_S3_SECRET_ACCESS_KEY: env.secretAccessKey,
      },
    );
    const { store } = await openConfiguredTiers(config.store, () => {});
    try {
      const c = chunkOf(50_000, "cfg");
      const r = await store.put(c.id, c.bytes, c.meta);
      if (r.status === "stored") await r.durable;
      expect(store.stats().tiers.map((t) => [t.tier, t.objects])).toEqual([
        ["ram", 1],
        ["file", 1],
        ["s3", null],
      ]);
      expect((await store.get(c.id))?.meta).toEqual(c.meta);
    } finally {
      await store.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
