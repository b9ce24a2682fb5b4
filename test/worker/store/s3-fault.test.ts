import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  ObjectTooLargeError,
  StoreUnavailableError,
  WriteBehindTimeoutError,
} from "../../../worker/store/errors.ts";
import { FileTier } from "../../../worker/store/file.ts";
import { RamTier } from "../../../worker/store/ram.ts";
import { AttemptTimeoutError } from "../../../worker/store/retry.ts";
import { S3Tier, type S3TierOptions } from "../../../worker/store/s3.ts";
import { TieredChunkStore } from "../../../worker/store/tiered.ts";
import { chunkOf, collect, recorder } from "./fixtures.ts";
import { type RunningS3Proxy, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, startS3Proxy } from "./s3proxy.ts";

const MiB = 1 << 20;

/**
 * Faults against an S3Proxy this file starts on its own port: stalled
 * (SIGSTOP: connections open, no answers) and killed (kill -9 mid-upload).
 * Liveness bounds are generous: they catch a hang, not a slow machine.
 */
describe("S3 tier under server faults", () => {
  let dir: string;
  let server: RunningS3Proxy;
  let stopped = false;

  const options = (over: Partial<S3TierOptions>): S3TierOptions => ({
    endpoint: server.endpoint,
    region: "us-east-1",
    accessKeyId: S3_ACCESS_KEY_ID,
    secretAccessKey: S3_SECRET_ACCESS_KEY,
    bucket: "faults",
    maxObjectBytes: 128 * MiB,
    multipartThresholdBytes: 5 * MiB,
    partBytes: 5 * MiB,
    partConcurrency: 2,
    maxAttempts: 3,
    retryBaseMs: 50,
    requestTimeoutMs: 60_000,
    createBucket: true,
    ...over,
  });

  const pause = () => {
    process.kill(server.pid, "SIGSTOP");
    stopped = true;
  };
  const resume = () => {
    process.kill(server.pid, "SIGCONT");
    stopped = false;
  };

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "continuum-s3fault-"));
    server = await startS3Proxy(join(dir, "s3"));
  }, 600_000);

  afterAll(async () => {
    if (stopped) resume();
    await server?.kill();
    await rm(dir, { recursive: true, force: true });
  });

  it("a stalled server: every attempt hits its deadline, retries are bounded, the caller gets a clear error", async () => {
    const rec = recorder();
    const s3 = await S3Tier.open(options({ requestTimeoutMs: 400, maxAttempts: 3, report: rec.report }));
    const c = chunkOf(1000, "stalled");
    await s3.put(c.id, c.bytes, c.meta);
    pause();
    try {
      const t0 = performance.now();
      const err = await s3.get(c.id).catch((e) => e);
      const elapsed = performance.now() - t0;
      expect(err).toBeInstanceOf(StoreUnavailableError);
      expect(err.message).toMatch(/s3: get [0-9a-f]{64} failed after 3 attempts: AttemptTimeoutError/);
      expect(err.cause).toBeInstanceOf(AttemptTimeoutError);
      // 3 × 400 ms deadlines + 50 + 100 ms backoff ≈ 1.35 s; a hang would never return.
      expect(elapsed).toBeGreaterThanOrEqual(3 * 400);
      expect(elapsed).toBeLessThan(30_000);
      expect(
        rec.events.filter((e) => e.kind === "retry").map((e) => ("attempt" in e ? e.attempt : 0)),
      ).toEqual([1, 2]);
    } finally {
      resume();
    }
    // The server is back: the same tier works again.
    expect((await s3.get(c.id))?.meta).toEqual(c.meta);
    await s3.close();
  });

  it("write-behind: a full queue refuses an optional write at once and times out a required one; nothing is written", async () => {
    const local = await FileTier.open({
      dir: join(dir, "wb-files"),
      maxObjectBytes: 16 * MiB,
      maxBytes: 1 << 30,
    });
    const rec = recorder();
    const ram = new RamTier({ maxBytes: 64 * MiB });
    const s3 = await S3Tier.open(options({ report: rec.report }));
    const store = new TieredChunkStore({
      ram,
      file: local,
      s3,
      maxObjectBytes: 16 * MiB,
      writeBehind: { capacity: 1, maxBytes: 64 * MiB, concurrency: 1, requiredWaitMs: 300 },
      report: rec.report,
    });
    const [a, b, c] = ["wb-a", "wb-b", "wb-c"].map((s) => chunkOf(64 << 10, s));
    pause();
    try {
      const ra = await store.put(a!.id, a!.bytes, a!.meta, "optional");
      expect(ra.status).toBe("stored");
      let aDurable = false;
      if (ra.status === "stored") void ra.durable.then(() => (aDurable = true));

      const t0 = performance.now();
      const rb = await store.put(b!.id, b!.bytes, b!.meta, "optional");
      expect(performance.now() - t0).toBeLessThan(5_000); // at once, not after the stall
      // A's upload is stuck on the stalled server, holding the only slot.
      expect(store.stats().writeBehind, JSON.stringify(rec.events)).toMatchObject({ depth: 1, uploading: 1 });
      expect(rb).toEqual({
        status: "refused",
        reason: expect.stringMatching(/write-behind queue full \(1\/1 jobs/),
      });

      const rc = await store.put(c!.id, c!.bytes, c!.meta, "required").catch((e) => e);
      expect(rc, JSON.stringify({ events: rec.events, stats: store.stats().writeBehind })).toBeInstanceOf(
        WriteBehindTimeoutError,
      );
      for (const x of [b!, c!]) {
        expect(await ram.has(x.id)).toBe(false);
        expect(await local.has(x.id)).toBe(false);
      }
      expect(store.stats().writeBehind).toMatchObject({ depth: 1, refused: 1, timedOut: 1 });
      expect(aDurable).toBe(false);
    } finally {
      resume();
    }
    const drained = await store.drain();
    expect(drained).toEqual({ uploaded: 1, failed: [] });
    expect(await s3.has(a!.id)).toBe(true);
    await store.close();
  }, 60_000);

  it("write-behind: a required write waits for room and goes through once the upload ahead of it finishes", async () => {
    const s3 = await S3Tier.open(options({}));
    const local = await FileTier.open({
      dir: join(dir, "wb2-files"),
      maxObjectBytes: 16 * MiB,
      maxBytes: 1 << 30,
    });
    const store = new TieredChunkStore({
      file: local,
      s3,
      maxObjectBytes: 16 * MiB,
      writeBehind: { capacity: 1, maxBytes: 64 * MiB, concurrency: 1, requiredWaitMs: 120_000 },
      report: () => {},
    });
    const [a, b] = ["wait-a", "wait-b"].map((s) => chunkOf(32 << 10, s));
    pause();
    let settled = false;
    let pb: ReturnType<typeof store.put>;
    try {
      await store.put(a!.id, a!.bytes, a!.meta, "required");
      pb = store.put(b!.id, b!.bytes, b!.meta, "required");
      void pb.then(() => (settled = true));
      await new Promise((r) => setTimeout(r, 300));
      expect(settled).toBe(false); // still waiting for room
      expect(store.stats().writeBehind?.waiting).toBe(1);
    } finally {
      resume();
    }
    const rb = await pb!;
    expect(rb.status).toBe("stored");
    if (rb.status === "stored") await rb.durable;
    expect(await s3.has(b!.id)).toBe(true);
    await store.close();
  }, 60_000);

  it("a server killed mid-upload: the put fails with a clear error after bounded retries, and nothing hangs", async () => {
    const rec = recorder();
    const s3 = await S3Tier.open(
      options({ maxAttempts: 3, retryBaseMs: 50, requestTimeoutMs: 5_000, report: rec.report }),
    );
    const before = chunkOf(1000, "before-kill");
    await s3.put(before.id, before.bytes, before.meta);
    // Kill -9 right after the first part of a 40 MiB multipart upload went up.
    let killed: Promise<void> | undefined;
    s3.client.middlewareStack.add(
      (next, context) => async (args) => {
        const out = await next(args);
        if (context.commandName === "UploadPartCommand") killed ??= server.kill();
        return out;
      },
      { step: "initialize", name: "killAfterFirstPart" },
    );
    const big = chunkOf(40 * MiB, "killed-mid-upload");
    const t0 = performance.now();
    const err = await s3.put(big.id, big.bytes, big.meta).catch((e) => e);
    await killed;
    expect(err).toBeInstanceOf(StoreUnavailableError);
    expect(err.message).toMatch(/s3: upload part \d+ of [0-9a-f]{64} failed after 3 attempts/);
    expect(performance.now() - t0).toBeLessThan(60_000);

    // Every operation now fails fast and clearly (connection refused), each after 3 attempts.
    for (const op of [
      () => s3.get(before.id),
      () => s3.has(before.id),
      () => s3.put(before.id, before.bytes, before.meta),
      () => collect(s3.list()),
    ]) {
      const t = performance.now();
      const e = await op().catch((x) => x);
      expect(e).toBeInstanceOf(StoreUnavailableError);
      expect(e.message).toMatch(/failed after 3 attempts: .*ECONNREFUSED/);
      expect(performance.now() - t).toBeLessThan(30_000);
    }
    const retries = rec.events.filter((e) => e.kind === "retry");
    expect(retries.every((e) => "attempt" in e && e.attempt < 3)).toBe(true);
    // Bad input is still refused locally, before any request.
    const huge = chunkOf(129 * MiB, "huge");
    await expect(s3.put(huge.id, huge.bytes, huge.meta)).rejects.toThrow(ObjectTooLargeError);
    const t = performance.now();
    await s3.close();
    expect(performance.now() - t).toBeLessThan(30_000);
  }, 120_000);
});
