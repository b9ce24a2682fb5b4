import { afterAll, describe, expect, it } from "vitest";
import { bytes, collect, text, uniqueTopics, until, within } from "../log-helpers.ts";
import { committedRecords, echo, echoThroughWriter, openLog, txCount } from "./helpers.ts";

/**
 * The pipelined writer lease (catalog/kafka/lease.ts): proposals decided
 * into Kafka transactions of at most writerTx proposals, group k+1 decided
 * while k commits, each transaction whole or absent.
 */

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
});

describe("Kafka writer lease (real broker)", () => {
  it("no transaction holds more than writerTx.maxRecords proposals; txs are packed per transaction, dense, and each proposal appears once", async () => {
    const topics = uniqueTopics();
    // Proposal records of at most 2 proposals: a writer group ends on a record boundary, so 5 is reachable exactly as 2 + 2 + 1.
    const log = await openLog(cleanups, topics, {
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

  it("a handler failure while the previous transaction commits leaves only whole transactions; the next lease resumes after the last", async () => {
    const topics = uniqueTopics();
    const log = await openLog(cleanups, topics, { writerTx: { maxRecords: 5, maxBytes: 1 << 20 } });
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

  it("a new holder fences the old one before it reads where to resume: a stalled holder's late commit fails instead of landing beside the new holder's", async () => {
    const topics = uniqueTopics();
    // Two clients of one log, as two writer processes would be.
    const logA = await openLog(cleanups, topics);
    const logB = await openLog(cleanups, topics);
    const n = 10;
    for (let i = 0; i < n; i++) await logA.propose(bytes(`p${i}`));
    const a = await logA.acquireWriter();
    // A decides its first batch and stalls there (a frozen process): no heartbeat, so the group drops it.
    let release: () => void = () => undefined;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    let decided = false;
    const aRun = a.run(async (proposals) => {
      decided = true;
      await gate;
      return echo(proposals);
    });
    aRun.catch(() => undefined);
    await within(30_000, "A deciding its batch", () => decided);
    const b = await logB.acquireWriter();
    expect(b.txEnd).toBe(0);
    // A wakes up and commits the batch it decided: B has already read txEnd 0, so only the fence stands
    // between A's commit and B's commit of the same logical offsets.
    release();
    let aFailed = false;
    aRun.catch(() => {
      aFailed = true;
    });
    await within(60_000, "the stalled holder to lose its lease", () => aFailed);
    // stop() waits for the commit in flight: A's late commit was refused (fenced), not added.
    await a.stop();
    expect(a.commits).toBe(0);
    const bRun = b.run(echo);
    await within(60_000, `${n} txs`, async () => (await logB.endOffset()) >= n);
    await b.stop();
    await bRun;
    const records = await collect(logB, 0, n);
    expect(records.map((r) => text(r.bytes))).toEqual(Array.from({ length: n }, (_, i) => `tx:p${i}`));
    const committed = await committedRecords(topics.tx, (rs) => rs.reduce((s, r) => s + txCount(r), 0) >= n);
    expect(committed.reduce((s, r) => s + txCount(r), 0)).toBe(n);
  }, 120_000);

  it("a consumer crash while joining ends acquireWriter with its cause instead of a wait for the partition that never ends", async () => {
    // Below the broker's group.min.session.timeout.ms (6 s): JoinGroup is refused, the consumer crashes
    // (as it does on a freshly started broker whose group coordinator is still loading).
    const log = await openLog(cleanups, uniqueTopics(), { sessionTimeoutMs: 1_000 });
    const acquired = log.acquireWriter();
    const outcome = await Promise.race([
      acquired.then(
        () => "acquired",
        (err: Error) => err.message,
      ),
      new Promise<string>((r) => setTimeout(() => r("still waiting after 60 s"), 60_000)),
    ]);
    expect(outcome).toMatch(/writer lease lost: consumer crashed: .*session timeout/i);
  }, 90_000);
});
