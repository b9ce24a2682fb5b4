import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import type { KafkaTopics } from "../../../catalog/kafka/admin.ts";
import { KafkaLog, type KafkaLogOptions } from "../../../catalog/kafka/log.ts";
import { TX_BATCH, unpack } from "../../../catalog/kafka/records.ts";
import type { LogRecord, WriterCommit } from "../../../catalog/log.ts";
import { bytes, kafkaBrokers, text, until } from "../log-helpers.ts";

/** Helpers of the Kafka log's suites: raw topic reads with kafkajs, and an echo writer. */

/** Deterministic sizes (a 32-bit LCG) so a failure reproduces. */
export function sizes(n: number, seed: number, max: number): number[] {
  let x = seed >>> 0;
  return Array.from({ length: n }, () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return 1 + (x % max);
  });
}

/** A bare kafkajs admin client on the test broker. */
export function rawAdmin() {
  return new Kafka({ clientId: "kafka-test", brokers: kafkaBrokers(), logLevel: logLevel.NOTHING }).admin();
}

/** Committed records of `topic` from its start (a read_committed consumer), with partition offsets and values, until `enough` holds. */
export async function committedRecords(
  topic: string,
  enough: (records: ReadonlyArray<{ offset: number; value: Buffer }>) => boolean,
): Promise<Array<{ offset: number; value: Buffer }>> {
  const kafka = new Kafka({ clientId: "kafka-test", brokers: kafkaBrokers(), logLevel: logLevel.NOTHING });
  const consumer = kafka.consumer({ groupId: `kafka-test.${randomUUID()}`, readUncommitted: false });
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
export function echo(proposals: readonly LogRecord[]): WriterCommit {
  return { tx: proposals.map((p) => bytes(`tx:${text(p.bytes)}`)), rejections: [] };
}

/** Txs a packed catalog.tx record carries (0 for a record that is not a tx batch). */
export function txCount(r: { value: Buffer }): number {
  return unpack(TX_BATCH, r.value)?.length ?? 0;
}

/**
 * Proposes "p0" … "p{n-1}", runs a writer lease with `echo` until all n txs
 * are committed, stops it, and returns the committed catalog.tx records.
 */
export async function echoThroughWriter(
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

/** Opens a Kafka log on the test broker; `cleanups` closes it after the suite. */
export async function openLog(
  cleanups: Array<() => Promise<void>>,
  topics: KafkaTopics,
  extra: Partial<KafkaLogOptions> = {},
): Promise<KafkaLog> {
  const log = await KafkaLog.open({ brokers: kafkaBrokers(), clientId: "kafka-test", topics, ...extra });
  cleanups.push(() => log.close());
  return log;
}
