import { describe, expect, it } from "vitest";
import { prefixChain } from "../../../schema/identity.ts";
import type { ModelFingerprint } from "../../../schema/ids.ts";
import {
  CHUNK_FORMAT,
  describeChunk,
  KvGeometry,
  layerMask,
  metaMismatch,
  packChunk,
  unpackChunk,
} from "../../../worker/checkpoint/chunk-format.ts";
import { groupChain, groupChunksOf } from "../../../worker/checkpoint/group-chunks.ts";
import { layerGroups, slidingLayer } from "../../../worker/model/layout.ts";
import { groupHash } from "../../../worker/pages/layer-groups.ts";

/** 6 layers held in pages of 2 slots (three groups of two, as a 4-sliding/2-global layout groups them). */
const g = new KvGeometry(6, 2, 4, 4, 2);
const P = 16;

/** Page-major bytes for `pages` pages where every fp16 element encodes (slot, k|v, row, element). */
function pagesOf(pages: number): Uint8Array {
  const out = new Uint8Array(pages * g.pageBytes(P));
  const v = new DataView(out.buffer);
  for (let p = 0; p < pages; p++)
    for (let s = 0; s < g.slots; s++)
      for (const kv of [0, 1])
        for (let o = 0; o < P; o++) {
          const rowBytes = kv === 0 ? g.kRow : g.vRow;
          const base =
            p * g.pageBytes(P) + s * P * (g.kRow + g.vRow) + (kv === 0 ? 0 : P * g.kRow) + o * rowBytes;
          for (let e = 0; e < rowBytes / 2; e++)
            v.setUint16(base + 2 * e, ((s * 2 + kv) * 4096 + (p * P + o) * 8 + e) & 0xffff, true);
        }
  return out;
}

const fp = "ab".repeat(32) as ModelFingerprint;
const node = prefixChain(
  Array.from({ length: 40 }, (_, i) => i),
  32,
)[0]!;

describe("chunk layer masks", () => {
  it("pages hold the slots' layers: pageBytes and chunkBytes follow slots and held layers", () => {
    expect(g.pageBytes(P)).toBe(P * 2 * (g.kRow + g.vRow));
    expect(g.chunkBytes(32, 1)).toBe(32 * (g.kRow + g.vRow));
    expect(g.chunkBytes(32)).toBe(32 * 6 * (g.kRow + g.vRow));
    expect(() => new KvGeometry(2, 1, 1, 1, 3)).toThrow(/slots 3 exceeds the 2 layers/);
  });

  it("a chunk of fewer layers than the slots packs only those slots and round-trips exactly", () => {
    const src = pagesOf(3);
    const one = packChunk(g, { bytes: src, firstPageRow: 0, pageTokens: P }, 5, 32, 1);
    expect(one.byteLength).toBe(g.chunkBytes(32, 1));
    const two = packChunk(g, { bytes: src, firstPageRow: 0, pageTokens: P }, 5, 32, 2);
    // Held layer 0 is the same bytes either way; slot 1 only in the two-layer chunk.
    expect(Buffer.from(two.subarray(0, one.byteLength)).equals(Buffer.from(one))).toBe(true);
    const dst = new Uint8Array(src.byteLength).fill(0xee);
    unpackChunk(g, one, 5, 32, { bytes: dst, firstPageRow: 0, pageTokens: P }, 5, 32, 1);
    const slot1 = P * (g.kRow + g.vRow);
    // Page 1 (rows 16..31, all inside the chunk): slot 0 restored, slot 1 untouched.
    const page1 = g.pageBytes(P);
    expect(
      Buffer.from(dst.subarray(page1, page1 + slot1)).equals(Buffer.from(src.subarray(page1, page1 + slot1))),
    ).toBe(true);
    expect(dst.subarray(page1 + slot1, page1 + 2 * slot1).every((b) => b === 0xee)).toBe(true);
    expect(() => packChunk(g, { bytes: src, firstPageRow: 0, pageTokens: P }, 0, 16, 3)).toThrow(
      /3 layers does not fit pages of 2 slots/,
    );
    expect(() =>
      unpackChunk(g, one, 5, 32, { bytes: dst, firstPageRow: 0, pageTokens: P }, 5, 32, 2),
    ).toThrow(/expected/);
  });

  it("the mask is among the content id's inputs: equal bytes of other layers never collide", () => {
    const payload = packChunk(g, { bytes: pagesOf(3), firstPageRow: 0, pageTokens: P }, 0, 32, 2);
    const a = describeChunk(fp, "kv", "0,1", node, payload);
    const b = describeChunk(fp, "kv", "2,3", node, payload);
    expect(a.meta.format).toBe(CHUNK_FORMAT);
    expect(a.meta.layers).toBe("0,1");
    expect(a.id).not.toBe(b.id);
    expect(metaMismatch(a.meta, a.descriptor)).toBeNull();
    expect(metaMismatch(b.meta, a.descriptor)).toBe('chunk holds layers "2,3", expected "0,1"');
    // A v1 chunk (every layer, no mask) is refused by its format.
    const v1 = { ...a.meta, format: "continuum/kv-chunk/v1" } as Record<string, unknown>;
    delete v1.layers;
    expect(metaMismatch(v1 as typeof a.meta, a.descriptor)).toMatch(
      /^metadata format is "continuum\/kv-chunk\/v1"/,
    );
  });

  it("masks are ascending distinct layer indices", () => {
    expect(layerMask([0, 2, 5], 6)).toBe("0,2,5");
    expect(() => layerMask([], 6)).toThrow(/at least one layer/);
    expect(() => layerMask([2, 1], 6)).toThrow(/not ascending distinct indices of a 6-layer model/);
    expect(() => layerMask([6], 6)).toThrow(/6-layer model/);
  });
});

describe("group chunks", () => {
  // Gemma 2's alternation, 4 layers: sliding, global, sliding, global.
  const layers = [0, 1, 2, 3].map((i) => (i % 2 === 0 ? slidingLayer(8, 64) : slidingLayer(64, 64)));
  const groups = layerGroups(layers);

  it("each group's chunks hold its layers, named by mask, with its window", () => {
    expect(groupChunksOf(groups)).toEqual([
      { group: 0, mask: "1,3", held: 2, window: null },
      { group: 1, mask: "0,2", held: 2, window: 8 },
    ]);
  });

  it("group g > 0 tags every chain hash and every parent below the root; group 0 is the plain chain", () => {
    const chain = prefixChain(
      Array.from({ length: 100 }, (_, i) => i),
      32,
    );
    expect(groupChain(chain, 0)).toEqual(chain);
    const one = groupChain(chain, 1);
    expect(one.map((n) => n.hash)).toEqual(chain.map((n) => groupHash(n.hash, 1)));
    expect(one[0]!.parent).toBe(chain[0]!.parent);
    expect(one.slice(1).map((n) => n.parent)).toEqual(one.slice(0, -1).map((n) => n.hash));
    expect(one.map((n) => [n.start, n.count])).toEqual(chain.map((n) => [n.start, n.count]));
  });
});
