import { describe, expect, it } from "vitest";
import {
  CorruptChunkError,
  InvalidChunkError,
  ObjectTooLargeError,
  RamFullError,
  StoreClosedError,
} from "../../../worker/store/errors.ts";
import { RamTier } from "../../../worker/store/ram.ts";
import { chunkOf, collect, recorder } from "./fixtures.ts";

describe("RAM tier", () => {
  it("round-trips bytes and metadata, verified", async () => {
    const ram = new RamTier({ maxBytes: 1 << 20 });
    const c = chunkOf(4096, "a");
    await ram.put(c.id, c.bytes, c.meta);
    const got = await ram.get(c.id);
    expect(Buffer.from(got!.bytes).equals(Buffer.from(c.bytes))).toBe(true);
    expect(got!.meta).toEqual(c.meta);
    expect(await ram.has(c.id)).toBe(true);
    expect(await ram.get(chunkOf(1, "missing").id)).toBeUndefined();
  });

  it("keeps private copies: neither the put buffer nor a returned buffer can change what it holds", async () => {
    const ram = new RamTier({ maxBytes: 1 << 20 });
    const c = chunkOf(1024, "copy");
    const mine = Buffer.from(c.bytes);
    await ram.put(c.id, mine, c.meta);
    mine.fill(0);
    const got = await ram.get(c.id);
    got!.bytes.fill(1);
    const again = await ram.get(c.id);
    expect(Buffer.from(again!.bytes).equals(Buffer.from(c.bytes))).toBe(true);
  });

  it("evicts least recently used first and never holds more than maxBytes", async () => {
    const ram = new RamTier({ maxBytes: 3000 });
    const [a, b, c, d] = ["a", "b", "c", "d"].map((s) => chunkOf(1000, s));
    for (const x of [a!, b!, c!]) await ram.put(x.id, x.bytes, x.meta);
    await ram.get(a!.id); // a is now most recent; b is least recent
    await ram.put(d!.id, d!.bytes, d!.meta);
    expect(await ram.has(b!.id)).toBe(false);
    for (const x of [a!, c!, d!]) expect(await ram.has(x.id)).toBe(true);
    const s = ram.stats();
    expect(s.bytes).toBe(3000);
    expect(s.objects).toBe(3);
    expect(s.evictions).toBe(1);
    expect((await collect(ram.list())).map((i) => i.id).sort()).toEqual([a!.id, c!.id, d!.id].sort());
  });

  it("never evicts a pinned entry; a put that would need its room fails, and unpinning lets it go", async () => {
    const ram = new RamTier({ maxBytes: 3000 });
    const [a, b, c, d] = ["a", "b", "c", "d"].map((s) => chunkOf(1000, s));
    for (const x of [a!, b!]) await ram.put(x.id, x.bytes, x.meta);
    expect(ram.pin(a!.id)).toBe(true);
    expect(ram.pin(chunkOf(1, "absent").id)).toBe(false);
    await ram.put(c!.id, c!.bytes, c!.meta);
    await ram.put(d!.id, d!.bytes, d!.meta); // evicts b, the least recent unpinned; a stays
    expect(await ram.has(a!.id)).toBe(true);
    expect(await ram.has(b!.id)).toBe(false);
    ram.pin(c!.id);
    ram.pin(d!.id);
    const e = chunkOf(1000, "e");
    await expect(ram.put(e.id, e.bytes, e.meta)).rejects.toThrow(RamFullError);
    expect(ram.stats().bytes).toBe(3000);
    await ram.get(a!.id);
    expect(ram.pinStats()).toEqual({ entries: 3, bytes: 3000, hits: 1 });
    ram.unpin(a!.id);
    await ram.put(e.id, e.bytes, e.meta);
    expect(await ram.has(a!.id)).toBe(false);
    expect(ram.pinStats().bytes).toBe(2000);
    // Deleting a pinned entry releases its pin.
    await ram.delete(c!.id);
    expect(ram.pinStats()).toMatchObject({ entries: 1, bytes: 1000 });
  });

  it("refuses an object larger than the tier, leaving it unchanged", async () => {
    const ram = new RamTier({ maxBytes: 1000 });
    const small = chunkOf(500, "s");
    await ram.put(small.id, small.bytes, small.meta);
    const big = chunkOf(1001, "big");
    await expect(ram.put(big.id, big.bytes, big.meta)).rejects.toThrow(ObjectTooLargeError);
    expect(ram.stats().objects).toBe(1);
    expect(await ram.has(small.id)).toBe(true);
  });

  it("refuses bad input with a clear error and changes nothing", async () => {
    const ram = new RamTier({ maxBytes: 1 << 20 });
    const c = chunkOf(100, "x");
    await expect(ram.put("nope", c.bytes, c.meta)).rejects.toThrow(InvalidChunkError);
    await expect(ram.put(chunkOf(100, "y").id, c.bytes, c.meta)).rejects.toThrow(/hash to content id/);
    await expect(ram.get("zz")).rejects.toThrow(/content id must be 64 lowercase hex/);
    expect(ram.stats()).toMatchObject({ objects: 0, bytes: 0 });
  });

  it("detects scribbled memory, reports it, drops the entry and never returns the bytes", async () => {
    const { events, report } = recorder();
    const ram = new RamTier({ maxBytes: 1 << 20, report });
    const c = chunkOf(2048, "scribble");
    await ram.put(c.id, c.bytes, c.meta);
    ram.heldBytesForTest(c.id)![7]! ^= 0x40;
    await expect(ram.get(c.id)).rejects.toThrow(CorruptChunkError);
    expect(events).toEqual([expect.objectContaining({ kind: "corrupt", tier: "ram", id: c.id })]);
    expect(await ram.has(c.id)).toBe(false);
    expect(ram.stats()).toMatchObject({ corrupt: 1, objects: 0, bytes: 0 });
  });

  it("delete and close", async () => {
    const ram = new RamTier({ maxBytes: 1 << 20 });
    const c = chunkOf(10, "d");
    await ram.put(c.id, c.bytes, c.meta);
    expect(await ram.delete(c.id)).toBe(true);
    expect(await ram.delete(c.id)).toBe(false);
    await ram.close();
    await expect(ram.get(c.id)).rejects.toThrow(StoreClosedError);
  });
});
