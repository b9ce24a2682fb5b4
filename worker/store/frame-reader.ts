import type { Hash } from "node:crypto";
import type { ContentId } from "../../schema/ids.ts";
import {
  type ChunkMeta,
  checkDigest,
  contentHasher,
  type Frame,
  HEADER_BYTES,
  parseHeader,
  parseMeta,
} from "./chunk.ts";
import { CorruptChunkError, type TierName } from "./errors.ts";

/**
 * Verifies a framed object (chunk.ts framing) that arrives in pieces: buffers
 * the header and metadata, then hashes each payload piece as it comes and
 * hands it on. `finish` throws CorruptChunkError unless exactly the framed
 * length arrived and the content hash equals the id. Until `finish` returns,
 * no payload handed out may be trusted.
 */
export class FrameReader {
  private readonly head: Buffer[] = [];
  private headLen = 0;
  private frame: Frame | undefined;
  private hash: Hash | undefined;
  private payloadSeen = 0;
  meta: ChunkMeta | undefined;
  metaJson: Buffer | undefined;

  constructor(
    private readonly tier: TierName,
    private readonly id: ContentId,
    /** The object's length as the server reports it, when it does. */
    private readonly totalLen: number | undefined,
  ) {}

  /** The payload length, once the header has arrived. */
  get payloadLen(): number | undefined {
    return this.frame?.payloadLen;
  }

  /** Feeds the next piece of the stored object; returns the payload bytes in it (views, no copy). */
  push(piece: Uint8Array): Uint8Array[] {
    if (this.frame !== undefined && this.hash !== undefined) return [this.payload(piece)];
    this.head.push(Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength));
    this.headLen += piece.byteLength;
    if (this.headLen < HEADER_BYTES) return [];
    const head = Buffer.concat(this.head, this.headLen);
    this.head.length = 0;
    this.head.push(head);
    if (this.frame === undefined) {
      const expected = HEADER_BYTES + head.readUInt32LE(4) + Number(head.readBigUInt64LE(8));
      this.frame = parseHeader(this.tier, this.id, head, this.totalLen ?? expected);
    }
    if (this.headLen < this.frame.payloadOffset) return [];
    this.metaJson = Buffer.from(head.subarray(HEADER_BYTES, this.frame.payloadOffset));
    this.meta = parseMeta(this.tier, this.id, this.metaJson);
    this.hash = contentHasher(this.metaJson);
    this.head.length = 0;
    const rest = head.subarray(this.frame.payloadOffset);
    return rest.byteLength > 0 ? [this.payload(rest)] : [];
  }

  /** Throws CorruptChunkError unless the whole frame arrived and hashes to the id. */
  finish(): { meta: ChunkMeta; metaJson: Buffer } {
    if (
      this.frame === undefined ||
      this.hash === undefined ||
      this.meta === undefined ||
      this.metaJson === undefined
    ) {
      throw new CorruptChunkError(
        this.tier,
        this.id,
        `truncated: ${this.headLen} bytes, the header or metadata is incomplete`,
      );
    }
    if (this.payloadSeen !== this.frame.payloadLen) {
      throw new CorruptChunkError(
        this.tier,
        this.id,
        `truncated: ${this.payloadSeen} of ${this.frame.payloadLen} payload bytes arrived`,
      );
    }
    checkDigest(this.tier, this.id, this.hash);
    return { meta: this.meta, metaJson: this.metaJson };
  }

  private payload(piece: Uint8Array): Uint8Array {
    this.payloadSeen += piece.byteLength;
    if (this.payloadSeen > this.frame!.payloadLen) {
      throw new CorruptChunkError(
        this.tier,
        this.id,
        `extended: more than ${this.frame!.payloadLen} payload bytes arrived`,
      );
    }
    this.hash!.update(piece);
    return piece;
  }
}
