import { describe, expect, it } from "vitest";
import { KafkaLog } from "../../../catalog/kafka/log.ts";
import { bytes, kafkaBrokers, uniqueTopics, within } from "../log-helpers.ts";
import { echo, rawAdmin } from "./helpers.ts";

/**
 * KafkaLog (catalog/kafka/log.ts) composing the parts; the CatalogLog
 * contract itself is test/catalog/log-contract.test.ts, run on both logs.
 */

describe("KafkaLog.open (real broker)", () => {
  it("a bad batch bound is refused before anything is created", async () => {
    const topics = uniqueTopics();
    await expect(
      KafkaLog.open({
        brokers: kafkaBrokers(),
        clientId: "log-test",
        topics,
        writerTx: { maxRecords: -1, maxBytes: 1 << 20 },
      }),
    ).rejects.toThrow(/writerTx\.maxRecords must be a positive integer, got -1/);
    const a = rawAdmin();
    await a.connect();
    try {
      expect(await a.listTopics()).not.toContain(topics.proposals);
    } finally {
      await a.disconnect();
    }
  });

  it("refuses an empty broker list", async () => {
    await expect(
      KafkaLog.open({ brokers: [], clientId: "log-test", topics: uniqueTopics() }),
    ).rejects.toThrow(/no brokers configured/);
  });
});

describe("KafkaLog.close (real broker)", () => {
  it("stops every subscription and writer lease it handed out, those stopped by their holders too, and refuses use afterwards", async () => {
    const log = await KafkaLog.open({
      brokers: kafkaBrokers(),
      clientId: "log-test",
      topics: uniqueTopics(),
    });
    await log.propose(bytes("p0"));
    const lease = await log.acquireWriter();
    const running = lease.run(echo);
    await within(60_000, "the lease's first commit", async () => (await log.endOffset()) >= 1);
    let delivered = 0;
    const kept = await log.subscribe(0, async (rs) => {
      delivered += rs.length;
    });
    const stoppedEarly = await log.subscribe(0, async () => undefined);
    await stoppedEarly.stop();
    await stoppedEarly.stop(); // idempotent
    await within(60_000, "the subscription's first record", () => delivered >= 1);
    await log.close();
    // The lease stopped (its run resolves), the subscription ended (stop()'s resolution, not a failure).
    await running;
    await kept.ended;
    await stoppedEarly.ended;
    await expect(log.propose(bytes("late"))).rejects.toThrow(/closed/);
    await expect(log.subscribe(0, async () => undefined)).rejects.toThrow(/closed/);
    await expect(log.acquireWriter()).rejects.toThrow(/closed/);
    await log.close(); // idempotent
  }, 120_000);
});
