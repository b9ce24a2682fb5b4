import {
  type Consumer,
  type EachBatchPayload,
  type Kafka,
  Partitioners,
  type Producer,
  type Transaction,
} from "kafkajs";
import { abortable, sleep } from "../../schema/abort.ts";
import { CatalogLogError, type LogRecord, type WriterCommit, type WriterLease } from "../log.ts";
import { type KafkaTopics, MAX_SEND_BYTES, writerGroupId, writerTransactionalId } from "./admin.ts";
import { stickyWriterAssigner } from "./assignor.ts";
import { retryConcurrent } from "./client.ts";
import { producerWithCachedCoordinators } from "./coordinators.ts";
import { type BatchLimits, groupEnd, groups } from "./grouping.ts";
import { OFFSET_HEADER, packTxs, proposalItems, view } from "./records.ts";
import { type WriterState, writerStateMetadata } from "./writer-state.ts";

/**
 * Proposals per writer transaction. A transaction costs five broker round
 * trips whatever its size, against tens of µs per proposal to decide, so
 * large groups amortize them; a larger backlog is pipelined (group k+1
 * decided while k commits). Measurements: bench/catalog.md.
 */
export const DEFAULT_WRITER_TX: BatchLimits = { maxRecords: 2_000, maxBytes: 4 << 20 };
/**
 * Proposals decided between two event-loop yields, so an in-flight commit's
 * responses are read promptly: at most 32 proposals and 16 KiB (about 1 ms of
 * deciding, whatever the proposals' size). Counted in proposals alone (64),
 * a slice of 16-chunk proposals held the loop ~40 ms, and each of a commit's
 * five round trips waited for one. Measurements: bench/catalog.md.
 */
const DECIDE_SLICE: BatchLimits = { maxRecords: 32, maxBytes: 16 << 10 };

/** How long the writer's producer trusts a coordinator lookup (catalog/kafka/coordinators.ts): a moved coordinator costs at most this much retrying. */
const COORDINATOR_TTL_MS = 1_000;

/**
 * The writer's proposal fetches return once 32 KiB are there or 10 ms have
 * passed: proposals fetched while a commit is in flight wait for it anyway,
 * so fetching on every byte costs requests (CPU in the writer and the
 * broker) for no lag. A lone proposal waits up to 10 ms longer. Measurements:
 * bench/catalog.md.
 */
const WRITER_FETCH_WAIT_MS = 10;
const WRITER_FETCH_MIN_BYTES = 32 << 10;

/**
 * A writer transaction starts at least 20 ms after the previous one started
 * (group commit with a floor on the interval): fewer transactions per second
 * at a steady rate, so fewer requests and CONCURRENT_TRANSACTIONS retries,
 * for at most 20 ms − (the previous commit's duration) more wait. A commit
 * that would start later anyway waits for nothing. Measurements:
 * bench/catalog.md.
 */
const MIN_COMMIT_INTERVAL_MS = 20;

/**
 * Runs the handler over `records` in slices within DECIDE_SLICE, yielding to the
 * event loop between slices (so a commit in flight progresses while the next
 * group is decided), and concatenates the results in order.
 */
async function decideSliced(
  handler: (p: readonly LogRecord[]) => Promise<WriterCommit> | WriterCommit,
  records: readonly LogRecord[],
): Promise<WriterCommit> {
  const bytesAt = (i: number) => records[i]!.bytes.byteLength;
  let end = groupEnd(records.length, 0, DECIDE_SLICE, bytesAt);
  if (end === records.length) return handler(records);
  const tx: Uint8Array[] = [];
  const rejections: Uint8Array[] = [];
  for (let i = 0; i < records.length; i = end) {
    if (i > 0) {
      await new Promise<void>((r) => setImmediate(r));
      end = groupEnd(records.length, i, DECIDE_SLICE, bytesAt);
    }
    const out = await handler(records.slice(i, end));
    for (const t of out.tx) tx.push(t);
    for (const r of out.rejections) rejections.push(r);
  }
  return { tx, rejections };
}

/** Decided, not yet committed: the next transaction's content. */
interface PendingGroup {
  readonly tx: Uint8Array[];
  readonly rejections: Uint8Array[];
  /** Offset in catalog.proposals one past its last proposal. */
  consumed: number;
  proposals: number;
  bytes: number;
}

/** One produce request of a commit: records up to MAX_SEND_BYTES (any count). */
const PRODUCE_REQUEST: BatchLimits = { maxRecords: Number.MAX_SAFE_INTEGER, maxBytes: MAX_SEND_BYTES };

type LeaseState = "joining" | "ready" | "running" | "stopped" | "lost";

export interface LeaseOptions {
  readonly topics: KafkaTopics;
  /** Writer group session timeout: how long a dead writer holds the lease (default 6,000 ms, the broker minimum). */
  readonly sessionTimeoutMs?: number;
  /** Bounds of one writer transaction. */
  readonly txLimits: BatchLimits;
  /** Reads the progress committed by the last writer transaction (catalog/kafka/writer-state.ts). */
  readonly readState: () => Promise<WriterState>;
}

/**
 * The exactly-once writer lease (the loop around it is catalog/writer.ts):
 *   - one consumer group `<proposals>.writer` on the single-partition
 *     proposals topic; the member that owns partition 0 is the active writer,
 *     the others are standbys (catalog/kafka/assignor.ts keeps the partition
 *     with its owner when a standby joins, so a join causes no takeover);
 *   - a transactional producer with a fixed transactional id (`<tx>.writer`),
 *     idempotent, one request in flight. Acquiring the lease initializes it,
 *     which bumps the producer epoch: the previous holder (a zombie that lost
 *     its group membership but still runs) is fenced, and its open
 *     transaction is aborted before any state is read;
 *   - per group of proposals (at most `txLimits`, ending on a record
 *     boundary): begin → sendOffsets (proposals consumed, with the writer
 *     state as metadata, catalog/kafka/writer-state.ts) → send packed tx
 *     records and rejections → commit. Groups are pipelined: the next group
 *     is decided (even fetched) while this one commits, and its commit starts
 *     only after this one succeeded; a failure loses the lease, and the
 *     writer discards its db (which may hold decided, uncommitted groups).
 *     The committed offset and its metadata change atomically with the
 *     records, so a new holder resumes exactly where the last committed
 *     transaction ended.
 *   - CONCURRENT_TRANSACTIONS (the coordinator still finishing the previous
 *     commit) is retried with bounded backoff where kafkajs hands it up
 *     (retryConcurrent), and kafkajs's own retry of a send starts at 2 ms.
 */
export class KafkaWriterLease implements WriterLease {
  txEnd = 0;
  proposalsOffset = 0;
  commits = 0;
  private rejEnd = 0;
  private state: LeaseState = "joining";
  private readonly consumer: Consumer;
  private readonly producer: Producer;
  private handler: ((p: readonly LogRecord[]) => Promise<WriterCommit> | WriterCommit) | undefined;
  private runResult: { resolve: () => void; reject: (e: Error) => void } | undefined;
  private runPromise: Promise<void> | undefined;
  private inBatch: Promise<void> = Promise.resolve();
  /** The commit in flight (settled: resolved once committed; a failure has already lost the lease). */
  private inFlight: Promise<void> = Promise.resolve();
  private committing = false;
  /** performance.now() when the last commit started. */
  private lastCommitStart = -Infinity;
  /** A kick deferred until MIN_COMMIT_INTERVAL_MS after the last commit's start. */
  private kickTimer: NodeJS.Timeout | undefined;
  /** Decided proposals waiting for the commit in flight to end; committed together next (at most txLimits). */
  private pending: PendingGroup | undefined;
  /** Batches waiting for room in `pending` (woken when a commit takes it, or the state changes). */
  private readonly pendingTaken: Array<() => void> = [];
  /** Offset in catalog.proposals of the first proposal not yet decided (≥ proposalsOffset: decided groups may be committing). */
  private decidedEnd = 0;
  private readonly topics: KafkaTopics;
  /** The group member id under which this lease got partition 0 (undefined: not the owner). */
  private ownerMemberId: string | undefined;
  /** Rejected by lose(): acquire() waits on it beside the partition, so a loss while joining ends the wait. */
  private readonly lost: Promise<never>;
  private rejectLost: (err: Error) => void = () => undefined;
  private readonly stateChanged: Array<() => void> = [];

  private readonly txLimits: BatchLimits;
  private readonly readState: () => Promise<WriterState>;

  constructor(kafka: Kafka, opts: LeaseOptions) {
    this.topics = opts.topics;
    this.txLimits = opts.txLimits;
    this.readState = opts.readState;
    const sessionTimeout = opts.sessionTimeoutMs ?? 6_000;
    this.lost = new Promise<never>((_, reject) => {
      this.rejectLost = reject;
    });
    this.lost.catch(() => undefined);
    this.consumer = kafka.consumer({
      groupId: writerGroupId(opts.topics),
      sessionTimeout,
      rebalanceTimeout: Math.max(10_000, sessionTimeout * 2),
      heartbeatInterval: Math.max(100, Math.floor(sessionTimeout / 6)),
      partitionAssigners: [stickyWriterAssigner(() => this.ownerMemberId)],
      maxBytesPerPartition: 8 << 20,
      maxWaitTimeInMs: WRITER_FETCH_WAIT_MS,
      minBytes: WRITER_FETCH_MIN_BYTES,
      readUncommitted: false,
    });
    this.producer = producerWithCachedCoordinators(
      kafka,
      {
        transactionalId: writerTransactionalId(opts.topics),
        idempotent: true,
        maxInFlightRequests: 1,
        transactionTimeout: 30_000,
        createPartitioner: Partitioners.DefaultPartitioner,
        // A transaction begun right after a commit meets CONCURRENT_TRANSACTIONS while the coordinator
        // still writes the previous markers (a few ms on one broker); kafkajs's default 100 ms first
        // backoff would sit on every proposal's lag at a steady rate (the Java producer uses 20 ms,
        // KAFKA-5477). 25 retries doubling to 5 s ride out about a minute of broker outage.
        retry: { initialRetryTime: 2, maxRetryTime: 5_000, retries: 25 },
      },
      COORDINATOR_TTL_MS,
    );
  }

  private setState(s: LeaseState): void {
    this.state = s;
    for (const w of this.stateChanged.splice(0)) w();
    for (const w of this.pendingTaken.splice(0)) w();
  }

  private waitState(): Promise<void> {
    return new Promise((r) => this.stateChanged.push(r));
  }

  /** Joins the group, waits for partition 0, fences the previous holder and reads where it stopped. */
  async acquire(signal?: AbortSignal): Promise<void> {
    const { proposals } = this.topics;
    let assigned: () => void = () => undefined;
    const gotPartition = new Promise<void>((r) => {
      assigned = r;
    });
    this.consumer.on(this.consumer.events.GROUP_JOIN, ({ payload }) => {
      const mine = (payload.memberAssignment[proposals] ?? []).includes(0);
      const held = this.ownerMemberId;
      if (held === undefined) {
        if (mine && this.state === "joining") {
          this.ownerMemberId = payload.memberId;
          assigned();
        }
      } else if (!mine) {
        // A rebalance moved the partition away: another member takes over and fences us.
        this.ownerMemberId = undefined;
        this.lose(new CatalogLogError("writer lease lost: the proposals partition was reassigned"));
      } else if (payload.memberId !== held) {
        // Rejoined under a new member id: the old membership expired (a frozen or partitioned
        // process), so another member may have held the partition and fenced our producer in
        // between. Holding partition 0 again proves nothing; an idle zombie would otherwise never
        // learn it was fenced (it finds out only on its next commit).
        this.ownerMemberId = undefined;
        this.lose(
          new CatalogLogError(
            `writer lease lost: the group membership expired (rejoined as ${payload.memberId}, was ${held})`,
          ),
        );
      }
    });
    this.consumer.on(this.consumer.events.CRASH, ({ payload }) => {
      this.lose(new CatalogLogError(`writer lease lost: consumer crashed: ${payload.error.message}`));
    });
    await this.consumer.connect();
    await this.consumer.subscribe({ topic: proposals, fromBeginning: true });
    await this.consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      partitionsConsumedConcurrently: 1,
      eachBatch: (payload) => this.onProposals(payload),
    });
    try {
      // A loss while waiting (the consumer crashed, the membership expired) ends the wait with its cause.
      await abortable(Promise.race([gotPartition, this.lost]), signal);
      await abortable(Promise.race([this.fence(), this.lost]), signal);
      const st = await Promise.race([this.readState(), this.lost]);
      this.txEnd = st.txEnd;
      this.rejEnd = st.rejEnd;
      this.proposalsOffset = st.proposalsOffset;
      this.decidedEnd = st.proposalsOffset;
      this.consumer.seek({ topic: proposals, partition: 0, offset: String(st.proposalsOffset) });
      // Lost after the last wait (a rejoin between two awaits): never turn a lost lease back into a ready one.
      if (this.state !== "joining") throw new CatalogLogError(`writer lease ${this.state} while acquiring`);
      this.setState("ready");
    } catch (err) {
      await this.shutdown();
      throw err;
    }
  }

  /**
   * Fences the previous holder before any state is read: InitProducerId with the transactional id
   * bumps its epoch and aborts (or waits out) its open transaction, so its later commits fail.
   * kafkajs 2.2.4's connect() does not do this (it asks for a plain idempotent producer id); it
   * does it on the first transaction() only. Fencing there, at the first commit, left a window
   * after readState in which a thawed zombie could still commit: both then committed txs under
   * the same logical offsets, and every reader of catalog.tx stopped at the duplicate. A
   * transaction begun and aborted with nothing in it sends only the InitProducerId.
   */
  private async fence(): Promise<void> {
    await this.producer.connect();
    const txn = await this.producer.transaction();
    await txn.abort();
  }

  run(handler: (proposals: readonly LogRecord[]) => Promise<WriterCommit> | WriterCommit): Promise<void> {
    if (this.state !== "ready") {
      return Promise.reject(new CatalogLogError(`run: lease is ${this.state}, not ready`));
    }
    this.handler = handler;
    this.runPromise = new Promise((resolve, reject) => {
      this.runResult = { resolve, reject };
    });
    this.setState("running");
    return this.runPromise;
  }

  private async onProposals({
    batch,
    heartbeat,
    isRunning,
    isStale,
    resolveOffset,
  }: EachBatchPayload): Promise<void> {
    // Before run(): hold the batch (heartbeating) until the writer has caught up and calls run().
    // A heartbeat that fails (the group rebalances) gives the batch back at once, so kafkajs can
    // rejoin under the same member id in time; swallowing it would hold the rejoin off until the
    // group dropped us, and a member rejoining under a new id has lost its lease.
    while (this.state === "joining" || this.state === "ready") {
      await Promise.race([this.waitState(), sleep(1_000)]);
      if (!isRunning() || isStale()) return;
      try {
        await heartbeat();
      } catch {
        return;
      }
    }
    if (this.state !== "running" || !isRunning() || isStale()) return;
    const handler = this.handler!;
    let done: () => void = () => undefined;
    this.inBatch = new Promise((r) => {
      done = r;
    });
    try {
      const next = this.decidedEnd;
      const fresh = batch.messages.filter((m) => Number(m.offset) >= next);
      // The fetch position advances only through resolved offsets: without
      // this the consumer re-fetches from the batch's first offset, and once
      // that range exceeds maxBytesPerPartition the writer sees nothing new.
      const stale = batch.messages.filter((m) => Number(m.offset) < next);
      if (stale.length > 0) resolveOffset(stale[stale.length - 1]!.offset);
      // Pipeline: proposals are decided as soon as they are fetched, while a
      // commit is in flight, and wait in `pending`; when that commit ends the
      // next one starts with everything decided meanwhile (kick), at once or
      // once MIN_COMMIT_INTERVAL_MS have passed since the previous start. A
      // proposal thus waits for the rest of the commit in flight and its own,
      // about 1.5 commits of lag. Each commit starts only after the previous
      // one succeeded (consecutive logical offsets, one transaction open at a
      // time); a failed commit loses the lease (WriterLease contract). The
      // batch returns once its proposals are decided and their offsets
      // resolved, so the next fetch overlaps the commit.
      // A part ends on a record boundary (a packed record is consumed whole) and holds at most
      // txLimits.maxRecords proposals and maxBytes bytes, unless one record alone exceeds them;
      // `pending` takes a part only within the same bounds (or when it is empty).
      const units = fresh.map((m) => {
        const items = proposalItems(view(m.value));
        let bytes = 0;
        for (const b of items) bytes += b.byteLength;
        return { kafkaOffset: m.offset, items, bytes };
      });
      for (const part of groups(
        units,
        this.txLimits,
        (u) => u.bytes,
        (u) => u.items.length,
      )) {
        let count = 0;
        let bytes = 0;
        for (const u of part) {
          count += u.items.length;
          bytes += u.bytes;
        }
        while (this.state === "running" && !this.pendingFits(count, bytes)) {
          await new Promise<void>((r) => this.pendingTaken.push(r));
        }
        if (this.state !== "running" || !isRunning() || isStale()) break;
        const records: LogRecord[] = [];
        for (const u of part) {
          const offset = Number(u.kafkaOffset);
          for (const b of u.items) records.push({ offset, bytes: b });
        }
        const result = await decideSliced(handler, records);
        if (this.state !== "running") break;
        const consumed = records[records.length - 1]!.offset + 1;
        this.decidedEnd = consumed;
        const g = this.pending ?? { tx: [], rejections: [], consumed, proposals: 0, bytes: 0 };
        for (const t of result.tx) g.tx.push(t);
        for (const r of result.rejections) g.rejections.push(r);
        g.consumed = consumed;
        g.proposals += count;
        g.bytes += bytes;
        this.pending = g;
        resolveOffset(part[part.length - 1]!.kafkaOffset);
        this.kick();
      }
      // A heartbeat that fails here means the group rebalances (a standby joined, a zombie came
      // back): not a loss. kafkajs rejoins after this batch; the assignor keeps partition 0 with
      // this member, and GROUP_JOIN reports a move or a new member id, which are losses.
      await heartbeat().catch(() => undefined);
    } catch (err) {
      // A decide that failed while the previous group commits: let that commit settle (it is whole either way) before the lease shuts down.
      await this.inFlight.catch(() => undefined);
      this.lose(err as Error);
    } finally {
      done();
    }
  }

  /** Whether `pending` can take `count` proposals of `bytes` bytes within txLimits (an empty one takes any part). */
  private pendingFits(count: number, bytes: number): boolean {
    const p = this.pending;
    return (
      p === undefined ||
      (p.proposals + count <= this.txLimits.maxRecords && p.bytes + bytes <= this.txLimits.maxBytes)
    );
  }

  /** Starts committing `pending` unless a commit is in flight (or deferred to the interval floor); each commit's end starts the next. */
  private kick(): void {
    if (this.committing || this.pending === undefined || this.state !== "running") return;
    if (this.kickTimer !== undefined) return;
    const wait = this.lastCommitStart + MIN_COMMIT_INTERVAL_MS - performance.now();
    if (wait > 0) {
      this.kickTimer = setTimeout(() => {
        this.kickTimer = undefined;
        this.kick();
      }, wait);
      return;
    }
    this.lastCommitStart = performance.now();
    const g = this.pending;
    this.pending = undefined;
    for (const w of this.pendingTaken.splice(0)) w();
    this.committing = true;
    const commit = this.commit(g, g.consumed).then(() => {
      this.proposalsOffset = g.consumed;
      this.commits++;
      this.committing = false;
      this.kick();
    });
    this.inFlight = commit;
    // The lease is lost as soon as a commit fails, whether or not a batch is running.
    commit.catch((err: Error) => this.lose(err));
  }

  /** One Kafka transaction: tx records, rejections, consumed offset with metadata; commit. Throws (after abort) on failure. */
  private async commit(c: WriterCommit, consumed: number): Promise<void> {
    const txn: Transaction = await this.producer.transaction();
    try {
      // Offsets first. The transaction's first request meets CONCURRENT_TRANSACTIONS
      // while the coordinator still writes the previous commit's markers (most
      // back-to-back commits do). Answered to AddOffsetsToTxn, we retry it in
      // retryConcurrent for one round trip each; answered to the AddPartitionsToTxn
      // inside sendBatch, kafkajs's own retry also refreshes the metadata, two more
      // round trips. The order of a transaction's parts does not matter: they commit
      // together or not at all.
      const metadata = writerStateMetadata(this.txEnd + c.tx.length, this.rejEnd + c.rejections.length);
      await retryConcurrent(() =>
        txn.sendOffsets({
          consumerGroupId: writerGroupId(this.topics),
          topics: [
            {
              topic: this.topics.proposals,
              partitions: [{ partition: 0, offset: String(consumed), metadata }],
            },
          ],
        } as unknown as Parameters<Transaction["sendOffsets"]>[0]),
      );
      const stamp = (records: readonly Uint8Array[], from: number) =>
        records.map((r, i) => ({
          value: Buffer.from(r.buffer, r.byteOffset, r.byteLength),
          headers: { [OFFSET_HEADER]: String(from + i) },
        }));
      // Tx records and rejections share produce requests (one AddPartitionsToTxn and one Produce round trip when they fit 1 MiB).
      const tagged = [
        ...packTxs(c.tx, this.txEnd).map((m) => ({ ...m, topic: this.topics.tx })),
        ...stamp(c.rejections, this.rejEnd).map((m) => ({ ...m, topic: this.topics.rejections })),
      ];
      for (const part of groups(tagged, PRODUCE_REQUEST, (m) => m.value.length)) {
        const topicMessages = [this.topics.tx, this.topics.rejections]
          .map((topic) => ({
            topic,
            messages: part.filter((m) => m.topic === topic).map(({ value, headers }) => ({ value, headers })),
          }))
          .filter((t) => t.messages.length > 0);
        await retryConcurrent(() => txn.sendBatch({ acks: -1, topicMessages }));
      }
      await txn.commit();
    } catch (err) {
      await txn.abort().catch(() => undefined);
      throw err;
    }
    this.txEnd += c.tx.length;
    this.rejEnd += c.rejections.length;
  }

  private lose(err: Error): void {
    if (this.state === "stopped" || this.state === "lost") return;
    this.setState("lost");
    this.rejectLost(err);
    this.runResult?.reject(err);
    // Not awaited: disconnect waits for eachBatch, which may be the caller.
    void this.shutdown();
  }

  private async shutdown(): Promise<void> {
    clearTimeout(this.kickTimer);
    this.kickTimer = undefined;
    await this.consumer.disconnect().catch(() => undefined);
    await this.producer.disconnect().catch(() => undefined);
  }

  async stop(): Promise<void> {
    if (this.state === "stopped") return;
    const wasLost = this.state === "lost";
    if (!wasLost) this.setState("stopped");
    await this.inBatch;
    await this.inFlight.catch(() => undefined);
    await this.shutdown();
    if (!wasLost) this.runResult?.resolve();
  }
}
