import { sleep } from "../../schema/abort.ts";
import { CatalogLogError } from "../log.ts";
import { kafkaClient } from "./client.ts";

/**
 * Topic admin: the catalog's three topics, the names derived from them, and
 * the broker checks run before anything else (ready, topics present with one
 * partition each).
 */

export interface KafkaTopics {
  readonly proposals: string;
  readonly tx: string;
  readonly rejections: string;
}

export const writerGroupId = (t: KafkaTopics): string => `${t.proposals}.writer`;
export const writerTransactionalId = (t: KafkaTopics): string => `${t.tx}.writer`;

/** Bytes per produce request; below the topics' max.message.bytes. */
export const MAX_SEND_BYTES = 1 << 20;
/** Topic-level record batch limit (room for one wire message of 16 MiB plus framing). */
const TOPIC_MAX_MESSAGE_BYTES = 20 * 1024 * 1024;

/**
 * Polls the admin client until the cluster answers, within `timeoutMs`: each
 * probe makes one attempt (no client retries) bounded by the time left.
 */
export async function waitForKafka(brokers: readonly string[], timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    const left = Math.max(1, deadline - Date.now());
    const admin = kafkaClient(brokers, "continuum-ready", "nothing", {
      retries: 0,
      connectionTimeoutMs: Math.min(1_000, left),
      requestTimeoutMs: left,
    }).admin();
    try {
      await admin.connect();
      const cluster = await admin.describeCluster();
      if (cluster.brokers.length > 0 && cluster.controller !== null) return;
    } catch (err) {
      last = err;
    } finally {
      await admin.disconnect().catch(() => undefined);
    }
    await sleep(250);
  }
  throw new CatalogLogError(
    `Kafka at ${brokers.join(",")} not ready after ${timeoutMs} ms: ${(last as Error | undefined)?.message ?? "no answer"}`,
  );
}

/** Creates the three catalog topics if missing (one partition each, unlimited retention); checks existing ones have one partition. */
export async function ensureTopics(brokers: readonly string[], topics: KafkaTopics): Promise<void> {
  const admin = kafkaClient(brokers, "continuum-topics", "nothing").admin();
  await admin.connect();
  try {
    const names = [topics.proposals, topics.tx, topics.rejections];
    const existing = new Set(await admin.listTopics());
    const missing = names.filter((n) => !existing.has(n));
    if (missing.length > 0) {
      await admin.createTopics({
        waitForLeaders: true,
        topics: missing.map((topic) => ({
          topic,
          numPartitions: 1,
          replicationFactor: 1,
          configEntries: [
            { name: "retention.ms", value: "-1" },
            { name: "retention.bytes", value: "-1" },
            { name: "max.message.bytes", value: String(TOPIC_MAX_MESSAGE_BYTES) },
          ],
        })),
      });
    }
    const meta = await admin.fetchTopicMetadata({ topics: names });
    for (const t of meta.topics) {
      if (t.partitions.length !== 1) {
        throw new CatalogLogError(
          `topic ${t.name} has ${t.partitions.length} partitions; the catalog needs exactly 1`,
        );
      }
    }
  } finally {
    await admin.disconnect();
  }
}
