import { describe, expect, it } from "vitest";
import { ensureTopics, waitForKafka } from "../../../catalog/kafka/admin.ts";
import { kafkaBrokers, uniqueTopics } from "../log-helpers.ts";
import { rawAdmin } from "./helpers.ts";

/** Topic admin (catalog/kafka/admin.ts) against the real broker. */

describe("catalog topics (real broker)", () => {
  it("creates the three topics with one partition and unlimited retention, and a second call changes nothing", async () => {
    const topics = uniqueTopics();
    await waitForKafka(kafkaBrokers(), 30_000);
    await ensureTopics(kafkaBrokers(), topics);
    await ensureTopics(kafkaBrokers(), topics);
    const a = rawAdmin();
    await a.connect();
    try {
      const names = [topics.proposals, topics.tx, topics.rejections];
      const meta = await a.fetchTopicMetadata({ topics: names });
      expect(meta.topics.map((t) => [t.name, t.partitions.length]).sort()).toEqual(
        names.map((n) => [n, 1]).sort(),
      );
      const configs = await a.describeConfigs({
        includeSynonyms: false,
        resources: [{ type: 2, name: topics.tx, configNames: ["retention.ms", "retention.bytes"] }],
      });
      const entries = Object.fromEntries(
        configs.resources[0]!.configEntries.map((e) => [e.configName, e.configValue]),
      );
      expect(entries).toEqual({ "retention.ms": "-1", "retention.bytes": "-1" });
    } finally {
      await a.disconnect();
    }
  });

  it("refuses an existing catalog topic with more than one partition, naming it", async () => {
    const topics = uniqueTopics();
    const a = rawAdmin();
    await a.connect();
    try {
      await a.createTopics({ waitForLeaders: true, topics: [{ topic: topics.tx, numPartitions: 2 }] });
    } finally {
      await a.disconnect();
    }
    await expect(ensureTopics(kafkaBrokers(), topics)).rejects.toThrow(
      new RegExp(`topic ${topics.tx.replaceAll(".", "\\.")} has 2 partitions; the catalog needs exactly 1`),
    );
  });

  it("waitForKafka gives up after its bound on an address nothing answers, not after the client's own retries", async () => {
    const t0 = performance.now();
    await expect(waitForKafka(["127.0.0.1:1"], 1_000)).rejects.toThrow(/not ready after 1000 ms/);
    // The client's default retries alone take ~40 s on a refused port; the bound is 1 s (slack for a loaded machine).
    expect(performance.now() - t0).toBeLessThan(10_000);
  });
});
