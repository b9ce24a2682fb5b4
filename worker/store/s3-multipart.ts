import {
  AbortMultipartUploadCommand,
  CompleteMultipartUploadCommand,
  CreateMultipartUploadCommand,
  type S3Client,
  UploadPartCommand,
} from "@aws-sdk/client-s3";
import type { ContentId } from "../../schema/ids.ts";
import { StoreUnavailableError } from "./errors.ts";

/** What an upload needs of the S3 tier: its client and bucket, its keys, and its retried, deadlined requests. */
export interface S3Requests {
  readonly client: S3Client;
  readonly bucket: string;
  /** Deadline of the best-effort abort. */
  readonly requestTimeoutMs: number;
  keyOf(id: ContentId): string;
  retry<T>(
    op: string,
    bodyBytes: number | undefined,
    attempt: (signal: AbortSignal) => Promise<T>,
  ): Promise<T>;
}

/**
 * One multipart upload of an object, its parts sent with at most
 * `concurrency` in flight: `add` waits while the window is full, so memory
 * stays bounded to concurrency × part size. The object becomes visible only
 * at `complete`; `abort` after any failure leaves the bucket unchanged.
 */
export class MultipartUpload {
  private readonly etags: string[] = [];
  private readonly window = new Set<Promise<void>>();
  private failure: unknown;
  private next = 1;

  private constructor(
    private readonly s3: S3Requests,
    private readonly id: ContentId,
    private readonly uploadId: string,
    private readonly concurrency: number,
  ) {}

  static async create(s3: S3Requests, id: ContentId, concurrency: number): Promise<MultipartUpload> {
    const out = await s3.retry(`create multipart ${id}`, undefined, (signal) =>
      s3.client.send(new CreateMultipartUploadCommand({ Bucket: s3.bucket, Key: s3.keyOf(id) }), {
        abortSignal: signal,
      }),
    );
    if (out.UploadId === undefined)
      throw new StoreUnavailableError("s3", `create multipart ${id}`, 1, "no UploadId");
    return new MultipartUpload(s3, id, out.UploadId, concurrency);
  }

  /** Sends the next part; waits first while `concurrency` parts are in flight, and throws the first failure. */
  async add(body: Uint8Array): Promise<void> {
    while (this.window.size >= this.concurrency) await Promise.race(this.window);
    if (this.failure !== undefined) throw this.failure;
    const n = this.next++;
    const p: Promise<void> = this.uploadPart(n, body).then(
      (etag) => {
        this.etags[n - 1] = etag;
        this.window.delete(p);
      },
      (err) => {
        this.failure ??= err;
        this.window.delete(p);
      },
    );
    this.window.add(p);
  }

  /** Once every part is up, completes the upload (the object becomes visible); the first failure otherwise. */
  async complete(): Promise<void> {
    await Promise.all([...this.window]);
    if (this.failure !== undefined) throw this.failure;
    const { s3, id, uploadId, etags } = this;
    await s3.retry(`complete multipart ${id}`, undefined, (signal) =>
      s3.client.send(
        new CompleteMultipartUploadCommand({
          Bucket: s3.bucket,
          Key: s3.keyOf(id),
          UploadId: uploadId,
          MultipartUpload: { Parts: etags.map((ETag, i) => ({ ETag, PartNumber: i + 1 })) },
        }),
        { abortSignal: signal },
      ),
    );
  }

  /** Best effort: a failed abort leaves parts the server's lifecycle rules reclaim, never a visible object. */
  async abort(): Promise<void> {
    try {
      await this.s3.client.send(
        new AbortMultipartUploadCommand({
          Bucket: this.s3.bucket,
          Key: this.s3.keyOf(this.id),
          UploadId: this.uploadId,
        }),
        { abortSignal: AbortSignal.timeout(this.s3.requestTimeoutMs) },
      );
    } catch {
      // The upload was never completed, so no object became visible.
    }
  }

  /** Uploads one part (1-based number) and returns its ETag. */
  private async uploadPart(partNumber: number, body: Uint8Array): Promise<string> {
    const { s3, id } = this;
    const out = await s3.retry(`upload part ${partNumber} of ${id}`, body.byteLength, (signal) =>
      s3.client.send(
        new UploadPartCommand({
          Bucket: s3.bucket,
          Key: s3.keyOf(id),
          UploadId: this.uploadId,
          PartNumber: partNumber,
          Body: body,
          ContentLength: body.byteLength,
        }),
        { abortSignal: signal },
      ),
    );
    if (out.ETag === undefined)
      throw new StoreUnavailableError("s3", `upload part ${partNumber} of ${id}`, 1, "no ETag");
    return out.ETag;
  }
}
