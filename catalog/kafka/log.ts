import { type Admin, type Kafka, Partitioners } from "kafkajs";
import {
  CatalogLogError,
  checkOffset,
  type FullCatalogLog,
  type LogRecord,
  type SubscribeFrom,
  type WriterLease,
} from "../log.ts";
import { ensureTopics, type KafkaTopics } from "./admin.ts";
import { type KafkaLogLevel, kafkaClient } from "./client.ts";
import { type BatchLimits, checkBatchLimits } from "./grouping.ts";
import { DEFAULT_WRITER_TX, KafkaWriterLease } from "./lease.ts";
import { checkProposalSend, DEFAULT_PROPOSAL_SEND, ProposalBatcher } from "./proposer.ts";
import { DEFAULT_MAX_BATCH, followTopic } from "./reader.ts";
import { readWriterState, type WriterState } from "./writer-state.ts";

/**
 * The catalog log on Apache Kafka (kafkajs 2.2.4; broker pinned in
 * deploy/kafka/pom.xml).
 *
 * Topics (created explicitly by ensureTopics, one partition each, retention
 * unlimited): catalog.proposals, catalog.tx, catalog.rejections.
 *
 * Logical offsets. catalog.tx is written only inside Kafka transactions, so
 * its partition offsets have holes (commit/abort markers, aborted records).
 * Every record the writer appends carries a header `continuum-offset` with the
 * logical offset (decimal) of its first message: the n-th committed tx is n. Readers hand out
 * logical offsets; the embedded log and Kafka therefore agree on offsets, and
 * a snapshot at offset N means the same in both. A tx record holds up to
 * 512 txs and is stamped with its first tx's logical offset; each record
 * occupies its own partition offset, so the record holding logical N sits at
 * partition offset ≥ ⌊N / 512⌋, where a reader starting at N begins, skipping
 * what is below N. (Rejections are one per record: there partition offset ≥
 * logical offset and a reader seeks to N itself.)
 *
 * Exactly-once writer (see catalog/writer.ts for the loop):
 *   - one consumer group `<proposals>.writer` on the single-partition proposals
 *     topic; the member that owns partition 0 is the active writer, the others
 *     are standbys (a sticky assignor keeps the partition with its owner when
 *     a standby joins, so a join does not cause a takeover);
 *   - a transactional producer with a fixed transactional id
 *     (`<tx>.writer`), idempotent, one request in flight. Acquiring the lease
 *     initializes it, which bumps the producer epoch: the previous holder (a
 *     zombie that lost its group membership but still runs) is fenced, and its
 *     open transaction is aborted before we read any state;
 *   - per group of proposals (at most `writerTx` proposals and bytes, ending
 *     on a record boundary): begin → sendOffsets (proposals consumed, with
 *     metadata {"txEnd","rejEnd"}) → send packed tx records and rejections
 *     (one produce request up to 1 MiB) → commit: five round trips (AddOffsetsToTxn,
 *     TxnOffsetCommit, AddPartitionsToTxn, Produce, EndTxn), the coordinators'
 *     addresses cached (catalog/kafka/coordinators.ts). Groups are pipelined: the
 *     next group is decided (even fetched) while this one commits, and its commit starts
 *     only after this one succeeded; a failure loses the lease, and the
 *     writer discards its db (which may hold decided, uncommitted groups). The
 *     committed group offset and its metadata change atomically with the
 *     records, so after fencing the new holder reads both and resumes exactly
 *     where the last committed batch ended. endOffset() reads the same
 *     metadata (it may run ahead of visible records by one in-flight commit
 *     whose markers are being written; those records will arrive).
 *   - CONCURRENT_TRANSACTIONS (the coordinator still finishing the previous
 *     commit) is retried with bounded exponential backoff where kafkajs hands
 *     it up, and kafkajs's own retry of a send starts at 10 ms (not 100 ms).
 *
 * Proposals: a group commit (ProposalBatcher) sends what callers queued
 * within one event-loop turn, bounded by `proposalSend`, one request in
 * flight, each caller answered after the broker acknowledged (acks=all).
 *
 * Wire (catalog/WIRE.md, catalog/kafka/records.ts): proposals proposed
 * together travel as one packed record (`catalog.proposal.batch`), and the
 * writer's txs of one transaction as packed records of up to 512
 * (`catalog.tx.batch`); rejections stay one per record. kafkajs spends
 * ~25-35 µs per produced record here (an encoder with a zeroed 512-byte
 * buffer per record, varints, headers, copies, measured with --cpu-prof):
 * with one record per proposal and per tx that was about a third of each
 * publication's CPU in both the proposer and the writer. Packing cut the
 * CPU per publication from ~103 to ~43 µs (proposer + replica) and from
 * ~114 to ~60 µs (writer) in the bench. The lease unpacks proposal batches
 * (each proposal is handed to the writer on its own; a batch that does not
 * unpack is handed over whole and rejected), and readers unpack tx records,
 * so the CatalogLog contract is the same as the embedded log's.
 */

export interface KafkaLogOptions {
  readonly brokers: readonly string[];
  readonly clientId: string;
  readonly topics: KafkaTopics;
  /** Records per subscriber callback (default 2,000); also proposals per writer transaction when `writerTx` is not given. */
  readonly maxBatch?: number;
  /** Bounds of one proposal produce request (default DEFAULT_PROPOSAL_SEND). */
  readonly proposalSend?: BatchLimits;
  /** Bounds of one writer transaction (default DEFAULT_WRITER_TX). */
  readonly writerTx?: BatchLimits;
  /** Called after each proposal produce request the broker acknowledged: its proposal count and bytes (for tests and metrics). */
  readonly onProposalSend?: (proposals: number, bytes: number) => void;
  /** Writer group session timeout: how long a dead writer holds the lease (default 6,000 ms, the broker minimum). */
  readonly sessionTimeoutMs?: number;
  /** kafkajs log lines at or above this level go to stderr as JSON (default: errors). */
  readonly logLevel?: KafkaLogLevel;
}

export class KafkaLog implements FullCatalogLog {
  private readonly kafka: Kafka;
  private readonly admin: Admin;
  private proposer: { ready: Promise<void>; batcher: ProposalBatcher } | undefined;
  private readonly maxBatch: number;
  private readonly proposalSend: BatchLimits;
  private readonly writerTx: BatchLimits;
  private readonly closers = new Set<() => Promise<void>>();
  private closed = false;

  private constructor(private readonly opts: KafkaLogOptions) {
    this.kafka = kafkaClient(opts.brokers, opts.clientId, opts.logLevel);
    this.admin = this.kafka.admin();
    this.maxBatch = opts.maxBatch ?? DEFAULT_MAX_BATCH;
    this.proposalSend = checkProposalSend(opts.proposalSend ?? DEFAULT_PROPOSAL_SEND);
    // An explicit maxBatch without writerTx bounds writer transactions too (as it did before writerTx existed).
    this.writerTx = checkBatchLimits(
      "writerTx",
      opts.writerTx ??
        (opts.maxBatch !== undefined
          ? { maxRecords: opts.maxBatch, maxBytes: DEFAULT_WRITER_TX.maxBytes }
          : DEFAULT_WRITER_TX),
    );
  }

  /** Connects, and creates the topics if they are missing. */
  static async open(opts: KafkaLogOptions): Promise<KafkaLog> {
    if (opts.brokers.length === 0) throw new CatalogLogError("Kafka log: no brokers configured");
    if (opts.proposalSend) checkProposalSend(opts.proposalSend);
    if (opts.writerTx) checkBatchLimits("writerTx", opts.writerTx);
    await ensureTopics(opts.brokers, opts.topics);
    const log = new KafkaLog(opts);
    await log.admin.connect();
    return log;
  }

  private checkOpen(what: string): void {
    if (this.closed) throw new CatalogLogError(`${what}: the Kafka log is closed`);
  }

  async propose(bytes: Uint8Array): Promise<void> {
    this.checkOpen("propose");
    if (!(bytes instanceof Uint8Array)) throw new CatalogLogError("propose: bytes must be a Uint8Array");
    if (this.proposer === undefined) {
      const producer = this.kafka.producer({
        idempotent: true,
        maxInFlightRequests: 1,
        createPartitioner: Partitioners.DefaultPartitioner,
      });
      this.closers.add(() => producer.disconnect());
      const topic = this.opts.topics.proposals;
      this.proposer = {
        ready: producer.connect(),
        batcher: new ProposalBatcher(
          async (value) => {
            await producer.send({ topic, acks: -1, messages: [{ value }] });
          },
          this.proposalSend,
          this.opts.onProposalSend,
        ),
      };
    }
    await this.proposer.ready;
    await this.proposer.batcher.propose(bytes);
  }

  /** Writer progress as committed with the last writer transaction. */
  writerState(): Promise<WriterState> {
    return readWriterState(this.admin, this.opts.topics);
  }

  async endOffset(): Promise<number> {
    this.checkOpen("endOffset");
    return (await this.writerState()).txEnd;
  }

  subscribe(
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
    from?: SubscribeFrom,
  ): Promise<{ stop(): Promise<void> }> {
    return this.follow(this.opts.topics.tx, "subscribe", fromOffset, onBatch, from?.position);
  }

  subscribeRejections(
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
  ): Promise<{ stop(): Promise<void> }> {
    return this.follow(this.opts.topics.rejections, "subscribeRejections", fromOffset, onBatch);
  }

  private async follow(
    topic: string,
    what: string,
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
    position?: number,
  ): Promise<{ stop(): Promise<void> }> {
    this.checkOpen(what);
    checkOffset(what, fromOffset);
    if (position !== undefined) checkOffset(`${what} position`, position);
    const reader = await followTopic(this.kafka, {
      clientId: this.opts.clientId,
      topic,
      packed: topic === this.opts.topics.tx,
      fromOffset,
      position,
      maxBatch: this.maxBatch,
      onBatch,
    });
    const stop = async (): Promise<void> => {
      this.closers.delete(stop);
      await reader.stop();
    };
    this.closers.add(stop);
    return { stop };
  }

  async acquireWriter(signal?: AbortSignal): Promise<WriterLease> {
    this.checkOpen("acquireWriter");
    const lease = new KafkaWriterLease(this.kafka, {
      topics: this.opts.topics,
      sessionTimeoutMs: this.opts.sessionTimeoutMs,
      txLimits: this.writerTx,
      readState: () => this.writerState(),
    });
    this.closers.add(() => lease.stop());
    await lease.acquire(signal);
    return lease;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const c of [...this.closers]) await c().catch(() => undefined);
    this.closers.clear();
    await this.admin.disconnect();
  }
}
