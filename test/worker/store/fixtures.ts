import { createCipheriv, createHash } from "node:crypto";
import { contentId } from "../../../schema/identity.ts";
import type { ContentId } from "../../../schema/ids.ts";
import type { ChunkMeta, StoreEvent } from "../../../worker/store/chunk.ts";

/** Deterministic pseudo-random bytes: AES-128-CTR keystream keyed by sha256(seed) (fast for 64 MiB). */
export function bytesOf(size: number, seed: string): Uint8Array {
  const key = createHash("sha256").update(seed).digest();
  const cipher = createCipheriv("aes-128-ctr", key.subarray(0, 16), key.subarray(16, 32));
  return cipher.update(Buffer.alloc(size));
}

export interface TestChunk {
  readonly id: ContentId;
  readonly bytes: Uint8Array;
  readonly meta: ChunkMeta;
}

export function chunkOf(size: number, seed: string): TestChunk {
  const bytes = bytesOf(size, seed);
  const meta: ChunkMeta = { layout: "kv-gqa/v1", tokens: 256, seed };
  return { id: contentId(bytes, meta), bytes, meta };
}

/** Collects store events for assertions. */
export function recorder(): { events: StoreEvent[]; report: (e: StoreEvent) => void } {
  const events: StoreEvent[] = [];
  return { events, report: (e) => events.push(e) };
}

export async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

/** The S3 server the global setup (test/setup/s3.ts) started or found. */
export function s3Env(): { endpoint: string; accessKeyId: string; secretAccessKey: string; region: string } {
  const endpoint = process.env.CONTINUUM_S3_ENDPOINT;
  if (!endpoint) throw new Error("CONTINUUM_S3_ENDPOINT is not set: test/setup/s3.ts did not run");
  return {
    endpoint,
    accessKeyId: process.env.CONTINUUM_S3_ACCESS_KEY_ID ?? "continuum",
    secretAccessKey: process.env.CONTINUUM_S3_SECRET_ACCESS_KEY ?? "continuum-secret",
    region: process.env.CONTINUUM_S3_REGION ?? "us-east-1",
  };
}

/** A bucket name unique to one test (S3 names: lowercase, digits, dashes). */
export function bucketName(tag: string): string {
  return `t-${tag}-${process.pid}-${Date.now().toString(36)}`
    .toLowerCase()
    .replace(/[^a-z0-9-]/g, "-")
    .slice(0, 63);
}
