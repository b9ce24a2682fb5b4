import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { canonicalJson, contentId } from "../../../schema/identity.ts";
import type { ContentId } from "../../../schema/ids.ts";
import {
  contentHasher,
  encodeHeader,
  HEADER_BYTES,
  MAX_META_BYTES,
  parseHeader,
  parseMeta,
  VerifiedChunk,
} from "../../../worker/store/chunk.ts";
import {
  ContentMismatchError,
  CorruptChunkError,
  InvalidChunkError,
  ObjectTooLargeError,
} from "../../../worker/store/errors.ts";
import { FrameReader } from "../../../worker/store/frame-reader.ts";
import { chunkOf } from "./fixtures.ts";

const limit = { tier: "store" as const, maxObjectBytes: 1 << 20 };

describe("content hashing", () => {
  it("the incremental hasher equals schema contentId for any bytes, meta and split", () => {
    fc.assert(
      fc.property(
        fc.uint8Array({ maxLength: 2048 }),
        fc.dictionary(fc.string(), fc.oneof(fc.string(), fc.integer(), fc.boolean())),
        fc.nat(),
        (bytes, meta, cut) => {
          const metaJson = Buffer.from(canonicalJson(meta), "utf8");
          const at = bytes.length === 0 ? 0 : cut % bytes.length;
          const h = contentHasher(metaJson).update(bytes.subarray(0, at)).update(bytes.subarray(at));
          expect(h.digest("hex")).toBe(contentId(bytes, meta));
        },
      ),
    );
  });
});

describe("VerifiedChunk.check (bad input is refused with a clear error)", () => {
  const c = chunkOf(1000, "check");

  it("accepts a chunk whose id matches", () => {
    const v = VerifiedChunk.check(c.id, c.bytes, c.meta, limit);
    expect(v.id).toBe(c.id);
    expect(v.metaJson.toString()).toBe(canonicalJson(c.meta));
  });

  it("refuses a malformed id, naming it", () => {
    expect(() => VerifiedChunk.check("ABC", c.bytes, c.meta, limit)).toThrow(InvalidChunkError);
    expect(() => VerifiedChunk.check(c.id.toUpperCase(), c.bytes, c.meta, limit)).toThrow(
      /content id must be 64 lowercase hex/,
    );
    expect(() => VerifiedChunk.check(42, c.bytes, c.meta, limit)).toThrow(InvalidChunkError);
  });

  it("refuses bytes that do not hash to the id, naming both ids", () => {
    const other = chunkOf(1000, "other");
    const err = (() => {
      try {
        VerifiedChunk.check(c.id, other.bytes, c.meta, limit);
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(ContentMismatchError);
    expect((err as Error).message).toContain(c.id);
    // metadata is part of the id too
    expect(() => VerifiedChunk.check(c.id, c.bytes, { ...c.meta, tokens: 255 }, limit)).toThrow(
      ContentMismatchError,
    );
  });

  it("refuses an object over the limit before hashing it", () => {
    const big = chunkOf(2000, "big");
    expect(() =>
      VerifiedChunk.check(big.id, big.bytes, big.meta, { tier: "store", maxObjectBytes: 1999 }),
    ).toThrow(ObjectTooLargeError);
  });

  it("refuses bytes that are not a Uint8Array and metadata that is not a plain JSON object", () => {
    expect(() => VerifiedChunk.check(c.id, "text", c.meta, limit)).toThrow(
      /bytes must be a Uint8Array, got string/,
    );
    expect(() => VerifiedChunk.check(c.id, c.bytes, [1, 2], limit)).toThrow(
      /metadata must be a plain JSON object/,
    );
    expect(() => VerifiedChunk.check(c.id, c.bytes, new Date(), limit)).toThrow(
      /plain JSON object, got Date/,
    );
    expect(() => VerifiedChunk.check(c.id, c.bytes, { x: Number.NaN }, limit)).toThrow(
      /metadata is not JSON/,
    );
    expect(() => VerifiedChunk.check(c.id, c.bytes, { x: "y".repeat(MAX_META_BYTES) }, limit)).toThrow(
      /over the limit/,
    );
  });
});

describe("framing", () => {
  const c = chunkOf(300, "frame");
  const metaJson = Buffer.from(canonicalJson(c.meta));
  const framed = Buffer.concat([encodeHeader(metaJson, c.bytes.length), metaJson, c.bytes]);
  const id = c.id;

  it("parses its own header", () => {
    const f = parseHeader("file", id, framed, framed.length);
    expect(f).toEqual({
      metaLen: metaJson.length,
      payloadLen: 300,
      payloadOffset: HEADER_BYTES + metaJson.length,
      totalLen: framed.length,
    });
  });

  it("detects truncation, extension, bad magic and non-canonical metadata", () => {
    expect(() => parseHeader("file", id, framed, framed.length - 1)).toThrow(/truncated/);
    expect(() => parseHeader("file", id, framed, framed.length + 1)).toThrow(/extended/);
    expect(() => parseHeader("file", id, framed.subarray(0, 8), 8)).toThrow(/truncated/);
    const bad = Buffer.from(framed);
    bad[0] = 0x58;
    expect(() => parseHeader("file", id, bad, bad.length)).toThrow(/bad magic/);
    expect(() => parseMeta("file", id, Buffer.from('{"b":1,"a":2}'))).toThrow(/not canonical/);
    expect(() => parseMeta("file", id, Buffer.from("[1]"))).toThrow(CorruptChunkError);
  });

  it("FrameReader verifies an object fed in arbitrary pieces", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 1, max: 97 }), { minLength: 1, maxLength: 20 }), (cuts) => {
        const r = new FrameReader("s3", id, framed.length);
        const payload: Uint8Array[] = [];
        let at = 0;
        let i = 0;
        while (at < framed.length) {
          const n = Math.min(cuts[i++ % cuts.length]!, framed.length - at);
          payload.push(...r.push(framed.subarray(at, at + n)));
          at += n;
        }
        expect(r.finish().meta).toEqual(c.meta);
        expect(Buffer.concat(payload).equals(Buffer.from(c.bytes))).toBe(true);
      }),
    );
  });

  it("FrameReader refuses a short or altered object", () => {
    const short = new FrameReader("s3", id, undefined);
    short.push(framed.subarray(0, framed.length - 5));
    expect(() => short.finish()).toThrow(/truncated: 295 of 300/);
    const flipped = Buffer.from(framed);
    flipped[flipped.length - 1]! ^= 1;
    const r = new FrameReader("s3", id, flipped.length);
    r.push(flipped);
    expect(() => r.finish()).toThrow(/content hashes to/);
    const wrongId = new FrameReader("s3", "0".repeat(64) as ContentId, framed.length);
    wrongId.push(framed);
    expect(() => wrongId.finish()).toThrow(CorruptChunkError);
  });
});
