import { appendFile, mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { KafkaLog } from "../../catalog/kafka/log.ts";
import {
  CatalogLogError,
  type FullCatalogLog,
  type LogRecord,
  type WriterCommit,
} from "../../catalog/log.ts";
import { EmbeddedLog } from "../../catalog/log-embedded.ts";
import { bytes, collect, kafkaBrokers, text, uniqueTopics, until } from "./log-helpers.ts";

/**
 * The CatalogLog contract, run unchanged against the embedded log (memory and
 * file) and the Kafka log (real broker). Each test opens a fresh log (fresh
 * file, fresh topics).
 */

interface Impl {
  readonly name: string;
  /** A fresh, empty log and a way to open the same log again (a new process would). */
  fresh(): Promise<{ log: FullCatalogLog; reopen: () => Promise<FullCatalogLog>; inMemory?: boolean }>;
}

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

const impls: Impl[] = [
  {
    name: "embedded (memory)",
    async fresh() {
      // Memory only: "reopening" is using the same instance, which the test then does not close first.
      const log = await EmbeddedLog.open({ maxBatch: 7 });
      return { log, reopen: async () => log, inMemory: true };
    },
  },
  {
    name: "embedded (file)",
    async fresh() {
      const dir = await mkdtemp(join(tmpdir(), "continuum-log-"));
      dirs.push(dir);
      const path = join(dir, "catalog.log");
      return {
        log: await EmbeddedLog.open({ path, maxBatch: 7 }),
        reopen: () => EmbeddedLog.open({ path, maxBatch: 7 }),
      };
    },
  },
  {
    name: "kafka",
    async fresh() {
      const opts = { brokers: kafkaBrokers(), clientId: "contract", topics: uniqueTopics(), maxBatch: 7 };
      return { log: await KafkaLog.open(opts), reopen: () => KafkaLog.open(opts) };
    },
  },
];

/** A writer that turns proposal "x" into tx "tx:x", and proposal "bad:…" into a rejection. */
function echo(proposals: readonly LogRecord[]): WriterCommit {
  const tx: Uint8Array[] = [];
  const rejections: Uint8Array[] = [];
  for (const p of proposals) {
    const s = text(p.bytes);
    if (s.startsWith("bad:")) rejections.push(bytes(`rej:${s}`));
    else tx.push(bytes(`tx:${s}`));
  }
  return { tx, rejections };
}

/** Runs an echo writer on `log` until `txCount` tx records exist, then stops it. */
async function writeThrough(log: FullCatalogLog, txCount: number): Promise<void> {
  const lease = await log.acquireWriter();
  const running = lease.run(echo);
  await until(async () => (await log.endOffset()) >= txCount);
  await lease.stop();
  await running;
}

describe.each(impls)("CatalogLog contract: $name", (impl) => {
  it("numbers tx records densely from 0, in proposal order, and endOffset is one past the last", async () => {
    const { log } = await impl.fresh();
    try {
      expect(await log.endOffset()).toBe(0);
      const n = 50;
      await Promise.all(
        Array.from({ length: n }, (_, i) => log.propose(bytes(`p${String(i).padStart(3, "0")}`))),
      );
      await writeThrough(log, n);
      expect(await log.endOffset()).toBe(n);
      const got = await collect(log, 0, n);
      expect(got.map((r) => r.offset)).toEqual(Array.from({ length: n }, (_, i) => i));
      // Concurrent proposes may be acknowledged in any order, but every one appears exactly once.
      expect(got.map((r) => text(r.bytes)).sort()).toEqual(
        Array.from({ length: n }, (_, i) => `tx:p${String(i).padStart(3, "0")}`),
      );
    } finally {
      await log.close();
    }
  });

  it("preserves the order of sequential proposals and subscribes from any offset", async () => {
    const { log } = await impl.fresh();
    try {
      for (let i = 0; i < 20; i++) await log.propose(bytes(`s${i}`));
      await writeThrough(log, 20);
      const all = await collect(log, 0, 20);
      expect(all.map((r) => text(r.bytes))).toEqual(Array.from({ length: 20 }, (_, i) => `tx:s${i}`));
      const tail = await collect(log, 13, 7);
      expect(tail.map((r) => r.offset)).toEqual([13, 14, 15, 16, 17, 18, 19]);
      expect(tail.map((r) => text(r.bytes))).toEqual(all.slice(13).map((r) => text(r.bytes)));
    } finally {
      await log.close();
    }
  });

  it("delivers records appended after subscribing, and respects back-pressure (onBatch awaited)", async () => {
    const { log } = await impl.fresh();
    try {
      const seen: number[] = [];
      let inFlight = 0;
      let maxInFlight = 0;
      const sub = await log.subscribe(0, async (records) => {
        inFlight++;
        maxInFlight = Math.max(maxInFlight, inFlight);
        await new Promise((r) => setTimeout(r, 5));
        for (const r of records) seen.push(r.offset);
        inFlight--;
      });
      const lease = await log.acquireWriter();
      const running = lease.run(echo);
      for (let i = 0; i < 30; i++) await log.propose(bytes(`late${i}`));
      await until(() => seen.length >= 30);
      await sub.stop();
      await lease.stop();
      await running;
      expect(seen).toEqual(Array.from({ length: 30 }, (_, i) => i));
      expect(maxInFlight).toBe(1);
    } finally {
      await log.close();
    }
  });

  it("writes rejections to their own stream with dense offsets, atomically with the tx records", async () => {
    const { log } = await impl.fresh();
    try {
      for (const s of ["a", "bad:1", "b", "bad:2", "bad:3", "c"]) await log.propose(bytes(s));
      await writeThrough(log, 3);
      const rej = await collect(log, 0, 3, "rejections");
      expect(rej.map((r) => [r.offset, text(r.bytes)])).toEqual([
        [0, "rej:bad:1"],
        [1, "rej:bad:2"],
        [2, "rej:bad:3"],
      ]);
      expect((await collect(log, 0, 3)).map((r) => text(r.bytes))).toEqual(["tx:a", "tx:b", "tx:c"]);
    } finally {
      await log.close();
    }
  });

  it("a failed batch commits nothing; the next lease resumes from the same proposal", async () => {
    const { log } = await impl.fresh();
    try {
      for (const s of ["one", "two"]) await log.propose(bytes(s));
      await writeThrough(log, 2);
      await log.propose(bytes("three"));
      const failing = await log.acquireWriter();
      expect(failing.txEnd).toBe(2);
      expect(failing.proposalsOffset).toBe(2);
      await expect(
        failing.run(() => {
          throw new Error("writer crashed mid-batch");
        }),
      ).rejects.toThrow(/writer crashed mid-batch/);
      expect(await log.endOffset()).toBe(2);
      const next = await log.acquireWriter();
      expect(next.txEnd).toBe(2);
      expect(next.proposalsOffset).toBe(2);
      const running = next.run(echo);
      await until(async () => (await log.endOffset()) >= 3);
      await next.stop();
      await running;
      expect((await collect(log, 2, 1)).map((r) => text(r.bytes))).toEqual(["tx:three"]);
    } finally {
      await log.close();
    }
  });

  it("acknowledged proposals and committed records survive closing and reopening", async () => {
    const { log, reopen, inMemory } = await impl.fresh();
    for (let i = 0; i < 5; i++) await log.propose(bytes(`d${i}`));
    await writeThrough(log, 5);
    for (let i = 5; i < 8; i++) await log.propose(bytes(`d${i}`));
    if (!inMemory) await log.close();
    const again = await reopen();
    try {
      expect(await again.endOffset()).toBe(5);
      // The three proposals acknowledged after the last commit are still there for the next writer.
      const lease = await again.acquireWriter();
      expect(lease.proposalsOffset).toBe(5);
      const running = lease.run(echo);
      await until(async () => (await again.endOffset()) >= 8);
      await lease.stop();
      await running;
      expect((await collect(again, 0, 8)).map((r) => text(r.bytes))).toEqual(
        Array.from({ length: 8 }, (_, i) => `tx:d${i}`),
      );
    } finally {
      await again.close();
    }
  });

  it("refuses a negative or fractional start offset with a clear error", async () => {
    const { log } = await impl.fresh();
    try {
      await expect(log.subscribe(-1, async () => undefined)).rejects.toThrow(CatalogLogError);
      await expect(log.subscribe(1.5, async () => undefined)).rejects.toThrow(/non-negative integer/);
    } finally {
      await log.close();
    }
  });
});

describe("embedded file log recovery", () => {
  it("truncates a torn tail and keeps every complete frame", async () => {
    const dir = await mkdtemp(join(tmpdir(), "continuum-log-"));
    dirs.push(dir);
    const path = join(dir, "catalog.log");
    const log = await EmbeddedLog.open({ path });
    for (let i = 0; i < 4; i++) await log.propose(bytes(`t${i}`));
    await writeThrough(log, 4);
    await log.propose(bytes("after"));
    await log.close();
    const goodSize = (await stat(path)).size;
    // A crash mid-append: a frame header that promises 1,000 bytes, then only a few.
    const torn = Buffer.alloc(20);
    torn.writeUInt32LE(1000, 0);
    await appendFile(path, torn);
    const again = await EmbeddedLog.open({ path });
    try {
      expect((await stat(path)).size).toBe(goodSize);
      expect(await again.endOffset()).toBe(4);
      expect(again.proposalsEnd()).toBe(5);
      await again.propose(bytes("post-recovery"));
      expect(again.proposalsEnd()).toBe(6);
    } finally {
      await again.close();
    }
    const third = await EmbeddedLog.open({ path });
    expect(third.proposalsEnd()).toBe(6);
    await third.close();
  });

  it("detects a corrupted frame by its checksum and drops it and everything after", async () => {
    const dir = await mkdtemp(join(tmpdir(), "continuum-log-"));
    dirs.push(dir);
    const path = join(dir, "catalog.log");
    const log = await EmbeddedLog.open({ path });
    await log.propose(bytes("keep"));
    const sizeAfterFirst = (await stat(path)).size;
    await log.propose(bytes("flip"));
    await log.close();
    const { readFile, writeFile } = await import("node:fs/promises");
    const buf = await readFile(path);
    buf.writeUInt8(buf.readUInt8(buf.length - 1) ^ 0xff, buf.length - 1);
    await writeFile(path, buf);
    const again = await EmbeddedLog.open({ path });
    expect(again.proposalsEnd()).toBe(1);
    expect((await stat(path)).size).toBe(sizeAfterFirst);
    await again.close();
  });

  it("refuses a proposal over the size limit and leaves the log unchanged", async () => {
    const log = await EmbeddedLog.open({ maxProposalBytes: 16 });
    await expect(log.propose(new Uint8Array(17))).rejects.toThrow(/17 bytes exceeds the 16-byte limit/);
    expect(log.proposalsEnd()).toBe(0);
    await log.close();
  });
});
