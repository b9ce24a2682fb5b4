import { mkdtemp, readdir, readFile, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  CorruptChunkError,
  FileFullError,
  InvalidChunkError,
  ObjectTooLargeError,
} from "../../../worker/store/errors.ts";
import { FileTier } from "../../../worker/store/file.ts";
import { chunkOf, collect, recorder } from "./fixtures.ts";

/** Every file under dir, relative, sorted: "the store is unchanged" means this list is. */
async function tree(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (e.isFile()) out.push(join(e.parentPath, e.name).slice(dir.length + 1));
  }
  return out.sort();
}

describe("file tier", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "continuum-file-"));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  /** What one chunk takes in the files, frames included, measured in a scratch tier. */
  async function storedBytes(c: ReturnType<typeof chunkOf>): Promise<number> {
    const probe = await FileTier.open({
      dir: join(dir, "probe"),
      maxObjectBytes: 1 << 20,
      maxBytes: 1 << 30,
    });
    await probe.put(c.id, c.bytes, c.meta);
    const bytes = probe.stats().bytes!;
    await probe.close();
    return bytes;
  }

  // syncReadMaxBytes 0: every read takes the async paths (one read, or pieces read ahead while hashing).
  it.each([
    ["blocking reads for small objects", 1 << 20],
    ["async reads only", 0],
  ])(
    "round-trips objects of many sizes byte-exact, in sharded directories, with no temp files left (%s)",
    async (_, syncReadMaxBytes) => {
      const tier = await FileTier.open({
        dir,
        maxObjectBytes: 64 << 20,
        maxBytes: 1 << 30,
        readPieceBytes: 1 << 20,
        syncReadMaxBytes,
      });
      const sizes = [0, 1, 1023, 256 << 10, (3 << 20) + 17];
      const chunks = sizes.map((n) => chunkOf(n, `size-${n}`));
      for (const c of chunks) await tier.put(c.id, c.bytes, c.meta);
      for (const c of chunks) {
        const got = await tier.get(c.id);
        expect(got!.bytes.byteLength).toBe(c.bytes.byteLength);
        expect(Buffer.from(got!.bytes).equals(Buffer.from(c.bytes))).toBe(true);
        expect(got!.meta).toEqual(c.meta);
      }
      const files = await tree(dir);
      expect(files).toEqual(
        chunks.map((c) => `objects/${c.id.slice(0, 2)}/${c.id.slice(2, 4)}/${c.id}`).sort(),
      );
      expect(tier.stats()).toMatchObject({ objects: 5, hits: 5 });
      await tier.close();
    },
  );

  it("readInto fills a reused staging buffer with verified bytes, and refuses one that is too small", async () => {
    const tier = await FileTier.open({
      dir,
      maxObjectBytes: 64 << 20,
      maxBytes: 1 << 30,
      readPieceBytes: 1 << 20,
      report: () => {},
    });
    const staging = Buffer.alloc(5 << 20, 0xee);
    for (const n of [0, 100, 70_000, (4 << 20) + 3]) {
      const c = chunkOf(n, `into-${n}`);
      await tier.put(c.id, c.bytes, c.meta);
      const got = await tier.readInto(c.id, staging);
      expect(got).toEqual({ meta: c.meta, bytes: n });
      expect(staging.subarray(0, n).equals(Buffer.from(c.bytes))).toBe(true);
    }
    const big = chunkOf(6 << 20, "into-big");
    await tier.put(big.id, big.bytes, big.meta);
    await expect(tier.readInto(big.id, staging)).rejects.toThrow(
      /destination of 5242880 bytes is smaller than its 6291456/,
    );
    expect(await tier.has(big.id)).toBe(true); // a caller's mistake is not corruption
    expect(await tier.readInto(chunkOf(1, "absent").id, staging)).toBeUndefined();
    const raw = await readFile(tier.pathOf(big.id));
    raw[raw.length - 1]! ^= 1;
    await writeFile(tier.pathOf(big.id), raw);
    const dest = Buffer.alloc(6 << 20);
    await expect(tier.readInto(big.id, dest)).rejects.toThrow(CorruptChunkError);
    await tier.close();
  });

  it("counts what is on disk when reopened; list, has and delete agree", async () => {
    const a = chunkOf(5000, "a");
    const b = chunkOf(7000, "b");
    const t1 = await FileTier.open({ dir, maxObjectBytes: 1 << 20, maxBytes: 1 << 30 });
    await t1.put(a.id, a.bytes, a.meta);
    await t1.put(b.id, b.bytes, b.meta);
    await t1.put(b.id, b.bytes, b.meta); // idempotent
    const stored = t1.stats().bytes;
    await t1.close();
    const t2 = await FileTier.open({ dir, maxObjectBytes: 1 << 20, maxBytes: 1 << 30 });
    expect(t2.stats()).toMatchObject({ objects: 2, bytes: stored });
    expect((await collect(t2.list())).map((i) => i.id).sort()).toEqual([a.id, b.id].sort());
    expect(await t2.delete(a.id)).toBe(true);
    expect(await t2.has(a.id)).toBe(false);
    expect(await t2.get(a.id)).toBeUndefined();
    expect(t2.stats().objects).toBe(1);
    await t2.close();
  });

  it("refuses a put past store.dir.maxBytes, changing nothing, and takes it once a delete makes room", async () => {
    const a = chunkOf(4000, "a");
    const b = chunkOf(4000, "b");
    const one = await storedBytes(a);

    const tier = await FileTier.open({
      dir: join(dir, "t"),
      maxObjectBytes: 1 << 20,
      maxBytes: one + one / 2,
    });
    expect(tier.stats().capacityBytes).toBe(one + one / 2);
    await tier.put(a.id, a.bytes, a.meta);
    await tier.put(a.id, a.bytes, a.meta); // already held: costs nothing, so not refused
    const before = await tree(join(dir, "t"));
    const refused = tier.put(b.id, b.bytes, b.meta);
    await expect(refused).rejects.toThrow(FileFullError);
    await expect(refused).rejects.toThrow(/store\.dir\.maxBytes/);
    expect(await tree(join(dir, "t"))).toEqual(before);
    expect(tier.stats()).toMatchObject({ objects: 1, bytes: one });
    expect(await tier.delete(a.id)).toBe(true);
    await tier.put(b.id, b.bytes, b.meta);
    expect(tier.stats()).toMatchObject({ objects: 1, bytes: one });
    await tier.close();
  });

  it("counts writes in flight against the bound: of two concurrent puts that fit only one at a time, one is refused", async () => {
    const a = chunkOf(4000, "a");
    const b = chunkOf(4000, "b");
    const one = await storedBytes(a);
    const tier = await FileTier.open({ dir: join(dir, "t"), maxObjectBytes: 1 << 20, maxBytes: one + 10 });
    const results = await Promise.allSettled([
      tier.put(a.id, a.bytes, a.meta),
      tier.put(b.id, b.bytes, b.meta),
    ]);
    expect(results.map((r) => r.status).sort()).toEqual(["fulfilled", "rejected"]);
    const failed = results.find((r) => r.status === "rejected") as PromiseRejectedResult;
    expect(failed.reason).toBeInstanceOf(FileFullError);
    expect(tier.stats()).toMatchObject({ objects: 1, bytes: one });
    await tier.close();
  });

  it("opened over files that already pass the bound, refuses every put until deletes make room", async () => {
    const a = chunkOf(4000, "a");
    const b = chunkOf(4000, "b");
    const c = chunkOf(100, "c");
    const t1 = await FileTier.open({ dir, maxObjectBytes: 1 << 20, maxBytes: 1 << 30 });
    await t1.put(a.id, a.bytes, a.meta);
    await t1.put(b.id, b.bytes, b.meta);
    const one = t1.stats().bytes! / 2;
    await t1.close();
    const t2 = await FileTier.open({ dir, maxObjectBytes: 1 << 20, maxBytes: one });
    expect(t2.stats().bytes).toBe(2 * one);
    await expect(t2.put(c.id, c.bytes, c.meta)).rejects.toThrow(FileFullError);
    expect((await t2.get(a.id))!.bytes.byteLength).toBe(4000); // still serves reads
    expect(await t2.delete(a.id)).toBe(true);
    await expect(t2.put(c.id, c.bytes, c.meta)).rejects.toThrow(FileFullError); // one object held: at the bound
    expect(await t2.delete(b.id)).toBe(true);
    await t2.put(c.id, c.bytes, c.meta);
    await t2.close();
    await expect(FileTier.open({ dir, maxObjectBytes: 1 << 20, maxBytes: 0 })).rejects.toThrow(/maxBytes/);
  });

  it("refuses bad input with a clear error and leaves the directory unchanged", async () => {
    const tier = await FileTier.open({ dir, maxObjectBytes: 10_000, maxBytes: 1 << 30 });
    const ok = chunkOf(100, "ok");
    await tier.put(ok.id, ok.bytes, ok.meta);
    const before = await tree(dir);
    const c = chunkOf(100, "c");
    await expect(tier.put("../../etc/passwd", c.bytes, c.meta)).rejects.toThrow(InvalidChunkError);
    await expect(tier.put(c.id, chunkOf(100, "d").bytes, c.meta)).rejects.toThrow(/hash to content id/);
    const big = chunkOf(10_001, "big");
    await expect(tier.put(big.id, big.bytes, big.meta)).rejects.toThrow(ObjectTooLargeError);
    await expect(tier.get("0".repeat(63))).rejects.toThrow(InvalidChunkError);
    expect(await tree(dir)).toEqual(before);
    expect(tier.stats().objects).toBe(1);
    await tier.close();
  });

  it.each([
    ["small, blocking read", 4000, 1 << 20],
    ["large, pieces read ahead", 3 << 20, 0],
  ])(
    "detects a flipped byte and a truncated file, reports them, quarantines and never returns them (%s)",
    async (_, size, syncReadMaxBytes) => {
      const { events, report } = recorder();
      const tier = await FileTier.open({
        dir,
        maxObjectBytes: 4 << 20,
        maxBytes: 1 << 30,
        readPieceBytes: 1 << 20,
        syncReadMaxBytes,
        report,
      });
      const a = chunkOf(size, "flip");
      const b = chunkOf(size, "trunc");
      await tier.put(a.id, a.bytes, a.meta);
      await tier.put(b.id, b.bytes, b.meta);
      const pa = tier.pathOf(a.id);
      const raw = await readFile(pa);
      raw[raw.length - 100]! ^= 0x01;
      await writeFile(pa, raw);
      await truncate(tier.pathOf(b.id), size / 2);

      await expect(tier.get(a.id)).rejects.toThrow(/content hashes to/);
      await expect(tier.get(b.id)).rejects.toThrow(/truncated/);
      expect(events.map((e) => [e.kind, "id" in e ? e.id : ""])).toEqual([
        ["corrupt", a.id],
        ["corrupt", b.id],
      ]);
      // Quarantined: the id reads as absent, the bad copy is kept for inspection, a put restores it.
      expect(await tier.get(a.id)).toBeUndefined();
      expect((await readdir(join(dir, "corrupt"))).sort()).toEqual([a.id, b.id].sort());
      expect(tier.stats()).toMatchObject({ objects: 0, corrupt: 2 });
      await tier.put(a.id, a.bytes, a.meta);
      expect(Buffer.from((await tier.get(a.id))!.bytes).equals(Buffer.from(a.bytes))).toBe(true);
      await tier.close();
    },
  );

  it("a corrupt header (garbage under the id) is caught before any hashing", async () => {
    const tier = await FileTier.open({ dir, maxObjectBytes: 1 << 20, maxBytes: 1 << 30, report: () => {} });
    const a = chunkOf(100, "garbage");
    await tier.put(a.id, a.bytes, a.meta);
    await writeFile(tier.pathOf(a.id), Buffer.from("this is not a chunk at all"));
    const err = await tier.get(a.id).catch((e) => e);
    expect(err).toBeInstanceOf(CorruptChunkError);
    expect(err.message).toMatch(/bad magic/);
    await tier.close();
  });

  it("removes stale temp files at open and keeps fresh ones", async () => {
    const t1 = await FileTier.open({ dir, maxObjectBytes: 1 << 20, maxBytes: 1 << 30 });
    await t1.close();
    const stale = join(dir, "tmp", "x.1.0.tmp");
    const fresh = join(dir, "tmp", "y.1.0.tmp");
    await writeFile(stale, "partial");
    await writeFile(fresh, "partial");
    const { utimes } = await import("node:fs/promises");
    const old = new Date(Date.now() - 3_600_000);
    await utimes(stale, old, old);
    const t2 = await FileTier.open({ dir, maxObjectBytes: 1 << 20, maxBytes: 1 << 30 });
    expect(await readdir(join(dir, "tmp"))).toEqual(["y.1.0.tmp"]);
    expect(t2.stats().objects).toBe(0);
    await t2.close();
  });
});
