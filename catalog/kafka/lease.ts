import {
  type Consumer,
  type EachBatchPayload,
  type Kafka,
  Partitioners,
  type Producer,
  type Transaction,
} from "kafkajs";
import { CatalogLogError, type LogRecord, type WriterCommit, type WriterLease } from "../log.ts";
import { type KafkaTopics, writerGroupId, writerTransactionalId } from "./admin.ts";
import { stickyWriterAssigner } from "./assignor.ts";
import { retryConcurrent } from "./client.ts";
import { producerWithCachedCoordinators } from "./coordinators.ts";
import { type BatchLimits, chunksBySize, groupUnits } from "./grouping.ts";
import { OFFSET_HEADER, packTxs, proposalItems, view } from "./records.ts";
import { type WriterState, writerStateMetadata } from "./writer-state.ts";

/**
 * Proposals per writer transaction. A transaction costs five broker round
 * trips (AddPartitionsToTxn, Produce, AddOffsetsToTxn, TxnOffsetCommit,
 * EndTxn) whatever its size: measured here at 15-30 ms for one record and
 * 40-100 ms for 1,250 under load, against ~45 µs per proposal to decide. So
 * large groups amortize the round trips, and a backlog larger than one group
 * is pipelined (group k+1 decided while k commits). Smaller caps (500) were
 * tried: a 1,250-proposal burst then paid three commits in sequence instead
 * of one, no faster end to end.
 */
export const DEFAULT_WRITER_TX: BatchLimits = { maxRecords: 2_000, maxBytes: 4 << 20 };
/** Proposals decided between two event-loop yields, so an in-flight commit's responses are read promptly (~64 × 45 µs ≈ 3 ms). */
const DECIDE_SLICE = 64;

/** How long the writer's producer trusts a coordinator lookup (catalog/kafka/coordinators.ts): a moved coordinator costs at most this much retrying. */
const COORDINATOR_TTL_MS = 1_000;

/**
 * The writer's proposal fetches return once 32 KiB are there or 10 ms have
 * passed. Proposals fetched while a commit is in flight (15–25 ms at 5,000/s
 * here) wait for it anyway, so fetching on every byte only cost requests:
 * one per proposer send, ~200/s, each ~0.1–0.25 ms of CPU in the writer and
 * in the broker on this machine. Measured side by side (full catalog bench,
 * two rounds): publications/s 12.0k/12.9k against 10.5k/9.9k, writer CPU per
 * publication 50–54 µs against 63–68, lag unchanged within noise. A lone
 * proposal waits up to 10 ms longer to be fetched.
 */
const WRITER_FETCH_WAIT_MS = 10;
const WRITER_FETCH_MIN_BYTES = 32 << 10;

/**
 * A writer transaction starts at least 20 ms after the previous one started
 * (group commit with a floor on the interval). Back to back, commits ran
 * every ~14 ms at 5,000 proposals/s: ~70 transactions/s of six requests each
 * (a quarter of them with a seventh, the CONCURRENT_TRANSACTIONS retry of a
 * transaction begun while the coordinator still wrote the previous one's
 * markers), plus a replica fetch per commit — on a machine where each
 * request costs ~0.2 ms of CPU in a socket write alone and three processes
 * already share two cores. With the floor: ~48 transactions/s, retries 9 in
 * 970 against 389 in 1,522, writer requests −30 % over a lag run, and writer
 * CPU per publication ~10–20 % lower. The cost is latency when commits would
 * have run closer: a proposal waits at most 20 ms − (the previous commit's
 * duration) longer, ~5 ms at p50 here; lag p99 at 5,000/s measured lower
 * (interleaved lag runs, catalog bench). A commit that would start later
 * anyway (load below ~50 commits/s' worth) waits for nothing.
 */
const MIN_COMMIT_INTERVAL_MS = 20;

/**
 * Runs the handler over `records` in slices of DECIDE_SLICE, yielding to the
 * event loop between slices (so a commit in flight progresses while the next
 * group is decided), and concatenates the results in order.
 */
async function decideSliced(
  handler: (p: readonly LogRecord[]) => Promise<WriterCommit> | WriterCommit,
  records: readonly LogRecord[],
): Promise<WriterCommit> {
  if (records.length <= DECIDE_SLICE) return handler(records);
  const tx: Uint8Array[] = [];
  const rejections: Uint8Array[] = [];
  for (let i = 0; i < records.length; i += DECIDE_SLICE) {
    if (i > 0) await new Promise<void>((r) => setImmediate(r));
    const out = await handler(records.slice(i, i + DECIDE_SLICE));
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

export class KafkaWriterLease implements WriterLease {
  txEnd = 0;
  proposalsOffset = 0;
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
  private owner = false;
  private readonly stateChanged: Array<() => void> = [];

  private readonly txLimits: BatchLimits;
  private readonly readState: () => Promise<WriterState>;

  constructor(kafka: Kafka, opts: LeaseOptions) {
    this.topics = opts.topics;
    this.txLimits = opts.txLimits;
    this.readState = opts.readState;
    const sessionTimeout = opts.sessionTimeoutMs ?? 6_000;
    this.consumer = kafka.consumer({
      groupId: writerGroupId(opts.topics),
      sessionTimeout,
      rebalanceTimeout: Math.max(10_000, sessionTimeout * 2),
      heartbeatInterval: Math.max(100, Math.floor(sessionTimeout / 6)),
      partitionAssigners: [stickyWriterAssigner(() => this.owner)],
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
        // Back-to-back transactions: the first send of a transaction begun right
        // after a commit meets CONCURRENT_TRANSACTIONS while the coordinator
        // still writes the previous commit's markers (a few ms). kafkajs retries
        // it itself, after the client's 100 ms initial backoff: a 100 ms stall
        // per transaction. Start at 2 ms: on one broker the markers take a few
        // ms, and at 5,000 proposals/s every transaction starts right after the
        // previous commit, so this wait is on every proposal's lag (the Java
        // producer uses 20 ms, KAFKA-5477). 25 retries doubling to 5 s still
        // ride out about a minute of broker outage, like the client default.
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
      if (mine) {
        this.owner = true;
        assigned();
      } else if (this.owner) {
        // A rebalance moved the partition away: another member takes over and fences us.
        this.owner = false;
        this.lose(new CatalogLogError("writer lease lost: the proposals partition was reassigned"));
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
    const aborted = new Promise<void>((_, reject) => {
      if (signal?.aborted) reject(signal.reason);
      signal?.addEventListener("abort", () => reject(signal.reason));
    });
    try {
      await Promise.race([gotPartition, aborted]);
      // Fencing: bumps the epoch of the transactional id and aborts (or waits out) the previous holder's open transaction.
      await this.producer.connect();
      const st = await this.readState();
      this.txEnd = st.txEnd;
      this.rejEnd = st.rejEnd;
      this.proposalsOffset = st.proposalsOffset;
      this.decidedEnd = st.proposalsOffset;
      this.consumer.seek({ topic: proposals, partition: 0, offset: String(st.proposalsOffset) });
      this.setState("ready");
    } catch (err) {
      await this.shutdown();
      throw err;
    }
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
    while (this.state === "joining" || this.state === "ready") {
      await Promise.race([this.waitState(), new Promise((r) => setTimeout(r, 1_000))]);
      if (isRunning()) await heartbeat().catch(() => undefined);
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
      // once MIN_COMMIT_INTERVAL_MS have passed since the previous start.
      // A proposal thus waits for the rest of the commit in flight and its
      // own: about 1.5 commits (C) of lag. Deciding a whole group at the
      // start of the previous commit (as before) fetched only what had
      // arrived by then, so a proposal arriving later missed that group and
      // waited out two more commits: about 2.5 C. Each commit starts only
      // after the previous one succeeded (consecutive logical offsets, one
      // transaction open at a time); a failed commit loses the lease — the
      // writer then discards its db, which may hold decided, uncommitted
      // proposals (WriterLease contract). The batch returns once its
      // proposals are decided and their offsets resolved, so the next fetch
      // overlaps the commit.
      // A part ends on a record boundary (a packed record is consumed whole) and holds at most
      // txLimits.maxRecords proposals and maxBytes bytes, unless one record alone exceeds them;
      // `pending` takes a part only within the same bounds (or when it is empty).
      const units = fresh.map((m) => ({ m, items: proposalItems(view(m.value)) }));
      for (const part of groupUnits(units, this.txLimits)) {
        let count = 0;
        let bytes = 0;
        for (const u of part) {
          count += u.items.length;
          for (const b of u.items) bytes += b.length;
        }
        while (this.state === "running" && !this.pendingFits(count, bytes)) {
          await new Promise<void>((r) => this.pendingTaken.push(r));
        }
        if (this.state !== "running" || !isRunning() || isStale()) break;
        const records: LogRecord[] = [];
        for (const u of part) {
          const offset = Number(u.m.offset);
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
        resolveOffset(part[part.length - 1]!.m.offset);
        this.kick();
      }
      await heartbeat();
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
      for (const part of chunksBySize(tagged)) {
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
