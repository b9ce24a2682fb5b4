import { GetObjectCommand, PutObjectCommand } from "@aws-sdk/client-s3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { contentId } from "../../../schema/identity.ts";
import {
  ContentMismatchError,
  CorruptChunkError,
  InvalidChunkError,
  ObjectTooLargeError,
} from "../../../worker/store/errors.ts";
import { S3Tier } from "../../../worker/store/s3.ts";
import { bucketName, bytesOf, chunkOf, collect, recorder, s3Env } from "./fixtures.ts";

const MiB = 1 << 20;

/** Yields `bytes` in uneven pieces, as a network or file stream would. */
async function* piecesOf(bytes: Uint8Array, piece: number): AsyncIterable<Uint8Array> {
  for (let at = 0, i = 0; at < bytes.length; i++) {
    const n = Math.min(piece + (i % 3) * 4099, bytes.length - at);
    yield bytes.subarray(at, at + n);
    at += n;
  }
}

async function streamToBuffer(pieces: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const parts: Uint8Array[] = [];
  for await (const p of pieces) parts.push(Buffer.from(p));
  return Buffer.concat(parts);
}

describe("S3 tier against a real S3 server", () => {
  const env = s3Env();
  const rec = recorder();
  let s3: S3Tier;

  beforeAll(async () => {
    s3 = await S3Tier.open({
      ...env,
      bucket: bucketName("s3tier"),
      maxObjectBytes: 80 * MiB,
      multipartThresholdBytes: 8 * MiB,
      partBytes: 5 * MiB,
      partConcurrency: 3,
      maxAttempts: 3,
      retryBaseMs: 50,
      requestTimeoutMs: 30_000,
      createBucket: true,
      report: rec.report,
    });
  });
  afterAll(async () => {
    await s3?.close();
  });

  it("the global setup exported the server to this forked worker", () => {
    expect(process.env.CONTINUUM_S3_ENDPOINT).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
  });

  const sizes = [1 << 10, 256 << 10, 5 * MiB - 7, 8 * MiB + 1, 64 * MiB];
  for (const size of sizes) {
    it(`round-trips ${size} bytes byte-exact, buffered and streamed`, async () => {
      const c = chunkOf(size, `rt-${size}`);
      await s3.put(c.id, c.bytes, c.meta);
      const got = await s3.get(c.id);
      expect(got!.meta).toEqual(c.meta);
      expect(Buffer.compare(Buffer.from(got!.bytes), Buffer.from(c.bytes))).toBe(0);

      const s = await s3.getStream(c.id);
      expect(s!.payloadBytes).toBe(size);
      expect(s!.meta).toEqual(c.meta);
      expect(Buffer.compare(await streamToBuffer(s!.pieces), Buffer.from(c.bytes))).toBe(0);

      // Streamed upload of the same content under a second meta (so a second id).
      const meta2 = { ...c.meta, streamed: true };
      const id2 = contentId(c.bytes, meta2);
      await s3.putStream(id2, meta2, piecesOf(c.bytes, 1 * MiB + 3), size);
      const got2 = await s3.get(id2);
      expect(Buffer.compare(Buffer.from(got2!.bytes), Buffer.from(c.bytes))).toBe(0);
      await s3.delete(c.id);
      await s3.delete(id2);
    }, 120_000);
  }

  it("uploads objects above the threshold in parts, and smaller ones in one PUT", async () => {
    // Observe the real requests the client sends.
    const sent: string[] = [];
    s3.client.middlewareStack.add(
      (next, context) => (args) => {
        sent.push(context.commandName ?? "?");
        return next(args);
      },
      { step: "initialize", name: "recordCommands" },
    );
    try {
      const c = chunkOf(12 * MiB, "multipart");
      await s3.put(c.id, c.bytes, c.meta);
      // 12 MiB + header in 5 MiB parts: 3 parts.
      expect(sent).toEqual([
        "CreateMultipartUploadCommand",
        "UploadPartCommand",
        "UploadPartCommand",
        "UploadPartCommand",
        "CompleteMultipartUploadCommand",
      ]);
      const got = await s3.get(c.id);
      expect(Buffer.compare(Buffer.from(got!.bytes), Buffer.from(c.bytes))).toBe(0);
      sent.length = 0;
      const small = chunkOf(1 * MiB, "single");
      await s3.put(small.id, small.bytes, small.meta);
      expect(sent).toEqual(["PutObjectCommand"]);
    } finally {
      s3.client.middlewareStack.remove("recordCommands");
    }
  });

  it("a missing key reads as absent", async () => {
    const c = chunkOf(10, "never-stored");
    expect(await s3.get(c.id)).toBeUndefined();
    expect(await s3.getStream(c.id)).toBeUndefined();
    expect(await s3.has(c.id)).toBe(false);
    expect(await s3.delete(c.id)).toBe(false);
  });

  it("detects an object overwritten with garbage or truncated, reports it and never returns it", async () => {
    const a = chunkOf(300_000, "garbage");
    const b = chunkOf(300_000, "truncated");
    const d = chunkOf(300_000, "flipped");
    for (const c of [a, b, d]) await s3.put(c.id, c.bytes, c.meta);
    const put = (key: string, body: Uint8Array) =>
      s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: key, Body: body }));
    await put(s3.keyOf(a.id), bytesOf(300_000, "noise"));
    const rawD = await s3.client.send(new GetObjectCommand({ Bucket: s3.bucket, Key: s3.keyOf(d.id) }));
    const raw = Buffer.from(await rawD.Body!.transformToByteArray());
    // Truncated: the right header and metadata, but the object ends 1000 bytes early.
    await put(s3.keyOf(b.id), raw.subarray(0, raw.length - 1000));
    const flipped = Buffer.from(raw);
    flipped[flipped.length - 1]! ^= 0x80;
    await put(s3.keyOf(d.id), flipped);

    const before = rec.events.length;
    await expect(s3.get(a.id)).rejects.toThrow(/bad magic/);
    await expect(s3.get(b.id)).rejects.toThrow(CorruptChunkError);
    await expect(s3.get(d.id)).rejects.toThrow(/content hashes to/);
    // Streamed: the iteration itself fails at its end, so the consumer never completes with bad bytes.
    const s = await s3.getStream(d.id);
    await expect(streamToBuffer(s!.pieces)).rejects.toThrow(CorruptChunkError);
    const corrupt = rec.events.slice(before).filter((e) => e.kind === "corrupt");
    expect(corrupt.map((e) => ("id" in e ? e.id : ""))).toEqual([a.id, b.id, d.id, d.id]);
    expect(s3.stats().corrupt).toBeGreaterThanOrEqual(4);
  });

  it("bad input is refused with a clear error and the bucket is unchanged", async () => {
    const keysBefore = (await collect(s3.list())).map((i) => i.id).sort();
    const c = chunkOf(6 * MiB, "bad-input");
    await expect(s3.put("xyz", c.bytes, c.meta)).rejects.toThrow(InvalidChunkError);
    await expect(s3.put(c.id, bytesOf(6 * MiB, "other"), c.meta)).rejects.toThrow(ContentMismatchError);
    const huge = chunkOf(81 * MiB, "huge");
    await expect(s3.put(huge.id, huge.bytes, huge.meta)).rejects.toThrow(ObjectTooLargeError);
    // Streamed: a wrong hash is found at the end of a multipart upload (aborted), or a short stream.
    const wrong = bytesOf(12 * MiB, "wrong");
    const id12 = contentId(bytesOf(12 * MiB, "right"), c.meta);
    await expect(s3.putStream(id12, c.meta, piecesOf(wrong, MiB), 12 * MiB)).rejects.toThrow(
      ContentMismatchError,
    );
    await expect(
      s3.putStream(c.id, c.meta, piecesOf(c.bytes.subarray(0, MiB), MiB), 6 * MiB),
    ).rejects.toThrow(/gave 1048576 of 6291456 declared bytes/);
    await expect(s3.putStream(c.id, c.meta, piecesOf(c.bytes, MiB), 5 * MiB)).rejects.toThrow(/more than/);
    expect((await collect(s3.list())).map((i) => i.id).sort()).toEqual(keysBefore);
    expect(await s3.has(id12)).toBe(false);
  });

  it("lists only chunk objects, with their stored sizes", async () => {
    const c = chunkOf(1000, "listed");
    await s3.put(c.id, c.bytes, c.meta);
    const listed = await collect(s3.list());
    const mine = listed.find((i) => i.id === c.id);
    expect(mine!.storedBytes).toBeGreaterThan(1000);
    expect(listed.every((i) => /^[0-9a-f]{64}$/.test(i.id))).toBe(true);
  });
});
