import type { Readable } from "node:stream";
import {
  DeleteObjectCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  type S3Client,
} from "@aws-sdk/client-s3";
import type { ContentId } from "../../schema/ids.ts";
import type { RetryPolicy } from "../../schema/retry.ts";
import { s3Client, s3NotFound, s3Status } from "../../schema/s3-client.ts";
import {
  type ChunkInfo,
  type ChunkMeta,
  type ChunkTier,
  checkId,
  checkMeta,
  contentHasher,
  encodeHeader,
  type StoreReporter,
  stderrReporter,
  TierCounters,
  type TierStats,
  VerifiedChunk,
} from "./chunk.ts";
import {
  ContentMismatchError,
  CorruptChunkError,
  InvalidChunkError,
  ObjectTooLargeError,
  StoreClosedError,
  StoreUnavailableError,
} from "./errors.ts";
import { FrameReader } from "./frame-reader.ts";
import { withRetries } from "./retry.ts";
import { ensureBucket, probeBucket, retryable } from "./s3-bucket.ts";
import { MultipartUpload, type S3Requests } from "./s3-multipart.ts";

export interface S3TierOptions {
  readonly endpoint: string;
  readonly bucket: string;
  readonly region: string;
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  /** Key prefix of every chunk object. */
  readonly prefix?: string;
  readonly maxObjectBytes: number;
  /** Objects (framed) larger than this go up in parts. */
  readonly multipartThresholdBytes: number;
  /** Part size, ≥ 5 MiB (S3's minimum for every part but the last). */
  readonly partBytes: number;
  /** Parts in flight at once for one object: bounds memory to partConcurrency × partBytes. */
  readonly partConcurrency: number;
  readonly maxAttempts: number;
  readonly retryBaseMs: number;
  /** Deadline of one request attempt, plus time for its body at FLOOR_BYTES_PER_MS. */
  readonly requestTimeoutMs: number;
  /** HeadBucket at open and CreateBucket when missing (when S3 is unreachable at open: before the first put instead). */
  readonly createBucket?: boolean;
  readonly report?: StoreReporter;
}

/** Slowest body transfer an attempt's deadline allows for: 10 MiB/s, in bytes per ms. */
const FLOOR_BYTES_PER_MS = (10 << 20) / 1000;
/** S3 allows at most 10,000 parts per upload. */
const MAX_PARTS = 10_000;
const MIN_PART_BYTES = 5 << 20;
const ID_KEY = /([0-9a-f]{64})$/;

type Body = Readable & AsyncIterable<Uint8Array>;

/**
 * The S3 tier through @aws-sdk/client-s3, path-style (S3Proxy, MinIO and AWS
 * alike). Objects use the same framing as the file tier, so a get verifies
 * framing and content hash before returning bytes.
 *
 * Every request runs under `withRetries`: bounded attempts, exponential
 * backoff, and a deadline per attempt that aborts the request (and its body),
 * so a stopped server costs a caller at most
 * maxAttempts × deadline + Σ backoff, never a hang. SDK retries are off (ours
 * are the only ones) and checksums are computed only when an operation
 * requires them: streamed bodies otherwise go out with aws-chunked framing
 * that some S3-compatible servers store as part of the object.
 */
export class S3Tier implements ChunkTier {
  readonly tier = "s3" as const;
  readonly maxObjectBytes: number;
  readonly bucket: string;
  readonly prefix: string;
  readonly client: S3Client;
  private readonly opts: S3TierOptions;
  private readonly policy: RetryPolicy;
  private readonly report: StoreReporter;
  private readonly counters = new TierCounters();
  private readonly closing = new AbortController();
  private readonly inFlight = new Set<Promise<unknown>>();
  /** What a multipart upload (s3-multipart.ts) sends its requests through. */
  private readonly requests: S3Requests;
  /** Whether the last request's outcome was an answer from S3 (false: it was unreachable after its retries). */
  private answering = true;
  /** The bucket still has to be made sure of before the first put (S3 was unreachable at open). */
  private bucketPending = false;
  private bucketCheck: Promise<void> | undefined;
  /** Why S3 did not answer at open; undefined when it did. */
  unreachableAtOpen: string | undefined;

  private constructor(opts: S3TierOptions) {
    if (opts.partBytes < MIN_PART_BYTES)
      throw new RangeError(`s3 tier: partBytes must be ≥ ${MIN_PART_BYTES}`);
    if (opts.multipartThresholdBytes < opts.partBytes) {
      throw new RangeError("s3 tier: multipartThresholdBytes must be ≥ partBytes");
    }
    if (opts.maxAttempts < 1) throw new RangeError("s3 tier: maxAttempts must be ≥ 1");
    this.opts = opts;
    this.maxObjectBytes = opts.maxObjectBytes;
    this.bucket = opts.bucket;
    this.prefix = opts.prefix ?? "chunks/";
    this.report = opts.report ?? stderrReporter;
    this.policy = { maxAttempts: opts.maxAttempts, baseMs: opts.retryBaseMs, capMs: opts.retryBaseMs * 32 };
    this.client = s3Client(opts, {
      maxAttempts: 1,
      requestHandler: {
        connectionTimeout: Math.min(opts.requestTimeoutMs, 5_000),
        // Idle socket: a server that stops answering mid-body is noticed.
        socketTimeout: opts.requestTimeoutMs,
        httpAgent: { keepAlive: true, maxSockets: 32 },
      },
    });
    this.requests = {
      client: this.client,
      bucket: this.bucket,
      requestTimeoutMs: opts.requestTimeoutMs,
      keyOf: (id) => this.keyOf(id),
      retry: (op, bodyBytes, attempt) => this.retry(op, bodyBytes, attempt),
    };
  }

  /**
   * Builds the client and sends one bounded request (PROBE_MS, s3-bucket.ts) to see whether
   * S3 answers. Unreachable is not fatal: the tier opens anyway, degraded
   * (`unreachableAtOpen` says why), every request still retries on its own,
   * and a missing bucket is created before the first put instead. When S3
   * answers and `createBucket` is set, the bucket is made sure of now.
   */
  static async open(opts: S3TierOptions): Promise<S3Tier> {
    const tier = new S3Tier(opts);
    tier.unreachableAtOpen = await tier.probe();
    if (tier.unreachableAtOpen !== undefined) {
      tier.answering = false;
      tier.bucketPending = opts.createBucket === true;
      return tier;
    }
    if (opts.createBucket) {
      try {
        await tier.ensureBucket();
      } catch (err) {
        tier.client.destroy();
        throw err;
      }
    }
    return tier;
  }

  keyOf(id: ContentId): string {
    return `${this.prefix}${id}`;
  }

  async put(id: unknown, bytes: unknown, meta: unknown): Promise<void> {
    this.open();
    await this.putVerified(VerifiedChunk.check(id, bytes, meta, this));
  }

  async putVerified(chunk: VerifiedChunk): Promise<void> {
    this.open();
    if (chunk.bytes.byteLength > this.maxObjectBytes) {
      throw new ObjectTooLargeError("s3", chunk.bytes.byteLength, this.maxObjectBytes);
    }
    const prefix = Buffer.concat([encodeHeader(chunk.metaJson, chunk.bytes.byteLength), chunk.metaJson]);
    const total = prefix.byteLength + chunk.bytes.byteLength;
    await this.bucketReady();
    await this.track(async () => {
      if (total <= this.opts.multipartThresholdBytes) {
        await this.putObject(chunk.id, Buffer.concat([prefix, chunk.bytes], total));
      } else {
        await this.putMultipart(chunk.id, prefix, chunk.bytes);
      }
    });
    this.counters.puts++;
  }

  /**
   * Streamed put: `payload` yields exactly `payloadBytes` bytes whose content
   * id (with `meta`) must be `id`. Small objects are gathered and sent in one
   * PUT; large ones go up part by part as they arrive (memory ≤ partConcurrency
   * × partBytes) and the upload is completed only after the hash matched, so a
   * mismatch or short stream aborts it and leaves the bucket unchanged.
   */
  async putStream(
    id: unknown,
    meta: unknown,
    payload: AsyncIterable<Uint8Array>,
    payloadBytes: number,
  ): Promise<void> {
    this.open();
    const cid = checkId(id);
    const metaJson = checkMeta(cid, meta);
    if (!Number.isSafeInteger(payloadBytes) || payloadBytes < 0) {
      throw new InvalidChunkError(
        `chunk ${cid}: payloadBytes must be a non-negative integer, got ${payloadBytes}`,
      );
    }
    if (payloadBytes > this.maxObjectBytes)
      throw new ObjectTooLargeError("s3", payloadBytes, this.maxObjectBytes);
    const prefix = Buffer.concat([encodeHeader(metaJson, payloadBytes), metaJson]);
    const total = prefix.byteLength + payloadBytes;
    const hash = contentHasher(metaJson);
    const lengthError = (got: number) =>
      new InvalidChunkError(
        `chunk ${cid}: the stream gave ${got === -1 ? "more than" : got} of ${payloadBytes} declared bytes`,
      );
    await this.bucketReady();
    await this.track(async () => {
      if (total <= this.opts.multipartThresholdBytes) {
        const body = Buffer.allocUnsafe(total);
        prefix.copy(body, 0);
        let at = prefix.byteLength;
        for await (const piece of payload) {
          if (at + piece.byteLength > total) throw lengthError(-1);
          body.set(piece, at);
          hash.update(piece);
          at += piece.byteLength;
        }
        if (at !== total) throw lengthError(at - prefix.byteLength);
        const actual = hash.digest("hex") as ContentId;
        if (actual !== cid) throw new ContentMismatchError(cid, actual);
        await this.putObject(cid, body);
        return;
      }
      const parts = await MultipartUpload.create(this.requests, cid, this.opts.partConcurrency);
      try {
        const partBytes = this.opts.partBytes;
        let part = Buffer.allocUnsafe(Math.min(partBytes, total));
        prefix.copy(part, 0);
        let fill = prefix.byteLength;
        /** Framed bytes handed to `parts` so far (the prefix included). */
        let sent = 0;
        let seen = 0;
        for await (const piece of payload) {
          if (seen + piece.byteLength > payloadBytes) throw lengthError(-1);
          hash.update(piece);
          seen += piece.byteLength;
          let from = 0;
          while (from < piece.byteLength) {
            const n = Math.min(piece.byteLength - from, part.byteLength - fill);
            part.set(piece.subarray(from, from + n), fill);
            fill += n;
            from += n;
            if (fill === part.byteLength) {
              await parts.add(part);
              sent += fill;
              part = Buffer.allocUnsafe(Math.min(partBytes, Math.max(total - sent, 1)));
              fill = 0;
            }
          }
        }
        if (seen !== payloadBytes) throw lengthError(seen);
        const actual = hash.digest("hex") as ContentId;
        if (actual !== cid) throw new ContentMismatchError(cid, actual);
        if (fill > 0) await parts.add(part.subarray(0, fill));
        await parts.complete();
      } catch (err) {
        await parts.abort();
        throw err;
      }
    });
    this.counters.puts++;
  }

  async get(id: unknown): Promise<VerifiedChunk | undefined> {
    this.open();
    const cid = checkId(id);
    const got = await this.track(() =>
      this.retry(`get ${cid}`, undefined, async (signal) => {
        const body = await this.getBody(cid, signal);
        if (body === undefined) return undefined;
        const reader = new FrameReader("s3", cid, body.contentLength);
        let payload: Buffer | undefined;
        let at = 0;
        for await (const piece of body.stream) {
          for (const p of reader.push(piece)) {
            payload ??= Buffer.allocUnsafe(reader.payloadLen ?? 0);
            payload.set(p, at);
            at += p.byteLength;
          }
        }
        const { meta, metaJson } = reader.finish();
        return VerifiedChunk.trusted(cid, payload ?? Buffer.alloc(0), meta, metaJson);
      }),
    ).catch((err) => this.onReadError(cid, err));
    if (got === undefined) this.counters.misses++;
    else this.counters.hits++;
    return got;
  }

  /**
   * Streamed get: the payload in pieces as they arrive, each hashed on the
   * way. The last step of the iteration verifies length and hash and throws
   * CorruptChunkError when they are wrong, so a consumer must not use (e.g.
   * mark runnable) what it received until the iteration completed. Undefined
   * when the object is missing. Only the request is retried, never a
   * half-delivered body.
   */
  async getStream(
    id: unknown,
  ): Promise<{ meta: ChunkMeta; payloadBytes: number; pieces: AsyncIterable<Uint8Array> } | undefined> {
    this.open();
    const cid = checkId(id);
    const body = await this.track(() =>
      this.retry(`get ${cid}`, undefined, async (signal) => this.getBody(cid, signal)),
    ).catch((err) => this.onReadError(cid, err));
    if (body === undefined) {
      this.counters.misses++;
      return undefined;
    }
    const iterator = body.stream[Symbol.asyncIterator]();
    const reader = new FrameReader("s3", cid, body.contentLength);
    // Read until the metadata is known; the payload bytes read with it wait in `early`.
    const early: Uint8Array[] = [];
    try {
      while (reader.meta === undefined) {
        const next = await iterator.next();
        if (next.done) reader.finish();
        else early.push(...reader.push(next.value));
      }
    } catch (err) {
      body.stream.destroy();
      this.onReadError(cid, err);
    }
    const self = this;
    async function* pieces(): AsyncIterable<Uint8Array> {
      try {
        yield* early;
        for (;;) {
          const next = await iterator.next();
          if (next.done) break;
          yield* reader.push(next.value);
        }
        reader.finish();
        self.counters.hits++;
      } catch (err) {
        self.onReadError(cid, err);
      } finally {
        body?.stream.destroy();
      }
    }
    return { meta: reader.meta as ChunkMeta, payloadBytes: reader.payloadLen ?? 0, pieces: pieces() };
  }

  async has(id: unknown): Promise<boolean> {
    this.open();
    const cid = checkId(id);
    return this.track(() =>
      this.retry(`head ${cid}`, undefined, async (signal) => {
        try {
          await this.client.send(new HeadObjectCommand({ Bucket: this.bucket, Key: this.keyOf(cid) }), {
            abortSignal: signal,
          });
          return true;
        } catch (err) {
          if (s3NotFound(err)) return false;
          throw err;
        }
      }),
    );
  }

  async delete(id: unknown): Promise<boolean> {
    this.open();
    const cid = checkId(id);
    const existed = await this.has(cid);
    if (!existed) return false;
    await this.track(() =>
      this.retry(`delete ${cid}`, undefined, (signal) =>
        this.client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: this.keyOf(cid) }), {
          abortSignal: signal,
        }),
      ),
    );
    return true;
  }

  async *list(): AsyncIterable<ChunkInfo> {
    this.open();
    let token: string | undefined;
    do {
      const page = await this.track(() =>
        this.retry("list", undefined, (signal) =>
          this.client.send(
            new ListObjectsV2Command({
              Bucket: this.bucket,
              Prefix: this.prefix,
              ContinuationToken: token,
              MaxKeys: 1000,
            }),
            { abortSignal: signal },
          ),
        ),
      );
      for (const obj of page.Contents ?? []) {
        const m = obj.Key === undefined ? null : ID_KEY.exec(obj.Key);
        if (m && obj.Key === this.keyOf(m[1] as ContentId))
          yield { id: m[1] as ContentId, storedBytes: obj.Size ?? 0 };
      }
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token !== undefined);
  }

  stats(): TierStats {
    return { tier: "s3", objects: null, bytes: null, capacityBytes: null, ...this.counters };
  }

  /** False while S3 is unreachable: from open (when it did not answer) or a request that ran out of retries, until one gets an answer. */
  answers(): boolean {
    return this.answering;
  }

  /** Stops accepting work, aborts retries and requests in flight, waits for them, releases sockets. */
  async close(): Promise<void> {
    if (this.closing.signal.aborted) return;
    this.closing.abort();
    await Promise.allSettled([...this.inFlight]);
    this.client.destroy();
  }

  // ---- requests ---------------------------------------------------------

  private probe(): Promise<string | undefined> {
    return probeBucket(this.client, this.bucket, this.opts.requestTimeoutMs);
  }

  /** Before a put: the bucket creation that open() deferred, once (a failure leaves it for the next put). */
  private async bucketReady(): Promise<void> {
    if (!this.bucketPending) return;
    this.bucketCheck ??= this.ensureBucket().then(
      () => {
        this.bucketPending = false;
      },
      (err) => {
        this.bucketCheck = undefined;
        throw err;
      },
    );
    await this.bucketCheck;
  }

  private ensureBucket(): Promise<void> {
    return ensureBucket(this.client, this.bucket, (op, bytes, attempt) => this.retry(op, bytes, attempt));
  }

  private async putObject(id: ContentId, body: Buffer): Promise<void> {
    await this.retry(`put ${id}`, body.byteLength, (signal) =>
      this.client.send(
        new PutObjectCommand({
          Bucket: this.bucket,
          Key: this.keyOf(id),
          Body: body,
          ContentLength: body.byteLength,
        }),
        { abortSignal: signal },
      ),
    );
  }

  /** Parts are views of [prefix ‖ payload]; only the first part is copied (to join the two). */
  private async putMultipart(id: ContentId, prefix: Buffer, payload: Uint8Array): Promise<void> {
    const P = this.opts.partBytes;
    const total = prefix.byteLength + payload.byteLength;
    const count = Math.ceil(total / P);
    if (count > MAX_PARTS)
      throw new ObjectTooLargeError("s3", payload.byteLength, MAX_PARTS * P - prefix.byteLength);
    const parts = await MultipartUpload.create(this.requests, id, this.opts.partConcurrency);
    try {
      for (let i = 0; i < count; i++) {
        // Framed range [i·P, min((i+1)·P, total)); payload offsets are shifted by the prefix length.
        const end = Math.min((i + 1) * P, total) - prefix.byteLength;
        const body =
          i === 0
            ? Buffer.concat([prefix, payload.subarray(0, end)])
            : payload.subarray(i * P - prefix.byteLength, end);
        await parts.add(body);
      }
      await parts.complete();
    } catch (err) {
      await parts.abort();
      throw err;
    }
  }

  /** GetObject's body stream, tied to the attempt's signal; undefined on 404. */
  private async getBody(
    id: ContentId,
    signal: AbortSignal,
  ): Promise<{ stream: Body; contentLength: number | undefined } | undefined> {
    try {
      const out = await this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: this.keyOf(id) }), {
        abortSignal: signal,
      });
      const stream = out.Body as Body | undefined;
      if (stream === undefined) throw new StoreUnavailableError("s3", `get ${id}`, 1, "response had no body");
      // The deadline covers the body too: destroying the stream ends a stalled read.
      const onAbort = () =>
        stream.destroy(signal.reason instanceof Error ? signal.reason : new Error("aborted"));
      signal.addEventListener("abort", onAbort, { once: true });
      stream.once("close", () => signal.removeEventListener("abort", onAbort));
      return { stream, contentLength: out.ContentLength };
    } catch (err) {
      if (s3NotFound(err)) return undefined;
      throw err;
    }
  }

  private retry<T>(
    op: string,
    bodyBytes: number | undefined,
    attempt: (signal: AbortSignal) => Promise<T>,
  ): Promise<T> {
    return withRetries(
      {
        tier: "s3",
        op,
        policy: this.policy,
        attemptMs: this.opts.requestTimeoutMs + Math.ceil((bodyBytes ?? 0) / FLOOR_BYTES_PER_MS),
        closing: this.closing.signal,
        report: this.report,
        retryable,
      },
      attempt,
    ).then(
      (v) => {
        this.answering = true;
        return v;
      },
      (err: unknown) => {
        // Out of retries on network trouble: unreachable. Any other verdict came with an answer.
        if (err instanceof StoreUnavailableError) this.answering = false;
        else if (s3Status(err) !== undefined) this.answering = true;
        throw err;
      },
    );
  }

  /** Counts a corrupt read and reports it; rethrows every error. */
  private onReadError(id: ContentId, err: unknown): never {
    if (err instanceof CorruptChunkError) {
      this.counters.corrupt++;
      this.report({ kind: "corrupt", tier: "s3", id, reason: err.reason });
    }
    throw err;
  }

  /** Keeps `close` waiting for work that started before it. */
  private track<T>(work: () => Promise<T>): Promise<T> {
    const p = work();
    this.inFlight.add(p);
    const done = () => this.inFlight.delete(p);
    p.then(done, done);
    return p;
  }

  private open(): void {
    if (this.closing.signal.aborted) throw new StoreClosedError("s3 tier is closed");
  }
}
