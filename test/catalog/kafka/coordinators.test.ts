import { randomUUID } from "node:crypto";
import { Kafka, logLevel, type Producer } from "kafkajs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureTopics } from "../../../catalog/kafka/admin.ts";
import { retryConcurrent } from "../../../catalog/kafka/client.ts";
import { producerWithCachedCoordinators } from "../../../catalog/kafka/coordinators.ts";
import { CatalogLogError } from "../../../catalog/log.ts";
import { kafkaBrokers, uniqueTopics } from "../log-helpers.ts";

/**
 * The writer's transactional producer remembers its coordinators
 * (catalog/kafka/coordinators.ts), counted on the wire against a real broker:
 * kafkajs names FindCoordinator requests "GroupCoordinator" in its request
 * events.
 */
describe("producerWithCachedCoordinators (real Kafka)", () => {
  const topics = uniqueTopics();
  const kafka = new Kafka({
    clientId: "coordinators-test",
    brokers: kafkaBrokers(),
    logLevel: logLevel.NOTHING,
  });
  const open: Producer[] = [];

  beforeAll(async () => {
    await ensureTopics(kafkaBrokers(), topics);
  }, 60_000);

  afterAll(async () => {
    await Promise.all(open.map((p) => p.disconnect().catch(() => undefined)));
  });

  const config = () => ({
    transactionalId: `coordinators-test-${randomUUID()}`,
    idempotent: true,
    maxInFlightRequests: 1,
  });

  /** Runs `n` writer-shaped transactions (offsets, a record, commit) and returns the FindCoordinator requests they made. */
  async function lookups(producer: Producer, n: number, pauseMs = 0): Promise<number> {
    open.push(producer);
    let count = 0;
    producer.on(producer.events.REQUEST, (e) => {
      if (e.payload.apiName === "GroupCoordinator") count++;
    });
    await producer.connect();
    const before = count;
    for (let i = 0; i < n; i++) {
      const txn = await producer.transaction();
      // Back to back, the first request meets CONCURRENT_TRANSACTIONS while the last commit's markers are written.
      await retryConcurrent(() =>
        txn.sendOffsets({
          consumerGroupId: `${topics.proposals}.coordinators-test`,
          topics: [{ topic: topics.proposals, partitions: [{ partition: 0, offset: String(i + 1) }] }],
        }),
      );
      await txn.send({ topic: topics.tx, acks: -1, messages: [{ value: `tx ${i}` }] });
      await txn.commit();
      if (pauseMs > 0) await new Promise((r) => setTimeout(r, pauseMs));
    }
    return count - before;
  }

  it("asks for each coordinator once per ttl instead of four times per transaction", async () => {
    const plain = await lookups(kafka.producer(config()), 5);
    const cached = await lookups(producerWithCachedCoordinators(kafka, config(), 60_000), 5);
    // kafkajs alone: transaction coordinator for AddOffsetsToTxn, AddPartitionsToTxn and EndTxn, group coordinator for TxnOffsetCommit.
    expect(plain).toBeGreaterThanOrEqual(5 * 4);
    // Cached: at most one lookup per coordinator (transaction, group) for the whole run.
    expect(cached).toBeLessThanOrEqual(2);
  }, 60_000);

  it("asks again once an entry is older than the ttl", async () => {
    const n = 3;
    const cached = await lookups(producerWithCachedCoordinators(kafka, config(), 5), n, 20);
    // Every transaction starts after its entries expired: both coordinators looked up again each time.
    expect(cached).toBeGreaterThanOrEqual(2 * n);
  }, 60_000);

  it("rejects a ttl that is not a positive number and builds no producer", () => {
    for (const bad of [0, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => producerWithCachedCoordinators(kafka, config(), bad)).toThrow(CatalogLogError);
      expect(() => producerWithCachedCoordinators(kafka, config(), bad)).toThrow(/ttlMs/);
    }
  });

  it("leaves the client's other producers uncached", async () => {
    producerWithCachedCoordinators(kafka, config(), 60_000);
    expect(await lookups(kafka.producer(config()), 2)).toBeGreaterThanOrEqual(2 * 4);
  }, 60_000);
});
