import {
  CreateBucketCommand,
  DeleteObjectCommand,
  GetObjectCommand,
  HeadBucketCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  type S3Client,
} from "@aws-sdk/client-s3";
import { s3Client } from "../schema/s3-client.ts";
import { SnapshotError, type SnapshotStore } from "./snapshot.ts";

export interface S3SnapshotOptions {
  readonly endpoint: string;
  readonly region: string;
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  readonly bucket: string;
  /** Key prefix under which this catalog's snapshots live, e.g. "catalog/snapshots/". */
  readonly prefix: string;
  /** Per request; a stopped server fails the call instead of hanging it. */
  readonly requestTimeoutMs: number;
}

/**
 * Catalog snapshots in the object store (ARCHITECTURE: "Snapshots of the db
 * at an offset go to the object store"), so a replica on any machine starts
 * from the newest one. Objects are whole snapshots under `prefix`; each is
 * written with one PUT (atomic in S3: a reader sees all of it or none), and
 * snapshot.ts seals every object with its sha256, so a damaged one is
 * detected and skipped. Listing is bounded to one page of 1,000 keys — far
 * more than the SNAPSHOTS_KEPT a writer leaves.
 */
export class S3SnapshotStore implements SnapshotStore {
  private readonly client: S3Client;

  private constructor(private readonly opts: S3SnapshotOptions) {
    this.client = s3Client(opts, {
      maxAttempts: 3,
      requestHandler: { connectionTimeout: opts.requestTimeoutMs, socketTimeout: opts.requestTimeoutMs },
    });
  }

  /** Opens the store, creating the bucket when it does not exist. */
  static async open(opts: S3SnapshotOptions): Promise<S3SnapshotStore> {
    if (!/^[A-Za-z0-9._/-]*$/.test(opts.prefix))
      throw new SnapshotError(`bad snapshot prefix ${JSON.stringify(opts.prefix)}`);
    const store = new S3SnapshotStore(opts);
    try {
      await store.client.send(new HeadBucketCommand({ Bucket: opts.bucket }));
    } catch {
      await store.client.send(new CreateBucketCommand({ Bucket: opts.bucket })).catch((err: Error) => {
        if (!/BucketAlready/.test(err.name)) throw err;
      });
    }
    return store;
  }

  private key(name: string): string {
    if (!/^[A-Za-z0-9._-]{1,200}$/.test(name))
      throw new SnapshotError(`bad snapshot key ${JSON.stringify(name)}`);
    return `${this.opts.prefix}${name}`;
  }

  async put(name: string, bytes: Uint8Array): Promise<void> {
    await this.client.send(
      new PutObjectCommand({
        Bucket: this.opts.bucket,
        Key: this.key(name),
        Body: bytes,
        ContentLength: bytes.byteLength,
      }),
    );
  }

  async get(name: string): Promise<Uint8Array | undefined> {
    try {
      const r = await this.client.send(
        new GetObjectCommand({ Bucket: this.opts.bucket, Key: this.key(name) }),
      );
      return r.Body ? await r.Body.transformToByteArray() : new Uint8Array(0);
    } catch (err) {
      if ((err as Error).name === "NoSuchKey") return undefined;
      throw err;
    }
  }

  async list(): Promise<string[]> {
    const r = await this.client.send(
      new ListObjectsV2Command({ Bucket: this.opts.bucket, Prefix: this.opts.prefix, MaxKeys: 1000 }),
    );
    return (r.Contents ?? [])
      .map((o) => (o.Key ?? "").slice(this.opts.prefix.length))
      .filter((k) => k !== "" && !k.includes("/"))
      .sort();
  }

  async delete(name: string): Promise<void> {
    await this.client.send(new DeleteObjectCommand({ Bucket: this.opts.bucket, Key: this.key(name) }));
  }

  close(): void {
    this.client.destroy();
  }
}
