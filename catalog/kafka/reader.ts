import { randomUUID } from "node:crypto";
import type { Consumer, EachBatchPayload, Kafka } from "kafkajs";
import { type Backoff, backoffMs } from "../../schema/retry.ts";
import { CatalogLogError, type LogRecord, type Subscription } from "../log.ts";
import { logicalOffset, TX_BATCH, txItems, view } from "./records.ts";

/** Records handed to one subscriber callback (default). */
export const DEFAULT_MAX_BATCH = 2000;

export interface FollowOptions {
  /** Prefix of the reader's private consumer group id. */
  readonly clientId: string;
  readonly topic: string;
  /** Whether records are packed tx batches (catalog.tx) or one message each (catalog.rejections). */
  readonly packed: boolean;
  /** First logical offset to hand out. */
  readonly fromOffset: number;
  /** Partition offset of a record at or before `fromOffset` (a replica's snapshot knows it). */
  readonly position?: number;
  /** Records per onBatch call at most. */
  readonly maxBatch: number;
  readonly onBatch: (records: readonly LogRecord[]) => Promise<void>;
}

/**
 * Reads a writer-stamped topic from logical offset `fromOffset` with a
 * private consumer group that never commits. Invariant: records are handed
 * out densely (next, next+1, …); a gap means the topic was written by
 * something else and is reported, not skipped.
 */
export async function followTopic(kafka: Kafka, o: FollowOptions): Promise<Subscription> {
  const { topic, packed, maxBatch, onBatch } = o;
  const groupId = `${o.clientId}.reader.${randomUUID()}`;
  let next = o.fromOffset;
  // catalog.tx records are packed (at most TX_BATCH.maxItems txs each), so the record holding logical
  // offset N is preceded by at least ⌊N / maxItems⌋ records and sits at partition offset ≥ that:
  // a safe place to start reading, skipping what is below N. Rejections are one per record, and each
  // record takes a partition offset of its own, so partition offset ≥ logical offset there.
  // That start can be far behind on a log of sparse records (one tx each: it reads about
  // N − N/maxItems records to skip them), so a caller that knows the position of a record at or
  // before N (a replica's snapshot does) passes it, and reading starts there.
  // Partition offset to read from at a (re)join: the start above, then one past the last record handed out.
  let kafkaNext = o.position ?? (packed ? Math.floor(o.fromOffset / TX_BATCH.maxItems) : o.fromOffset);
  // A reader nobody tells of its end would leave its caller waiting for records forever: `ended`
  // rejects when delivery stops for good (a gap, onBatch threw, READER_RESTARTS used up).
  let end: { resolve: () => void; reject: (e: Error) => void } = { resolve: () => {}, reject: () => {} };
  const ended = new Promise<void>((resolve, reject) => {
    end = { resolve, reject };
  });
  ended.catch(() => undefined);
  let stopped = false;
  /** Consecutive replacements without a successful join. */
  let restarts = 0;
  let timer: NodeJS.Timeout | undefined;

  const eachBatch = async ({ batch, heartbeat, isRunning, isStale }: EachBatchPayload) => {
    const records: LogRecord[] = [];
    let lastKafka = "";
    for (const m of batch.messages) {
      const first = logicalOffset(m.headers, topic, m.offset);
      lastKafka = m.offset;
      const value = view(m.value);
      const items = packed ? txItems(value, topic, m.offset) : [value];
      for (let j = 0; j < items.length; j++) {
        const offset = first + j;
        if (offset < next) continue;
        if (offset !== next + records.length) {
          throw new CatalogLogError(
            `${topic}@${m.offset}: logical offset ${offset}, expected ${next + records.length}`,
          );
        }
        records.push({ offset, bytes: items[j]!, position: Number(m.offset) });
      }
    }
    for (let i = 0; i < records.length; i += maxBatch) {
      if (!isRunning() || isStale()) return;
      const part = records.slice(i, i + maxBatch);
      await onBatch(part);
      next = part[part.length - 1]!.offset + 1;
      await heartbeat();
    }
    if (lastKafka !== "") kafkaNext = Math.max(kafkaNext, Number(lastKafka) + 1);
  };

  const start = async (): Promise<Consumer> => {
    const c = kafka.consumer({
      groupId,
      readUncommitted: false,
      maxBytesPerPartition: 8 << 20,
      maxWaitTimeInMs: 100,
      // kafkajs's default (5 retries), except that a failure of our own (a gap, onBatch threw) is not
      // restarted: kafkajs would replay the same records into the same failure forever.
      retry: { retries: 5, restartOnFailure: async (err: Error) => !ownFailure(err) },
    });
    c.on(c.events.CRASH, ({ payload }) => {
      if (!payload.restart) replace(c, payload.error);
    });
    c.on(c.events.GROUP_JOIN, () => {
      restarts = 0;
      c.seek({ topic, partition: 0, offset: String(kafkaNext) });
    });
    await c.connect();
    await c.subscribe({ topic, fromBeginning: true });
    await c.run({ autoCommit: false, eachBatch });
    return c;
  };

  // kafkajs gives a consumer up for good on some transport errors (KafkaJSGroupCoordinatorNotFound
  // right after a broker restart): a fresh consumer of the same private group resumes at kafkaNext.
  const replace = (dead: Consumer | undefined, err: Error): void => {
    if (stopped) return;
    if ((dead !== undefined && ownFailure(err)) || restarts >= READER_RESTARTS) {
      end.reject(new CatalogLogError(`${topic} reader stopped: ${err.message}`));
      return;
    }
    restarts++;
    timer = setTimeout(
      () => {
        timer = undefined;
        if (stopped) return;
        start().then(
          async (c) => {
            if (stopped) await c.disconnect().catch(() => undefined);
            else consumer = c;
          },
          (e: Error) => replace(undefined, e),
        );
      },
      backoffMs(READER_BACKOFF, restarts),
    );
  };

  let consumer = await start();
  return {
    ended,
    stop: async () => {
      stopped = true;
      clearTimeout(timer);
      await consumer.disconnect();
      end.resolve();
    },
  };
}

/** Replacements of a reader's consumer in a row without a join, and the wait before each: about 5 minutes in all. */
const READER_RESTARTS = 60;
const READER_BACKOFF: Backoff = { baseMs: 100, capMs: 5_000 };

/** Whether a consumer crash comes from this reader's eachBatch (its root cause is not a kafkajs error). */
function ownFailure(err: Error): boolean {
  let e: Error = err;
  while ((e as { cause?: Error }).cause instanceof Error) e = (e as { cause?: Error }).cause!;
  return !e.name.startsWith("KafkaJS");
}
