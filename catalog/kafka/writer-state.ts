import type { Admin } from "kafkajs";
import { CatalogLogError } from "../log.ts";
import { type KafkaTopics, writerGroupId } from "./admin.ts";

/**
 * The writer's progress, kept where Kafka commits it atomically with the
 * records: the writer group's offset on catalog.proposals (the first
 * proposal not yet committed) and that offset's metadata, `{"txEnd",
 * "rejEnd"}` (the logical ends of catalog.tx and catalog.rejections).
 */
export interface WriterState {
  readonly proposalsOffset: number;
  readonly txEnd: number;
  readonly rejEnd: number;
}

/** The metadata committed with the group offset at the end of a writer transaction. */
export function writerStateMetadata(txEnd: number, rejEnd: number): string {
  return JSON.stringify({ txEnd, rejEnd });
}

/** Writer progress as committed with the last writer transaction (all zero before the first). */
export async function readWriterState(admin: Admin, topics: KafkaTopics): Promise<WriterState> {
  const [topic] = await admin.fetchOffsets({
    groupId: writerGroupId(topics),
    topics: [topics.proposals],
  });
  const p = topic?.partitions.find((x) => x.partition === 0);
  const offset = p === undefined ? -1 : Number(p.offset);
  if (p === undefined || offset < 0) return { proposalsOffset: 0, txEnd: 0, rejEnd: 0 };
  let meta: { txEnd?: unknown; rejEnd?: unknown };
  try {
    meta = JSON.parse(p.metadata ?? "");
  } catch {
    throw new CatalogLogError(
      `group ${writerGroupId(topics)}: committed offset without writer metadata (was it committed by something other than the catalog writer?)`,
    );
  }
  const txEnd = Number(meta.txEnd);
  const rejEnd = Number(meta.rejEnd);
  if (!Number.isSafeInteger(txEnd) || !Number.isSafeInteger(rejEnd)) {
    throw new CatalogLogError(`group ${writerGroupId(topics)}: bad writer metadata ${p.metadata}`);
  }
  return { proposalsOffset: offset, txEnd, rejEnd };
}
