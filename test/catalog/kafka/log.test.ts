import { describe, expect, it } from "vitest";
import { KafkaLog } from "../../../catalog/kafka/log.ts";
import { kafkaBrokers, uniqueTopics } from "../log-helpers.ts";
import { rawAdmin } from "./helpers.ts";

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
