import { S3Client, type S3ClientConfig } from "@aws-sdk/client-s3";

/** Where an S3-compatible server is and who we are to it. */
export interface S3Endpoint {
  readonly endpoint: string;
  readonly region: string;
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
}

/**
 * An S3 client as every one of ours is made (the chunk store's tier, the
 * catalog's snapshots): path-style, so S3Proxy, MinIO and AWS alike; and
 * checksums only when an operation requires them, since streamed bodies
 * otherwise go out with aws-chunked framing that some S3-compatible servers
 * store as part of the object. `maxAttempts`: the SDK's own attempts (1 where
 * the caller retries itself); `requestHandler`: its timeouts and sockets.
 */
export function s3Client(
  at: S3Endpoint,
  opts: { readonly maxAttempts: number; readonly requestHandler: S3ClientConfig["requestHandler"] },
): S3Client {
  return new S3Client({
    endpoint: at.endpoint,
    region: at.region,
    forcePathStyle: true,
    credentials: { accessKeyId: at.accessKeyId, secretAccessKey: at.secretAccessKey },
    maxAttempts: opts.maxAttempts,
    requestChecksumCalculation: "WHEN_REQUIRED",
    responseChecksumValidation: "WHEN_REQUIRED",
    requestHandler: opts.requestHandler,
  });
}

/** The HTTP status an S3 error came with; undefined when no answer came (network trouble, a timeout). */
export function s3Status(err: unknown): number | undefined {
  const s = (err as { $metadata?: { httpStatusCode?: unknown } } | null)?.$metadata?.httpStatusCode;
  return typeof s === "number" ? s : undefined;
}

/** Whether an S3 error says the object (or its bucket) is not there. */
export function s3NotFound(err: unknown): boolean {
  const name = (err as Error | null)?.name;
  return s3Status(err) === 404 || name === "NoSuchKey" || name === "NotFound" || name === "NoSuchBucket";
}
