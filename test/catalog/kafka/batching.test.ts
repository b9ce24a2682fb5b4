import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { afterAll, describe, expect, it } from "vitest";
import type { KafkaTopics } from "../../../catalog/kafka/admin.ts";
import {
  type BatchLimits,
  checkBatchLimits,
  groupUnits,
  nextGroupSize,
} from "../../../catalog/kafka/grouping.ts";
import { KafkaLog } from "../../../catalog/kafka/log.ts";
import { mayBePacked, PROPOSAL_BATCH, TX_BATCH, unpack } from "../../../catalog/kafka/records.ts";
import type { LogRecord, WriterCommit } from "../../../catalog/log.ts";
import { bytes, collect, kafkaBrokers, text, uniqueTopics, until } from "../log-helpers.ts";

/**
 * The bounds of the Kafka log's two batchers: the proposer's group commit
 * (proposals per produce request) and the writer's transactions (proposals
 * decided into one Kafka transaction, pipelined: group k+1 is decided while
 * k commits). Pure grouping logic first, then against the real broker.
 */

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
});

/** Deterministic sizes (a 32-bit LCG) so a failure reproduces. */
function sizes(n: number, seed: number, max: number): number[] {
  let x = seed >>> 0;
  return Array.from({ length: n }, () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return 1 + (x % max);
  });
}

describe("record grouping (pure)", () => {
  it("writer groups end on record boundaries, hold at most maxRecords proposals and maxBytes unless one record alone exceeds them, and concatenate to the input", () => {
    for (const [seed, limits] of [
      [1, { maxRecords: 7, maxBytes: 1_000 }],
      [2, { maxRecords: 1, maxBytes: 10 }],
      [3, { maxRecords: 500, maxBytes: 300 }],
      [4, { maxRecords: 3, maxBytes: 1 << 20 }],
    ] as const) {
      // Records of 1-3 proposals (a packed record is never split) of 1..400 bytes each.
      const counts = sizes(2_000, seed + 100, 3);
      const items = sizes(2_000, seed, 400).map((size, i) => ({
        i,
        items: Array.from({ length: counts[i]! }, () => new Uint8Array(size)),
      }));
      const groups = groupUnits(items, limits);
      for (const g of groups) {
        expect(g.length).toBeGreaterThanOrEqual(1);
        const proposals = g.reduce((s, t) => s + t.items.length, 0);
        const total = g.reduce((s, t) => s + t.items.reduce((b, x) => b + x.length, 0), 0);
        if (g.length > 1) {
          expect(proposals).toBeLessThanOrEqual(limits.maxRecords);
          expect(total).toBeLessThanOrEqual(limits.maxBytes);
        }
      }
      expect(groups.flat().map((t) => t.i)).toEqual(items.map((t) => t.i));
    }
  });

  it("fills a group as far as the bounds allow (greedy), and a record over maxBytes goes alone", () => {
    const limits: BatchLimits = { maxRecords: 4, maxBytes: 100 };
    expect(nextGroupSize([10, 10, 10, 10, 10], 0, limits)).toBe(4);
    expect(nextGroupSize([60, 40, 1], 0, limits)).toBe(2);
    expect(nextGroupSize([60, 41], 0, limits)).toBe(1);
    expect(nextGroupSize([500, 1], 0, limits)).toBe(1);
    expect(nextGroupSize([1, 500], 0, limits)).toBe(1);
    expect(nextGroupSize([1, 2, 3], 3, limits)).toBe(0);
  });

  it("refuses bounds that are not positive integers, naming the field", () => {
    expect(() => checkBatchLimits("writerTx", { maxRecords: 0, maxBytes: 1 })).toThrow(
      /writerTx\.maxRecords must be a positive integer, got 0/,
    );
    expect(() => checkBatchLimits("proposalSend", { maxRecords: 2, maxBytes: 1.5 })).toThrow(
      /proposalSend\.maxBytes must be a positive integer, got 1\.5/,
    );
  });
});

function admin() {
  return new Kafka({
    clientId: "batching-test",
    brokers: kafkaBrokers(),
    logLevel: logLevel.NOTHING,
  }).admin();
}

/** Committed records of `topic` from its start (a read_committed consumer), with partition offsets and values, until `enough` holds. */
async function committedRecords(
  topic: string,
  enough: (records: ReadonlyArray<{ offset: number; value: Buffer }>) => boolean,
): Promise<Array<{ offset: number; value: Buffer }>> {
  const kafka = new Kafka({ clientId: "batching-test", brokers: kafkaBrokers(), logLevel: logLevel.NOTHING });
  const consumer = kafka.consumer({ groupId: `batching-test.${randomUUID()}`, readUncommitted: false });
  const out: Array<{ offset: number; value: Buffer }> = [];
  await consumer.connect();
  try {
    await consumer.subscribe({ topic, fromBeginning: true });
    await consumer.run({
      eachBatch: async ({ batch }) => {
        for (const m of batch.messages)
          out.push({ offset: Number(m.offset), value: m.value ?? Buffer.alloc(0) });
      },
    });
    await until(() => enough(out));
  } finally {
    await consumer.disconnect();
  }
  return out;
}

/** Every proposal "x" becomes tx "tx:x". */
function echo(proposals: readonly LogRecord[]): WriterCommit {
  return { tx: proposals.map((p) => bytes(`tx:${text(p.bytes)}`)), rejections: [] };
}

/** Txs a packed catalog.tx record carries (0 for a record that is not a tx batch). */
function txCount(r: { value: Buffer }): number {
  return unpack(TX_BATCH, r.value)?.length ?? 0;
}

/**
 * Proposes "p0" … "p{n-1}", runs a writer lease with `echo` until all n txs
 * are committed, stops it, and returns the committed catalog.tx records.
 */
async function echoThroughWriter(
  log: KafkaLog,
  topics: KafkaTopics,
  n: number,
): Promise<Array<{ offset: number; value: Buffer }>> {
  await Promise.all(Array.from({ length: n }, (_, i) => log.propose(bytes(`p${i}`))));
  const lease = await log.acquireWriter();
  const running = lease.run(echo);
  await until(async () => (await log.endOffset()) >= n);
  await lease.stop();
  await running;
  return committedRecords(topics.tx, (rs) => rs.reduce((s, r) => s + txCount(r), 0) >= n);
}

async function open(topics: KafkaTopics, extra: Partial<Parameters<typeof KafkaLog.open>[0]> = {}) {
  const log = await KafkaLog.open({ brokers: kafkaBrokers(), clientId: "batching-test", topics, ...extra });
  cleanups.push(() => log.close());
  return log;
}

describe("Kafka log batching (real broker)", () => {
  it("a bad batch bound is refused before anything is created", async () => {
    const topics = uniqueTopics();
    await expect(
      KafkaLog.open({
        brokers: kafkaBrokers(),
        clientId: "batching-test",
        topics,
        writerTx: { maxRecords: -1, maxBytes: 1 << 20 },
      }),
    ).rejects.toThrow(/writerTx\.maxRecords must be a positive integer, got -1/);
    const a = admin();
    await a.connect();
    try {
      expect(await a.listTopics()).not.toContain(topics.proposals);
    } finally {
      await a.disconnect();
    }
  });

  it("proposer: one packed record per produce request within its bounds, and every acknowledged proposal is in the topic, in order", async () => {
    const topics = uniqueTopics();
    const limits = { maxRecords: 7, maxBytes: 1_500 };
    const sends: Array<{ proposals: number; bytes: number }> = [];
    const log = await open(topics, {
      proposalSend: limits,
      onProposalSend: (proposals, b) => sends.push({ proposals, bytes: b }),
    });
    const payloads = sizes(100, 7, 400).map((n, i) => `${i}:${"x".repeat(n)}`);
    payloads.push(`big:${"y".repeat(3_000)}`);
    await Promise.all(payloads.map((p) => log.propose(bytes(p))));
    expect(sends.reduce((s, x) => s + x.proposals, 0)).toBe(payloads.length);
    for (const s of sends) {
      expect(s.proposals).toBeLessThanOrEqual(limits.maxRecords);
      if (s.proposals > 1) expect(s.bytes).toBeLessThanOrEqual(limits.maxBytes);
    }
    // Proposed together, they are grouped: far fewer requests than proposals.
    expect(sends.length).toBeLessThan(payloads.length / 2);
    // One record per request: a lone proposal as it is, several packed in a catalog.proposal.batch.
    const records = await committedRecords(topics.proposals, (r) => r.length >= sends.length);
    expect(records).toHaveLength(sends.length);
    const items = records.map((r) =>
      mayBePacked(PROPOSAL_BATCH, r.value) ? unpack(PROPOSAL_BATCH, r.value)! : [r.value],
    );
    expect(items.map((i) => i.length)).toEqual(sends.map((s) => s.proposals));
    expect(records.filter((r) => r.value.includes("catalog.proposal.batch")).length).toBe(
      sends.filter((s) => s.proposals > 1).length,
    );
    expect(items.flat().map(text)).toEqual(payloads);
  });

  it("a proposal batch bound the batch record cannot hold is refused at open, naming it", async () => {
    await expect(
      KafkaLog.open({
        brokers: kafkaBrokers(),
        clientId: "batching-test",
        topics: uniqueTopics(),
        proposalSend: { maxRecords: PROPOSAL_BATCH.maxItems + 1, maxBytes: 1 << 20 },
      }),
    ).rejects.toThrow(/proposalSend: 4097 proposals .* do not fit one proposal batch/);
  });

  it("writer: no transaction holds more than writerTx.maxRecords proposals; txs are packed per transaction, dense, and each proposal appears once", async () => {
    const topics = uniqueTopics();
    // Proposal records of at most 2 proposals: a writer group ends on a record boundary, so 5 is reachable exactly as 2 + 2 + 1.
    const log = await open(topics, {
      writerTx: { maxRecords: 5, maxBytes: 1 << 20 },
      proposalSend: { maxRecords: 2, maxBytes: 1 << 20 },
    });
    const n = 63;
    const txRecords = await echoThroughWriter(log, topics, n);
    const records = await collect(log, 0, n);
    expect(records.map((r) => r.offset)).toEqual(Array.from({ length: n }, (_, i) => i));
    expect(records.map((r) => text(r.bytes))).toEqual(Array.from({ length: n }, (_, i) => `tx:p${i}`));
    // Each transaction's ≤ 5 txs fit one packed record: records are transactions here.
    const txns = txRecords.map(txCount);
    expect(txns.reduce((s, x) => s + x, 0)).toBe(n);
    for (const size of txns) expect(size).toBeLessThanOrEqual(5);
    expect(txns.length).toBeGreaterThanOrEqual(Math.ceil(n / 5));
  });

  it("reader: a subscription from any logical offset finds it inside packed tx records (records hold up to 512 txs, far fewer partition offsets than txs)", async () => {
    const topics = uniqueTopics();
    const log = await open(topics, { writerTx: { maxRecords: 4_000, maxBytes: 4 << 20 } });
    const n = 1_500;
    const txRecords = await echoThroughWriter(log, topics, n);
    // Packed: the last tx's record sits at a partition offset far below its logical offset.
    expect(txRecords[txRecords.length - 1]!.offset).toBeLessThan(n / 100);
    for (const from of [0, 511, 512, 513, 1_024, 1_200, n - 1]) {
      const got = await collect(log, from, n - from);
      expect(got.map((r) => r.offset)).toEqual(Array.from({ length: n - from }, (_, i) => from + i));
      expect(text(got[0]!.bytes)).toBe(`tx:p${from}`);
    }
  });

  it("writer: a handler failure while the previous transaction commits leaves only whole transactions; the next lease resumes after the last", async () => {
    const topics = uniqueTopics();
    const log = await open(topics, { writerTx: { maxRecords: 5, maxBytes: 1 << 20 } });
    const n = 40;
    for (let i = 0; i < n; i++) await log.propose(bytes(i === 23 ? "boom" : `p${i}`));
    const failing = await log.acquireWriter();
    await expect(
      failing.run((proposals) => {
        if (proposals.some((p) => text(p.bytes) === "boom")) throw new Error("writer crashed mid-pipeline");
        return echo(proposals);
      }),
    ).rejects.toThrow(/writer crashed mid-pipeline/);
    await failing.stop();
    const next = await log.acquireWriter();
    // Groups are [0,5), [5,10), …; the one holding offset 23 ([20,25)) never commits; the one before it may or may not have.
    expect([15, 20]).toContain(next.txEnd);
    expect(next.proposalsOffset).toBe(next.txEnd);
    const running = next.run(echo);
    await until(async () => (await log.endOffset()) >= n);
    await next.stop();
    await running;
    const records = await collect(log, 0, n);
    expect(records.map((r) => text(r.bytes))).toEqual(
      Array.from({ length: n }, (_, i) => (i === 23 ? "tx:boom" : `tx:p${i}`)),
    );
  });
});
