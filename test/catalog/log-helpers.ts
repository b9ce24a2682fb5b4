import { randomUUID } from "node:crypto";
import { CatalogDb } from "../../catalog/db.ts";
import type { KafkaTopics } from "../../catalog/kafka/admin.ts";
import type { FullCatalogLog, LogRecord, RejectionReader, TxLogReader } from "../../catalog/log.ts";
import { CatalogWriter } from "../../catalog/writer.ts";
import type { Proposal } from "../../schema/catalog.ts";
import { silentLogger } from "../../schema/log.ts";

/** The broker the global setup started (or the one CONTINUUM_KAFKA_BROKERS names). */
export function kafkaBrokers(): string[] {
  const b = process.env.CONTINUUM_KAFKA_BROKERS;
  if (!b) throw new Error("CONTINUUM_KAFKA_BROKERS is not set: test/setup/kafka.ts did not start a broker");
  return b.split(",");
}

/** Fresh topic names so suites sharing one broker never see each other's records. */
export function uniqueTopics(): KafkaTopics {
  const id = randomUUID().slice(0, 8);
  return {
    proposals: `test.${id}.proposals`,
    tx: `test.${id}.tx`,
    rejections: `test.${id}.rejections`,
  };
}

/** Reads `count` records from `from` through a subscription, then stops it. */
export async function collect(
  log: TxLogReader,
  from: number,
  count: number,
  which: "tx" | "rejections" = "tx",
): Promise<LogRecord[]> {
  const out: LogRecord[] = [];
  let done: () => void = () => undefined;
  const enough = new Promise<void>((r) => {
    done = r;
  });
  const onBatch = async (records: readonly LogRecord[]) => {
    out.push(...records);
    if (out.length >= count) done();
  };
  const sub =
    which === "tx"
      ? await log.subscribe(from, onBatch)
      : await (log as unknown as RejectionReader).subscribeRejections(from, onBatch);
  // A reader that stops delivering (a gap, a transport that gave up) fails the wait instead of hanging it.
  if (count > 0)
    await Promise.race([enough, sub.ended.then(() => Promise.reject(new Error("subscription ended")))]);
  await sub.stop();
  return out;
}

/** Polls `cond` every 20 ms until it holds (the test's timeout bounds it). */
export async function until(cond: () => boolean | Promise<boolean>): Promise<void> {
  while (!(await cond())) await new Promise((r) => setTimeout(r, 20));
}

/**
 * Polls `cond` every 20 ms until it holds; after `ms` fails naming `what` it waited for, with
 * `explain()` (e.g. the processes' last log lines) in the message, so a wait that never ends
 * says where it stopped instead of running into the test's timeout.
 */
export async function within(
  ms: number,
  what: string,
  cond: () => boolean | Promise<boolean>,
  explain: () => string = () => "",
): Promise<void> {
  const deadline = performance.now() + ms;
  while (!(await cond())) {
    if (performance.now() > deadline) throw new Error(`waited ${ms} ms for ${what}\n${explain()}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export const bytes = (s: string): Uint8Array => new TextEncoder().encode(s);
export const text = (b: Uint8Array): string => new TextDecoder().decode(b);

/** A valid proposal: acquire lease `key` for `holder` at epoch 1. */
export function leaseProposal(id: string, key: string, holder = "h1"): Proposal {
  return {
    id,
    clientId: "test-client",
    ops: [{ op: "lease.acquire", key, holder, epoch: 1, ttlMs: 60_000 }],
  };
}

/** A catalog writer running on `log`; `stop` ends it and waits for its loop. */
export function startWriter(log: FullCatalogLog): {
  writer: CatalogWriter<CatalogDb>;
  stop(): Promise<void>;
} {
  const writer = new CatalogWriter({ log, newDb: () => CatalogDb.empty(), logger: silentLogger });
  const running = writer.run();
  return {
    writer,
    stop: async () => {
      await writer.stop();
      await running;
    },
  };
}
