import { Cause, Effect, Exit, Scope } from "effect";
import type { Admin, Kafka } from "kafkajs";
import { resource } from "../../schema/scope.ts";
import {
  CatalogLogError,
  checkOffset,
  type FullCatalogLog,
  type LogRecord,
  type SubscribeFrom,
  type Subscription,
  type WriterLease,
} from "../log.ts";
import { ensureTopics, type KafkaTopics } from "./admin.ts";
import { type KafkaLogLevel, kafkaClient } from "./client.ts";
import { type BatchLimits, checkBatchLimits } from "./grouping.ts";
import { DEFAULT_WRITER_TX, KafkaWriterLease } from "./lease.ts";
import { checkProposalSend, DEFAULT_PROPOSAL_SEND, KafkaProposer } from "./proposer.ts";
import { DEFAULT_MAX_BATCH, followTopic } from "./reader.ts";
import { readWriterState, type WriterState } from "./writer-state.ts";

/**
 * The catalog log on Apache Kafka (kafkajs 2.2.4; broker pinned in
 * deploy/kafka/pom.xml): the CatalogLog contract of catalog/log.ts, the same
 * as the embedded log's, composed from the parts in this folder:
 *
 *   admin.ts          the three topics (one partition each, created
 *                     explicitly) and the names derived from them
 *   client.ts         the kafkajs client: TCP_NODELAY, bounded retries, log filter
 *   proposer.ts       proposals: a group commit, one produce request in
 *                     flight, each caller answered after acks=all
 *   records.ts        packed records (catalog/WIRE.md) and logical offsets
 *                     (the `continuum-offset` header)
 *   reader.ts         catalog.tx / catalog.rejections from a logical offset
 *   lease.ts          the exactly-once writer lease: fenced transactional
 *                     producer, pipelined transactions
 *   assignor.ts       keeps the proposals partition with the active writer
 *   coordinators.ts   the lease producer's coordinator cache
 *   writer-state.ts   the writer's progress, committed with its records
 *   grouping.ts       the one greedy rule that cuts records into groups
 *
 * Logical offsets: the n-th committed tx is offset n in Kafka as in the
 * embedded log, so a snapshot at offset N means the same in both.
 *
 * Resources (README, "Owning resources"): one Effect scope per log holds the
 * admin client (acquired at open), the proposer (at the first proposal) and a
 * child scope per subscription and per writer lease, each closed by its own
 * stop() or with the log. close() closes the scope: the newest first —
 * leases and readers, the proposer — and the admin client last. A reader's,
 * lease's or the proposer's failure to close is ignored (the rest still
 * close); the admin client's is thrown.
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
  /** Created on the first proposal: a log that only reads never connects a producer. */
  private proposer: KafkaProposer | undefined;
  private readonly maxBatch: number;
  private readonly proposalSend: BatchLimits;
  private readonly writerTx: BatchLimits;
  private readonly scope: Scope.Closeable = Scope.makeUnsafe();
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
    // The scope's first resource, so released last.
    const connected = await Effect.runPromiseExit(
      Scope.provide(log.scope)(
        resource(
          async () => {
            await log.admin.connect();
            return log.admin;
          },
          (admin) => admin.disconnect(),
        ),
      ),
    );
    if (Exit.isFailure(connected)) throw Cause.squash(connected.cause);
    return log;
  }

  /**
   * A child scope of the log's whose close runs `release`; returns its close, which throws what
   * `release` threw. Closing the log closes it too, and ignores that error.
   */
  private child(release: () => Promise<void>): () => Promise<void> {
    const scope = Scope.forkUnsafe(this.scope);
    let failed: { readonly error: unknown } | undefined;
    const finalizer = Effect.promise(() =>
      release().catch((error: unknown) => {
        failed = { error };
      }),
    );
    Effect.runSync(Scope.addFinalizer(scope, finalizer));
    return async () => {
      await Effect.runPromise(Scope.close(scope, Exit.void));
      if (failed !== undefined) throw failed.error;
    };
  }

  private checkOpen(what: string): void {
    if (this.closed) throw new CatalogLogError(`${what}: the Kafka log is closed`);
  }

  async propose(bytes: Uint8Array): Promise<void> {
    this.checkOpen("propose");
    if (!(bytes instanceof Uint8Array)) throw new CatalogLogError("propose: bytes must be a Uint8Array");
    if (this.proposer === undefined) {
      const proposer = new KafkaProposer(
        this.kafka,
        this.opts.topics.proposals,
        this.proposalSend,
        this.opts.onProposalSend,
      );
      Effect.runSync(
        Scope.addFinalizer(
          this.scope,
          Effect.promise(() => proposer.close().catch(() => undefined)),
        ),
      );
      this.proposer = proposer;
    }
    await this.proposer.propose(bytes);
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
  ): Promise<Subscription> {
    return this.follow(this.opts.topics.tx, "subscribe", fromOffset, onBatch, from?.position);
  }

  subscribeRejections(
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
  ): Promise<Subscription> {
    return this.follow(this.opts.topics.rejections, "subscribeRejections", fromOffset, onBatch);
  }

  private async follow(
    topic: string,
    what: string,
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
    position?: number,
  ): Promise<Subscription> {
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
    if (this.closed) {
      // Closed while the reader connected: it never joined the log's scope.
      await reader.stop();
      throw new CatalogLogError(`${what}: the Kafka log is closed`);
    }
    return { stop: this.child(() => reader.stop()), ended: reader.ended };
  }

  async acquireWriter(signal?: AbortSignal): Promise<WriterLease> {
    this.checkOpen("acquireWriter");
    const lease = new KafkaWriterLease(this.kafka, {
      topics: this.opts.topics,
      sessionTimeoutMs: this.opts.sessionTimeoutMs,
      txLimits: this.writerTx,
      readState: () => this.writerState(),
    });
    const close = this.child(() => lease.stop());
    try {
      await lease.acquire(signal);
    } catch (err) {
      await close();
      throw err;
    }
    // The holder's stop() closes the lease's scope (which then leaves the log's).
    return {
      get txEnd() {
        return lease.txEnd;
      },
      get proposalsOffset() {
        return lease.proposalsOffset;
      },
      get commits() {
        return lease.commits;
      },
      run: (handler) => lease.run(handler),
      stop: close,
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const exit = await Effect.runPromiseExit(Scope.close(this.scope, Exit.void));
    if (Exit.isFailure(exit)) throw Cause.squash(exit.cause);
  }
}
