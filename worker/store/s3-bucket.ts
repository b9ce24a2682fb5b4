import { CreateBucketCommand, HeadBucketCommand, type S3Client } from "@aws-sdk/client-s3";
import { s3NotFound, s3Status } from "../../schema/s3-client.ts";
import { describe, StoreError } from "./errors.ts";
import { AttemptTimeoutError } from "./retry.ts";

/** Deadline of the one request open() sends to see whether S3 answers. */
export const PROBE_MS = 5_000;

/** Runs one request under the tier's retries and per-attempt deadline. */
export type Retry = <T>(
  op: string,
  bodyBytes: number | undefined,
  attempt: (signal: AbortSignal) => Promise<T>,
) => Promise<T>;

/** One HeadBucket under PROBE_MS: undefined when S3 answered (any HTTP status), else why not. */
export async function probeBucket(
  client: S3Client,
  bucket: string,
  requestTimeoutMs: number,
): Promise<string | undefined> {
  try {
    await client.send(new HeadBucketCommand({ Bucket: bucket }), {
      abortSignal: AbortSignal.timeout(Math.min(PROBE_MS, requestTimeoutMs)),
    });
    return undefined;
  } catch (err) {
    if (s3Status(err) !== undefined) return undefined;
    return describe(err);
  }
}

/** HeadBucket, then CreateBucket when it is missing (one made meanwhile by another is fine). */
export async function ensureBucket(client: S3Client, bucket: string, retry: Retry): Promise<void> {
  const exists = await retry(`head bucket ${bucket}`, undefined, async (signal) => {
    try {
      await client.send(new HeadBucketCommand({ Bucket: bucket }), { abortSignal: signal });
      return true;
    } catch (err) {
      if (s3NotFound(err)) return false;
      throw err;
    }
  });
  if (exists) return;
  await retry(`create bucket ${bucket}`, undefined, async (signal) => {
    try {
      await client.send(new CreateBucketCommand({ Bucket: bucket }), { abortSignal: signal });
    } catch (err) {
      const name = (err as Error).name;
      if (name !== "BucketAlreadyOwnedByYou" && name !== "BucketAlreadyExists") throw err;
    }
  });
}

/**
 * Another attempt may help after network trouble, a timeout, 5xx, 429 or 408.
 * Client errors (403, 404, a bad request) and our own verdicts (corrupt,
 * mismatch, closed) are final.
 */
export function retryable(err: unknown): boolean {
  if (err instanceof AttemptTimeoutError) return true;
  if (err instanceof StoreError) return false;
  const status = s3Status(err);
  if (status !== undefined) return status >= 500 || status === 429 || status === 408;
  return true;
}
