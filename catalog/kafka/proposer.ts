import { type Kafka, Partitioners, type Producer } from "kafkajs";
import { CatalogLogError } from "../log.ts";
import { MAX_SEND_BYTES } from "./admin.ts";
import { type BatchLimits, checkBatchLimits, groupEnd } from "./grouping.ts";
import { PROPOSAL_BATCH, pack } from "./records.ts";

/**
 * Proposals per produce request, packed in one record (a
 * `catalog.proposal.batch`, catalog/kafka/records.ts): everything queued
 * within one event-loop turn (the linger) up to 2,000 proposals or 1 MiB,
 * whichever comes first. Must fit PROPOSAL_BATCH's bounds (checked at open).
 */
export const DEFAULT_PROPOSAL_SEND: BatchLimits = { maxRecords: 2_000, maxBytes: MAX_SEND_BYTES };

/** Bound of the proposal producer's queue (proposals waiting for a send slot). */
const MAX_PENDING_PROPOSALS = 20_000;

/** msgpack overhead of a packed record: the map with v and kind (< 64 bytes) plus a bin32 header (5 bytes) per item. */
const packedBytesBound = (l: BatchLimits): number => l.maxBytes + 5 * l.maxRecords + 64;

/** Checks that proposal groups of `l` always fit one proposal batch record. */
export function checkProposalSend(l: BatchLimits): BatchLimits {
  checkBatchLimits("proposalSend", l);
  if (l.maxRecords > PROPOSAL_BATCH.maxItems || packedBytesBound(l) > PROPOSAL_BATCH.maxBytes) {
    throw new CatalogLogError(
      `proposalSend: ${l.maxRecords} proposals / ${l.maxBytes} bytes do not fit one proposal batch (at most ${PROPOSAL_BATCH.maxItems} proposals and ${PROPOSAL_BATCH.maxBytes} bytes with framing)`,
    );
  }
  return l;
}

/**
 * Group commit for proposals: callers queue; one produce request at a time
 * (the idempotent producer allows one in flight) carries the queue's head —
 * at most `limits.maxRecords` proposals and `limits.maxBytes` bytes — with
 * acks=all, and answers each of its callers only once the broker acknowledged
 * that request (acknowledged = replicated to the in-sync replicas, never
 * lost). A send starts one event-loop turn after the first proposal of an
 * idle batcher (setImmediate: the linger), so a burst proposed together goes
 * in one request instead of one lone proposal followed by the rest.
 */
class ProposalBatcher {
  private queue: Array<{ value: Buffer; done: () => void; fail: (e: Error) => void }> = [];
  private sending = false;
  private readonly spaceFreed: Array<() => void> = [];

  constructor(
    /** Appends one record value (acks=all). */
    private readonly send: (value: Buffer) => Promise<void>,
    private readonly limits: BatchLimits,
    private readonly onSent?: (proposals: number, bytes: number) => void,
  ) {}

  async propose(bytes: Uint8Array): Promise<void> {
    while (this.queue.length >= MAX_PENDING_PROPOSALS) {
      await new Promise<void>((r) => this.spaceFreed.push(r));
    }
    return new Promise((done, fail) => {
      // A copy: the caller may reuse its buffer once propose() returns.
      this.queue.push({ value: Buffer.from(bytes), done, fail });
      if (!this.sending) {
        this.sending = true;
        setImmediate(() => void this.drain());
      }
    });
  }

  private async drain(): Promise<void> {
    while (this.queue.length > 0) {
      const q = this.queue;
      const n = groupEnd(q.length, 0, this.limits, (i) => q[i]!.value.length);
      let bytes = 0;
      for (let i = 0; i < n; i++) bytes += q[i]!.value.length;
      const taken = this.queue.splice(0, n);
      for (const w of this.spaceFreed.splice(0)) w();
      try {
        // One proposal goes as it is; several go packed in one record (the writer unpacks them).
        const value =
          n === 1
            ? taken[0]!.value
            : pack(
                PROPOSAL_BATCH,
                taken.map((m) => m.value),
              );
        await this.send(value);
        this.onSent?.(n, bytes);
        for (const m of taken) m.done();
      } catch (err) {
        for (const m of taken) m.fail(err as Error);
      }
    }
    this.sending = false;
  }
}

/**
 * The proposals producer: idempotent, one request in flight (so a retried
 * request cannot reorder), acks=all, fed by the batcher above.
 */
export class KafkaProposer {
  private readonly producer: Producer;
  private readonly ready: Promise<void>;
  private readonly batcher: ProposalBatcher;

  constructor(
    kafka: Kafka,
    topic: string,
    limits: BatchLimits,
    onSent?: (proposals: number, bytes: number) => void,
  ) {
    const producer = kafka.producer({
      idempotent: true,
      maxInFlightRequests: 1,
      createPartitioner: Partitioners.DefaultPartitioner,
    });
    this.producer = producer;
    this.ready = producer.connect();
    this.batcher = new ProposalBatcher(
      async (value) => {
        await producer.send({ topic, acks: -1, messages: [{ value }] });
      },
      limits,
      onSent,
    );
  }

  /** Resolves once the broker acknowledged the request that carried `bytes`. */
  async propose(bytes: Uint8Array): Promise<void> {
    await this.ready;
    await this.batcher.propose(bytes);
  }

  close(): Promise<void> {
    return this.producer.disconnect();
  }
}
