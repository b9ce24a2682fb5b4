import { describe, expect, it } from "vitest";
import { prefixChain } from "../../../schema/identity.ts";
import type { ModelFingerprint } from "../../../schema/ids.ts";
import { ContentId } from "../../../schema/ids.ts";
import { captureDecision } from "../../../worker/checkpoint/admission.ts";
import {
  describeChunk,
  KvGeometry,
  packChunk,
  unpackChunk,
} from "../../../worker/checkpoint/chunk-format.ts";
import { fetchPeerBytes, fetchPeerChunk, PeerUnavailableError } from "../../../worker/peer/client.ts";
import { PeerServer, parseRange } from "../../../worker/peer/server.ts";
import { VerifiedChunk } from "../../../worker/store/chunk.ts";

const g = new KvGeometry(3, 2, 4, 4);

/**
 * Page-major bytes for rows [0, pages·P) where every fp16 element encodes
 * (layer, k|v, row, element) — so any misplaced copy shows.
 */
function pagesOf(P: number, pages: number): Uint8Array {
  const out = new Uint8Array(pages * g.pageBytes(P));
  const v = new DataView(out.buffer);
  for (let p = 0; p < pages; p++)
    for (let l = 0; l < g.nLayers; l++)
      for (const kv of [0, 1])
        for (let o = 0; o < P; o++) {
          const row = p * P + o;
          const rowBytes = kv === 0 ? g.kRow : g.vRow;
          const base =
            p * g.pageBytes(P) + l * P * (g.kRow + g.vRow) + (kv === 0 ? 0 : P * g.kRow) + o * rowBytes;
          for (let e = 0; e < rowBytes / 2; e++)
            v.setUint16(base + 2 * e, ((l * 2 + kv) * 4096 + row * 8 + e) & 0xffff, true);
        }
  return out;
}

describe("chunk format", () => {
  it("the same rows pack to the same bytes whatever the page size (page size never changes identity)", () => {
    const a = packChunk(g, { bytes: pagesOf(16, 10), firstPageRow: 0, pageTokens: 16 }, 37, 100);
    const b = packChunk(g, { bytes: pagesOf(32, 5), firstPageRow: 0, pageTokens: 32 }, 37, 100);
    const c = packChunk(g, { bytes: pagesOf(24, 7), firstPageRow: 0, pageTokens: 24 }, 37, 100);
    expect(Buffer.from(a).equals(Buffer.from(b))).toBe(true);
    expect(Buffer.from(a).equals(Buffer.from(c))).toBe(true);
    const fp = "ab".repeat(32) as ModelFingerprint;
    const node = prefixChain(
      Array.from({ length: 137 }, (_, i) => i),
      100,
    )[0]!;
    expect(describeChunk(fp, "kv", "0,1,2", node, a).id).toBe(describeChunk(fp, "kv", "0,1,2", node, b).id);
  });

  it("chunks unpacked into pages (starting and ending mid-page) rebuild exactly the source pages", () => {
    for (const P of [16, 20, 32]) {
      const src = pagesOf(P, Math.ceil(390 / P));
      const dst = new Uint8Array(src.byteLength);
      for (const start of [0, 130, 260]) {
        const chunk = packChunk(g, { bytes: src, firstPageRow: 0, pageTokens: P }, start, 130);
        unpackChunk(g, chunk, start, 130, { bytes: dst, firstPageRow: 0, pageTokens: P }, start, 130);
      }
      // Rows past 390 in the last page were never written; everything before matches.
      const rows = 390;
      for (let p = 0; p * P < rows; p++) {
        for (let l = 0; l < g.nLayers; l++) {
          const n = Math.min(P, rows - p * P);
          const k = p * g.pageBytes(P) + l * P * (g.kRow + g.vRow);
          expect(
            Buffer.from(dst.subarray(k, k + n * g.kRow)).equals(Buffer.from(src.subarray(k, k + n * g.kRow))),
          ).toBe(true);
          const v = k + P * g.kRow;
          expect(
            Buffer.from(dst.subarray(v, v + n * g.vRow)).equals(Buffer.from(src.subarray(v, v + n * g.vRow))),
          ).toBe(true);
        }
      }
    }
  });

  it("a partial unpack touches only its rows", () => {
    const src = pagesOf(16, 2);
    const chunk = packChunk(g, { bytes: src, firstPageRow: 0, pageTokens: 16 }, 0, 32);
    const dst = new Uint8Array(src.byteLength).fill(0xee);
    unpackChunk(g, chunk, 0, 32, { bytes: dst, firstPageRow: 0, pageTokens: 16 }, 10, 4);
    const k0 = 0;
    expect(dst[k0 + 9 * g.kRow]).toBe(0xee);
    expect(
      Buffer.from(dst.subarray(10 * g.kRow, 14 * g.kRow)).equals(
        Buffer.from(src.subarray(10 * g.kRow, 14 * g.kRow)),
      ),
    ).toBe(true);
    expect(dst[14 * g.kRow]).toBe(0xee);
  });

  it("bad geometry or ranges are refused with the reason", () => {
    expect(() => packChunk(g, { bytes: pagesOf(16, 2), firstPageRow: 0, pageTokens: 16 }, 20, 20)).toThrow(
      /outside the span/,
    );
    expect(() => packChunk(g, { bytes: pagesOf(16, 2), firstPageRow: 8, pageTokens: 16 }, 8, 4)).toThrow(
      /page boundary/,
    );
    expect(() =>
      unpackChunk(
        g,
        new Uint8Array(3),
        0,
        4,
        { bytes: pagesOf(16, 1), firstPageRow: 0, pageTokens: 16 },
        0,
        4,
      ),
    ).toThrow(/expected/);
    expect(() => new KvGeometry(0, 1, 1, 1)).toThrow(/nLayers/);
  });
});

describe("checkpoint admission", () => {
  const costs = { prefillPerTokenMs: 0.1, capturePerByteMs: 1e-6, restorePerByteMs: 1e-6 };
  it("captures when expected reuse saves more than the capture costs", () => {
    const d = captureDecision({ tokens: 256, bytes: 256 * 12288, hits: 0 }, costs);
    expect(d.capture).toBe(true);
    expect(d.reuseProbability).toBe(0.5);
  });
  it("skips when capture and restore cost more than recompute", () => {
    expect(
      captureDecision({ tokens: 256, bytes: 256 * 12288, hits: 0 }, { ...costs, capturePerByteMs: 1e-3 })
        .capture,
    ).toBe(false);
    expect(
      captureDecision({ tokens: 256, bytes: 256 * 12288, hits: 0 }, { ...costs, restorePerByteMs: 1e-3 })
        .capture,
    ).toBe(false);
  });
  it("reuse raises the value", () => {
    const a = captureDecision({ tokens: 256, bytes: 1e6, hits: 0 }, costs);
    const b = captureDecision({ tokens: 256, bytes: 1e6, hits: 3 }, costs);
    expect(b.expectedValueMs).toBeGreaterThan(a.expectedValueMs);
    expect(() => captureDecision({ tokens: 1, bytes: 1, hits: -1 }, costs)).toThrow(/hits/);
  });
});

describe("peer server over a real socket", () => {
  it("serves verified chunks to holders of the secret, whole or by range; refuses others", async () => {
    const payload = new Uint8Array(5000).map((_, i) => i & 0xff);
    const meta = { format: "test", n: 1 };
    const { contentId } = await import("../../../schema/identity.ts");
    const id = contentId(payload, meta);
    const chunk = VerifiedChunk.check(id, payload, meta, { tier: "store", maxObjectBytes: 1 << 20 });
    const server = await PeerServer.start({
      host: "127.0.0.1",
      port: 0,
      secret: "s3cret",
      chunks: { get: async (want) => (want === id ? chunk : undefined) },
    });
    try {
      const got = await fetchPeerChunk(server.address, id, { secret: "s3cret" });
      expect(Buffer.from(got!.bytes).equals(Buffer.from(payload))).toBe(true);
      expect(got!.meta).toEqual(meta);
      await expect(fetchPeerChunk(server.address, id, { secret: "wrong" })).rejects.toThrow(
        PeerUnavailableError,
      );
      await expect(fetchPeerChunk(server.address, id, { secret: "wrong" })).rejects.toThrow(/401/);
      const other = ContentId("cd".repeat(32));
      expect(await fetchPeerChunk(server.address, other, { secret: "s3cret" })).toBeUndefined();
      const whole = (await fetchPeerBytes(server.address, id, { secret: "s3cret" }))!;
      const part = await fetchPeerBytes(server.address, id, { secret: "s3cret", range: [100, 1099] });
      expect(part!.byteLength).toBe(1000);
      expect(Buffer.from(part!).equals(Buffer.from(whole.subarray(100, 1100)))).toBe(true);
      await expect(
        fetchPeerBytes(server.address, id, { secret: "s3cret", range: [99_999, 100_000] }),
      ).rejects.toThrow(/416/);
      // The readiness probe needs no secret and says nothing but whether the worker is warm.
      expect((await fetch(`http://${server.address}/ready`)).status).toBe(503);
      server.markReady();
      const ready = await fetch(`http://${server.address}/ready`);
      expect([ready.status, await ready.text()]).toEqual([200, "ready\n"]);
    } finally {
      await server.close();
    }
  });

  it("parses ranges", () => {
    expect(parseRange(undefined, 10)).toBeUndefined();
    expect(parseRange("bytes=2-4", 10)).toEqual([2, 4]);
    expect(parseRange("bytes=5-", 10)).toEqual([5, 9]);
    expect(parseRange("bytes=-3", 10)).toEqual([7, 9]);
    expect(parseRange("bytes=8-100", 10)).toEqual([8, 9]);
    expect(parseRange("bytes=10-11", 10)).toBe("bad");
    expect(parseRange("items=1-2", 10)).toBe("bad");
  });
});
