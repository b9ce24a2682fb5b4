import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import type { CatalogDb } from "../../catalog/db.ts";
import { KafkaLog } from "../../catalog/kafka/log.ts";
import type { CatalogLog, FullCatalogLog } from "../../catalog/log.ts";
import { EmbeddedLog } from "../../catalog/log-embedded.ts";
import { Replica, type TxReport } from "../../catalog/replica.ts";
import { DirSnapshotStore, snapshotOffset, snapshotPosition } from "../../catalog/snapshot.ts";
import type { CatalogWriter } from "../../catalog/writer.ts";
import { ProposalMsg, TxMsg } from "../../schema/catalog.ts";
import { encodeMessage } from "../../schema/wire.ts";
import { CatalogGen, fingerprintOf, LAYOUT } from "./gen.ts";
import { kafkaBrokers, startWriter as startLogWriter, uniqueTopics } from "./log-helpers.ts";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** Starts a writer on the log; stopped after the test. */
function startWriter(log: FullCatalogLog): CatalogWriter<CatalogDb> {
  const { writer, stop } = startLogWriter(log);
  cleanups.push(stop);
  return writer;
}

async function startReplica(opts: Parameters<typeof Replica.start>[0]): Promise<Replica> {
  const r = await Replica.start(opts);
  cleanups.push(() => r.stop());
  return r;
}

/**
 * Proposes `n` random proposals (after the setup one), then a sentinel that is
 * always accepted, and resolves with the sentinel's log offset once `replica`
 * has applied it: everything proposed before it has been decided by then.
 */
async function proposeAll(log: CatalogLog, replica: Replica, seed: number, n: number): Promise<number> {
  const gen = new CatalogGen(seed);
  const sentinel = `sentinel-${seed}`;
  const seen = new Promise<number>((resolve) => {
    const off = replica.listen((reports: readonly TxReport[]) => {
      for (const r of reports)
        if (r.tx.proposalId === sentinel) {
          off();
          resolve(r.offset);
        }
    });
  });
  const proposals = [gen.setup()];
  for (let i = 0; i < n; i++) proposals.push(gen.next());
  proposals.push({
    id: sentinel,
    clientId: "test",
    ops: [
      {
        op: "model.registered",
        fingerprint: fingerprintOf(1000 + seed),
        name: "sentinel",
        layout: LAYOUT,
        chunkTokens: 4,
      },
    ],
  });
  // Bounded concurrency: 500 proposals in flight at once.
  for (let i = 0; i < proposals.length; i += 500) {
    await Promise.all(proposals.slice(i, i + 500).map((p) => log.propose(encodeMessage(ProposalMsg, p))));
  }
  return seen;
}

describe("catalog replicas on the embedded log", () => {
  it("two replicas converge to the writer's dbHash after 10,000 random proposals", async () => {
    const log = await EmbeddedLog.open();
    cleanups.push(() => log.close());
    const writer = startWriter(log);
    const early = await startReplica({ log, datalog: "eager" });
    const last = await proposeAll(log, early, 1, 10_000);
    const late = await startReplica({ log });
    await late.waitFor(last + 1, 60_000);
    await early.waitFor(last + 1, 60_000);
    expect(early.offset()).toBe(last + 1);
    expect(late.offset()).toBe(last + 1);
    expect(late.dbHash()).toBe(early.dbHash());
    expect(writer.current!.dbHash()).toBe(early.dbHash());
    // The run exercised both outcomes: most proposals accepted, some rejected.
    expect(last).toBeGreaterThan(5_000);
    expect(last).toBeLessThan(10_001);
    expect(early.catalog.datomCount).toBeGreaterThan(20_000);
  });

  it("a replica started from a snapshot equals one replayed from 0, and skips a corrupted snapshot", async () => {
    const dir = await mkdtemp(join(tmpdir(), "continuum-snap-"));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const store = new DirSnapshotStore(dir);
    const log = await EmbeddedLog.open({ maxBatch: 100 });
    cleanups.push(() => log.close());
    startWriter(log);
    const snapshotter = await startReplica({ log, snapshots: store, snapshotEvery: 500 });
    const last = await proposeAll(log, snapshotter, 2, 3_000);
    await snapshotter.waitFor(last + 1);
    const keys = (await readdir(dir)).sort();
    expect(keys.length).toBeGreaterThanOrEqual(2);
    expect(keys.length).toBeLessThanOrEqual(3); // SNAPSHOTS_KEPT
    const newest = keys[keys.length - 1]!;

    const fromSnapshot = await startReplica({ log, snapshots: store });
    const fromZero = await startReplica({ log, snapshots: store, ignoreSnapshots: true });
    await fromSnapshot.waitFor(last + 1);
    await fromZero.waitFor(last + 1);
    expect(fromSnapshot.startOffset).toBe(snapshotOffset(newest));
    expect(fromSnapshot.startOffset).toBeGreaterThan(0);
    expect(fromZero.startOffset).toBe(0);
    expect(fromSnapshot.dbHash()).toBe(fromZero.dbHash());
    expect(fromSnapshot.dbHash()).toBe(snapshotter.dbHash());

    // Corrupt the newest: the next replica warns and starts from the one before.
    await writeFile(join(dir, newest), "garbage");
    const warnings: string[] = [];
    const fallback = await startReplica({ log, snapshots: store, warn: (m) => warnings.push(m) });
    await fallback.waitFor(last + 1);
    expect(fallback.startOffset).toBe(snapshotOffset(keys[keys.length - 2]!));
    expect(warnings.join("\n")).toMatch(/skipping catalog snapshot .* (truncated|checksum mismatch)/);
    expect(fallback.dbHash()).toBe(fromZero.dbHash());
  });

  it("stops at a tx that does not decode, and waitFor names why", async () => {
    const log = await EmbeddedLog.open();
    cleanups.push(() => log.close());
    const lease = await log.acquireWriter();
    const good = encodeMessage(TxMsg, { txNo: 1, proposalId: "p", clientId: "c", time: 1, datoms: [] });
    const running = lease.run(() => ({ tx: [good, new Uint8Array([0xc1])], rejections: [] }));
    await log.propose(new Uint8Array([1]));
    const replica = await startReplica({ log });
    await expect(replica.waitFor(2, 10_000)).rejects.toThrow(
      /replica stopped at offset 1: (malformed|unknown wire version|envelope)/,
    );
    expect(replica.offset()).toBe(1);
    await lease.stop();
    await running;
  });
});

const brokers = process.env.CONTINUUM_KAFKA_BROKERS;

describe.skipIf(!brokers)("catalog replicas on real Kafka", () => {
  it("two replicas converge to the same dbHash after 10,000 random proposals", async () => {
    const topics = uniqueTopics();
    const open = () => KafkaLog.open({ brokers: kafkaBrokers(), clientId: "replica-test", topics });
    const writerLog = await open();
    cleanups.push(() => writerLog.close());
    const writer = startWriter(writerLog);
    const logA = await open();
    cleanups.push(() => logA.close());
    const logB = await open();
    cleanups.push(() => logB.close());
    const a = await startReplica({ log: logA });
    const last = await proposeAll(logA, a, 3, 10_000);
    const b = await startReplica({ log: logB });
    await b.waitFor(last + 1, 120_000);
    expect(b.dbHash()).toBe(a.dbHash());
    expect(writer.current!.dbHash()).toBe(a.dbHash());
    expect(last).toBeGreaterThan(5_000);
  }, 240_000);

  it("a snapshot keeps the log position of its last tx, and a replica started from it reads from there", async () => {
    // One proposal at a time: each writer transaction carries one tx, so each
    // tx is its own record and logical offset N sits near partition offset 2N
    // (a commit marker follows each record), far past the ⌊N/512⌋ a reader
    // without a position would have to start from and skip forward.
    const log = await KafkaLog.open({
      brokers: kafkaBrokers(),
      clientId: "replica-pos",
      topics: uniqueTopics(),
    });
    cleanups.push(() => log.close());
    startWriter(log);
    const dir = await mkdtemp(join(tmpdir(), "continuum-snap-pos-"));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const store = new DirSnapshotStore(dir);
    const snapshotter = await startReplica({ log, snapshots: store, snapshotEvery: 40 });
    // 100 txs: snapshots at 40 and 80, then 20 txs only the log holds.
    const TXS = 100;
    for (let i = 0; i < TXS; i++) {
      const model = {
        op: "model.registered" as const,
        fingerprint: fingerprintOf(2000 + i),
        name: `m${i}`,
        layout: LAYOUT,
        chunkTokens: 4,
      };
      await log.propose(encodeMessage(ProposalMsg, { id: `pos-${i}`, clientId: "test", ops: [model] }));
      await snapshotter.waitFor(i + 1, 30_000);
    }
    // Waiters resolve before the replica writes its snapshot, so wait (bounded) for the one at 80
    // through the store's own listing, which leaves out a snapshot still being written.
    let newest: string | undefined;
    for (let i = 0; i < 200 && (newest === undefined || snapshotOffset(newest) !== 80); i++) {
      if (i > 0) await new Promise((r) => setTimeout(r, 50));
      newest = (await store.list()).at(-1);
    }
    const at = snapshotOffset(newest!)!;
    const position = snapshotPosition(newest!);
    expect(at).toBe(80);
    // Partition offsets count every record and commit marker: the record of tx `at - 1` sits past `at - 1`.
    expect(position).toBeGreaterThanOrEqual(at - 1);

    const applied: number[] = [];
    const fromSnapshot = await startReplica({ log, snapshots: store });
    fromSnapshot.listen((reports) => {
      for (const r of reports) applied.push(r.offset);
    });
    const fromZero = await startReplica({ log, snapshots: store, ignoreSnapshots: true });
    await fromSnapshot.waitFor(TXS, 30_000);
    await fromZero.waitFor(TXS, 30_000);
    expect(fromSnapshot.startOffset).toBe(at);
    expect(fromSnapshot.dbHash()).toBe(fromZero.dbHash());
    expect(fromSnapshot.dbHash()).toBe(snapshotter.dbHash());
    // It applied exactly the txs after the snapshot, densely.
    expect(applied).toEqual(Array.from({ length: TXS - at }, (_, k) => at + k));
  }, 120_000);
});
