import { createHash, type Hash } from "node:crypto";
import { CONTENT_TAG, canonicalJson, contentId } from "../../schema/identity.ts";
import { ContentId, InvalidIdError } from "../../schema/ids.ts";
import {
  ContentMismatchError,
  CorruptChunkError,
  describe,
  InvalidChunkError,
  ObjectTooLargeError,
  type TierName,
} from "./errors.ts";

/** Metadata stored with a chunk's bytes; part of its content id. A plain JSON object. */
export type JsonValue =
  | null
  | boolean
  | number
  | string
  | readonly JsonValue[]
  | { readonly [k: string]: JsonValue };
export type ChunkMeta = { readonly [k: string]: JsonValue };

/** Canonical metadata text is bounded so a header read is always small. */
export const MAX_META_BYTES = 64 << 10;

/** An immutable chunk: bytes, metadata and the content id they hash to. */
export interface Chunk {
  readonly id: ContentId;
  readonly bytes: Uint8Array;
  readonly meta: ChunkMeta;
}

/**
 * A chunk whose id has been checked against its bytes and metadata (on put) or
 * recomputed from stored bytes (on get). Only `VerifiedChunk.check` and
 * `VerifiedChunk.trusted` (for a hash computed while reading) make one, so a
 * tier handed a VerifiedChunk never hashes again.
 */
export class VerifiedChunk implements Chunk {
  private constructor(
    readonly id: ContentId,
    readonly bytes: Uint8Array,
    readonly meta: ChunkMeta,
    /** utf8(canonicalJson(meta)): what framing stores and the content hash covers. */
    readonly metaJson: Buffer,
  ) {}

  /**
   * Validates a put: id shape, bytes type, metadata shape and size, the size
   * limit, then (the costly part, last) that contentId(bytes, meta) === id.
   * Throws a StoreError naming what is wrong.
   */
  static check(id: unknown, bytes: unknown, meta: unknown, limit: SizeLimit): VerifiedChunk {
    const cid = checkId(id);
    if (!(bytes instanceof Uint8Array)) {
      throw new InvalidChunkError(`chunk ${cid}: bytes must be a Uint8Array, got ${typeName(bytes)}`);
    }
    const metaJson = checkMeta(cid, meta);
    if (bytes.byteLength > limit.maxObjectBytes) {
      throw new ObjectTooLargeError(limit.tier, bytes.byteLength, limit.maxObjectBytes);
    }
    const actual = contentId(bytes, meta as ChunkMeta);
    if (actual !== cid) throw new ContentMismatchError(cid, actual);
    return new VerifiedChunk(cid, bytes, meta as ChunkMeta, metaJson);
  }

  /** For readers that computed the content hash themselves while reading (see `ContentHasher`). */
  static trusted(id: ContentId, bytes: Uint8Array, meta: ChunkMeta, metaJson: Buffer): VerifiedChunk {
    return new VerifiedChunk(id, bytes, meta, metaJson);
  }

  /** The same chunk over other (equal) bytes, e.g. a private copy. */
  withBytes(bytes: Uint8Array): VerifiedChunk {
    return new VerifiedChunk(this.id, bytes, this.meta, this.metaJson);
  }
}

export interface SizeLimit {
  readonly tier: TierName | "store";
  readonly maxObjectBytes: number;
}

/** A content id from untrusted input, or InvalidChunkError. */
export function checkId(id: unknown): ContentId {
  try {
    return ContentId(id);
  } catch (err) {
    if (err instanceof InvalidIdError) throw new InvalidChunkError(err.message);
    throw err;
  }
}

function typeName(v: unknown): string {
  if (v === null) return "null";
  if (typeof v === "object") return (v as object).constructor?.name ?? "object";
  return typeof v;
}

/** Canonical metadata bytes, or InvalidChunkError naming what is wrong. */
export function checkMeta(id: ContentId, meta: unknown): Buffer {
  if (typeof meta !== "object" || meta === null || Array.isArray(meta)) {
    throw new InvalidChunkError(`chunk ${id}: metadata must be a plain JSON object, got ${typeName(meta)}`);
  }
  const proto = Object.getPrototypeOf(meta);
  if (proto !== Object.prototype && proto !== null) {
    throw new InvalidChunkError(`chunk ${id}: metadata must be a plain JSON object, got ${typeName(meta)}`);
  }
  let text: string;
  try {
    text = canonicalJson(meta);
  } catch (err) {
    throw new InvalidChunkError(`chunk ${id}: metadata is not JSON: ${describe(err)}`);
  }
  // canonicalJson drops undefined-valued keys and JSON.stringify drops
  // functions; a round trip must give back the same text or the stored meta
  // would not be the meta the caller hashed.
  if (canonicalJson(JSON.parse(text)) !== text) {
    throw new InvalidChunkError(`chunk ${id}: metadata holds values JSON cannot carry`);
  }
  const json = Buffer.from(text, "utf8");
  if (json.byteLength > MAX_META_BYTES) {
    throw new InvalidChunkError(
      `chunk ${id}: metadata is ${json.byteLength} bytes as canonical JSON, over the limit of ${MAX_META_BYTES}`,
    );
  }
  return json;
}

/**
 * The content hash fed incrementally:
 *   sha256(CONTENT_TAG ‖ u32le len(metaJson) ‖ metaJson ‖ bytes…)
 * which equals schema/identity.ts `contentId(bytes, meta)` whenever metaJson is
 * utf8(canonicalJson(meta)) (pinned by test/worker/store/chunk.test.ts). Lets a reader
 * hash each piece as it arrives instead of after the whole object.
 */
export function contentHasher(metaJson: Uint8Array): Hash {
  const len = Buffer.allocUnsafe(4);
  len.writeUInt32LE(metaJson.byteLength, 0);
  return createHash("sha256").update(CONTENT_TAG).update(len).update(metaJson);
}

/**
 * Framing shared by the file and S3 tiers (all integers little-endian):
 *
 *   0  "CCK1"            magic and format version
 *   4  u32 metaLen       canonical JSON metadata length
 *   8  u64 payloadLen    chunk byte count
 *  16  metaJson          metaLen bytes
 *  16+metaLen payload    payloadLen bytes
 *
 * total = 16 + metaLen + payloadLen, so a truncated or extended object is
 * caught before hashing.
 */
export const HEADER_BYTES = 16;
const MAGIC = 0x314b4343; // "CCK1" read as u32 little-endian

export function encodeHeader(metaJson: Uint8Array, payloadBytes: number): Buffer {
  const h = Buffer.allocUnsafe(HEADER_BYTES);
  h.writeUInt32LE(MAGIC, 0);
  h.writeUInt32LE(metaJson.byteLength, 4);
  h.writeBigUInt64LE(BigInt(payloadBytes), 8);
  return h;
}

export interface Frame {
  readonly metaLen: number;
  readonly payloadLen: number;
  /** HEADER_BYTES + metaLen: where the payload starts. */
  readonly payloadOffset: number;
  readonly totalLen: number;
}

/** Parses the fixed header; throws CorruptChunkError when it cannot be ours or `totalLen` disagrees. */
export function parseHeader(tier: TierName, id: ContentId, header: Uint8Array, totalLen: number): Frame {
  if (header.byteLength < HEADER_BYTES || totalLen < HEADER_BYTES) {
    throw new CorruptChunkError(
      tier,
      id,
      `truncated: ${totalLen} bytes, shorter than the ${HEADER_BYTES}-byte header`,
    );
  }
  const view = Buffer.from(header.buffer, header.byteOffset, HEADER_BYTES);
  if (view.readUInt32LE(0) !== MAGIC) throw new CorruptChunkError(tier, id, "bad magic (not a CCK1 chunk)");
  const metaLen = view.readUInt32LE(4);
  const payloadBig = view.readBigUInt64LE(8);
  if (metaLen > MAX_META_BYTES) {
    throw new CorruptChunkError(tier, id, `metadata length ${metaLen} is over ${MAX_META_BYTES}`);
  }
  if (payloadBig > BigInt(Number.MAX_SAFE_INTEGER)) {
    throw new CorruptChunkError(tier, id, `payload length ${payloadBig} is not a safe integer`);
  }
  const payloadLen = Number(payloadBig);
  const payloadOffset = HEADER_BYTES + metaLen;
  const expected = payloadOffset + payloadLen;
  if (expected !== totalLen) {
    throw new CorruptChunkError(
      tier,
      id,
      `${expected > totalLen ? "truncated" : "extended"}: header says ${expected} bytes, object has ${totalLen}`,
    );
  }
  return { metaLen, payloadLen, payloadOffset, totalLen };
}

/** Parses stored metadata; it must be canonical JSON of a plain object. */
export function parseMeta(tier: TierName, id: ContentId, metaJson: Buffer): ChunkMeta {
  let meta: unknown;
  try {
    meta = JSON.parse(metaJson.toString("utf8"));
  } catch (err) {
    throw new CorruptChunkError(tier, id, `metadata is not JSON: ${describe(err)}`);
  }
  if (typeof meta !== "object" || meta === null || Array.isArray(meta)) {
    throw new CorruptChunkError(tier, id, "metadata is not a JSON object");
  }
  if (!Buffer.from(canonicalJson(meta), "utf8").equals(metaJson)) {
    throw new CorruptChunkError(tier, id, "metadata is not canonical JSON");
  }
  return meta as ChunkMeta;
}

/** Compares a finished content hash with the expected id; CorruptChunkError when they differ. */
export function checkDigest(tier: TierName, id: ContentId, hash: Hash): void {
  const actual = hash.digest("hex");
  if (actual !== id) throw new CorruptChunkError(tier, id, `content hashes to ${actual}`);
}

/** What a tier's `list` yields: the id and the object's stored size. */
export interface ChunkInfo {
  readonly id: ContentId;
  readonly storedBytes: number;
}

/** A point-in-time snapshot of one tier. */
export interface TierStats {
  readonly tier: TierName;
  /** Objects held; null where counting would need a full listing (S3). */
  readonly objects: number | null;
  /** Payload bytes held (RAM) or stored bytes (file); null for S3. */
  readonly bytes: number | null;
  /** Byte bound, where the tier has one. */
  readonly capacityBytes: number | null;
  readonly hits: number;
  readonly misses: number;
  readonly puts: number;
  readonly corrupt: number;
  readonly evictions: number;
}

/** Things worth one structured log line; never thrown past the store. */
export type StoreEvent =
  | { readonly kind: "corrupt"; readonly tier: TierName; readonly id: ContentId; readonly reason: string }
  | {
      readonly kind: "retry";
      readonly tier: TierName;
      readonly op: string;
      readonly attempt: number;
      readonly delayMs: number;
      readonly error: string;
    }
  | {
      readonly kind: "promote-failed";
      readonly tier: TierName;
      readonly id: ContentId;
      readonly error: string;
    }
  | {
      readonly kind: "tier-failed";
      readonly tier: TierName;
      readonly op: string;
      readonly id: ContentId;
      readonly error: string;
    }
  | { readonly kind: "write-behind-failed"; readonly id: ContentId; readonly error: string };

export type StoreReporter = (event: StoreEvent) => void;

/** Default reporter: one JSON line per event on stderr. */
export const stderrReporter: StoreReporter = (event) => {
  process.stderr.write(`${JSON.stringify({ at: new Date().toISOString(), component: "store", ...event })}\n`);
};

/** One tier of the chunk store. Every method validates its id argument. */
export interface ChunkTier {
  readonly tier: TierName;
  readonly maxObjectBytes: number;
  /** Validates (VerifiedChunk.check) then stores. Idempotent: the same chunk twice is one object. */
  put(id: unknown, bytes: unknown, meta: unknown): Promise<void>;
  /** Stores an already verified chunk without hashing again. */
  putVerified(chunk: VerifiedChunk): Promise<void>;
  /** The verified chunk, undefined when absent, CorruptChunkError when it fails verification. */
  get(id: unknown): Promise<VerifiedChunk | undefined>;
  has(id: unknown): Promise<boolean>;
  /** True when an object was removed. */
  delete(id: unknown): Promise<boolean>;
  list(): AsyncIterable<ChunkInfo>;
  stats(): TierStats;
  close(): Promise<void>;
}

/** Mutable counters behind TierStats. */
export class TierCounters {
  hits = 0;
  misses = 0;
  puts = 0;
  corrupt = 0;
  evictions = 0;
}
