import { randomUUID } from "node:crypto";
import * as net from "node:net";
import {
  type Admin,
  AssignerProtocol,
  type Consumer,
  type EachBatchPayload,
  Kafka,
  type LogEntry,
  logLevel,
  type PartitionAssigner,
  Partitioners,
  type Producer,
  type Transaction,
} from "kafkajs";
import { abortable, sleep } from "../schema/abort.ts";
import { producerWithCachedCoordinators } from "./kafka-coordinators.ts";
import {
  mayBePacked,
  PROPOSAL_BATCH,
  pack,
  TX_BATCH,
  TX_RECORD_TARGET_BYTES,
  unpack,
} from "./kafka-records.ts";
import {
  CatalogLogError,
  checkOffset,
  type FullCatalogLog,
  type LogRecord,
  type SubscribeFrom,
  type WriterCommit,
  type WriterLease,
} from "./log.ts";

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
 *     addresses cached (catalog/kafka-coordinators.ts). Groups are pipelined: the
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
 * Wire (catalog/WIRE.md, catalog/kafka-records.ts): proposals proposed
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

export const OFFSET_HEADER = "continuum-offset";

/** Records handed to one subscriber callback (default). */
const DEFAULT_MAX_BATCH = 2000;
/** Bytes per produce request; below the topics' max.message.bytes. */
const MAX_SEND_BYTES = 1 << 20;
/** Topic-level record batch limit (room for one wire message of 16 MiB plus framing). */
const TOPIC_MAX_MESSAGE_BYTES = 20 * 1024 * 1024;
/** How long the writer's producer trusts a coordinator lookup (catalog/kafka-coordinators.ts): a moved coordinator costs at most this much retrying. */
const COORDINATOR_TTL_MS = 1_000;
/** Bound of the proposal producer's queue (proposals waiting for a send slot). */
const MAX_PENDING_PROPOSALS = 20_000;

/**
 * Bounds of one group of records: the proposals in one produce request, or
 * the proposals decided into one writer transaction. A single record larger
 * than `maxBytes` still forms a group of its own (the topic's
 * max.message.bytes, not this bound, decides whether it fits).
 */
export interface BatchLimits {
  readonly maxRecords: number;
  readonly maxBytes: number;
}

/**
 * Proposals per produce request, packed in one record (a
 * `catalog.proposal.batch`, catalog/kafka-records.ts): everything queued
 * within one event-loop turn (the linger) up to 2,000 proposals or 1 MiB,
 * whichever comes first. Must fit PROPOSAL_BATCH's bounds (checked at open).
 */
export const DEFAULT_PROPOSAL_SEND: BatchLimits = { maxRecords: 2_000, maxBytes: MAX_SEND_BYTES };

/** msgpack overhead of a packed record: the map with v and kind (< 64 bytes) plus a bin32 header (5 bytes) per item. */
const packedBytesBound = (l: BatchLimits): number => l.maxBytes + 5 * l.maxRecords + 64;

/** Checks that proposal groups of `l` always fit one proposal batch record. */
function checkProposalSend(l: BatchLimits): BatchLimits {
  checkBatchLimits("proposalSend", l);
  if (l.maxRecords > PROPOSAL_BATCH.maxItems || packedBytesBound(l) > PROPOSAL_BATCH.maxBytes) {
    throw new CatalogLogError(
      `proposalSend: ${l.maxRecords} proposals / ${l.maxBytes} bytes do not fit one proposal batch (at most ${PROPOSAL_BATCH.maxItems} proposals and ${PROPOSAL_BATCH.maxBytes} bytes with framing)`,
    );
  }
  return l;
}
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

/** Checks a BatchLimits value: both bounds positive integers. */
export function checkBatchLimits(what: string, l: BatchLimits): BatchLimits {
  if (!Number.isSafeInteger(l.maxRecords) || l.maxRecords < 1)
    throw new CatalogLogError(`${what}.maxRecords must be a positive integer, got ${String(l.maxRecords)}`);
  if (!Number.isSafeInteger(l.maxBytes) || l.maxBytes < 1)
    throw new CatalogLogError(`${what}.maxBytes must be a positive integer, got ${String(l.maxBytes)}`);
  return l;
}

/**
 * How many of `sizes` (record byte sizes, in order) form the next group:
 * at least one, at most `maxRecords`, and no more than `maxBytes` in total
 * unless the first record alone exceeds it. Pure.
 */
export function nextGroupSize(sizes: ArrayLike<number>, from: number, limits: BatchLimits): number {
  let n = 0;
  let bytes = 0;
  while (from + n < sizes.length && n < limits.maxRecords) {
    const size = sizes[from + n]!;
    if (n > 0 && bytes + size > limits.maxBytes) break;
    bytes += size;
    n++;
  }
  return n;
}

/**
 * Splits consecutive records into groups by the proposals they carry: each
 * group holds 1..maxRecords proposals and at most maxBytes bytes, unless its
 * single record alone exceeds a bound. Pure.
 */
export function groupUnits<T extends { readonly items: readonly Uint8Array[] }>(
  units: readonly T[],
  limits: BatchLimits,
): T[][] {
  const out: T[][] = [];
  let cur: T[] = [];
  let count = 0;
  let bytes = 0;
  for (const u of units) {
    const size = u.items.reduce((s, b) => s + b.byteLength, 0);
    if (cur.length > 0 && (count + u.items.length > limits.maxRecords || bytes + size > limits.maxBytes)) {
      out.push(cur);
      cur = [];
      count = 0;
      bytes = 0;
    }
    cur.push(u);
    count += u.items.length;
    bytes += size;
  }
  if (cur.length > 0) out.push(cur);
  return out;
}

export interface KafkaTopics {
  readonly proposals: string;
  readonly tx: string;
  readonly rejections: string;
}

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
  readonly logLevel?: "nothing" | "error" | "warn" | "info";
}

export const writerGroupId = (t: KafkaTopics): string => `${t.proposals}.writer`;
export const writerTransactionalId = (t: KafkaTopics): string => `${t.tx}.writer`;

/** kafkajs's message for the CONCURRENT_TRANSACTIONS error code (51). */
const CONCURRENT_TRANSACTIONS_TEXT =
  "The producer attempted to update a transaction while another concurrent operation";

function kafkaClient(
  brokers: readonly string[],
  clientId: string,
  level: KafkaLogOptions["logLevel"],
): Kafka {
  const levels = {
    nothing: logLevel.NOTHING,
    error: logLevel.ERROR,
    warn: logLevel.WARN,
    info: logLevel.INFO,
  };
  return new Kafka({
    clientId,
    brokers: [...brokers],
    logLevel: levels[level ?? "error"],
    // TCP_NODELAY, as the Java client sets it: Nagle's algorithm holds a small
    // request written while an earlier one is unacknowledged until the ACK,
    // which the broker's kernel may delay by up to 40 ms.
    socketFactory: ({ host, port, onConnect }) => {
      const socket = net.connect({ host, port, noDelay: true }, onConnect);
      socket.setKeepAlive(true, 60_000);
      return socket;
    },
    // Bounded reconnects: about a minute of retries before an operation fails.
    retry: { initialRetryTime: 100, maxRetryTime: 5_000, retries: 15 },
    logCreator:
      () =>
      ({ namespace, level: lvl, log }: LogEntry) => {
        const { message, timestamp: _t, logger: _l, ...rest } = log;
        // kafkajs logs each CONCURRENT_TRANSACTIONS answer as an error before retrying it; a writer meets one
        // on nearly every back-to-back transaction (the previous commit's markers are still being written).
        // A retry that finally fails fails the commit, which the writer reports (writer.lease_lost).
        if (`${message} ${String(rest.error)}`.includes(CONCURRENT_TRANSACTIONS_TEXT)) return;
        process.stderr.write(
          `${JSON.stringify({ t: new Date().toISOString(), src: "kafkajs", level: lvl, ns: namespace, msg: message, ...rest })}\n`,
        );
      },
  });
}

/** Polls the admin client until the cluster answers (bounded by `timeoutMs`). */
export async function waitForKafka(brokers: readonly string[], timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    const admin = kafkaClient(brokers, "continuum-ready", "nothing").admin();
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

/** Retries an operation while Kafka answers CONCURRENT_TRANSACTIONS: 2 ms doubling to 500 ms, 40 attempts (≥ 16 s). */
export async function retryConcurrent<T>(op: () => Promise<T>): Promise<T> {
  const attempts = 40;
  let delay = 2;
  for (let i = 1; ; i++) {
    try {
      return await op();
    } catch (err) {
      const type = (err as { type?: string }).type;
      if (type !== "CONCURRENT_TRANSACTIONS" || i >= attempts) throw err;
      await sleep(delay);
      delay = Math.min(500, delay * 2);
    }
  }
}

function logicalOffset(
  headers: Record<string, unknown> | undefined,
  topic: string,
  kafkaOffset: string,
): number {
  const h = headers?.[OFFSET_HEADER];
  const n = h === undefined ? Number.NaN : Number(Buffer.isBuffer(h) ? h.toString("utf8") : String(h));
  if (!Number.isSafeInteger(n) || n < 0) {
    throw new CatalogLogError(`${topic}@${kafkaOffset}: record has no valid ${OFFSET_HEADER} header`);
  }
  return n;
}

/** Splits records into produce requests of at most MAX_SEND_BYTES each. */
function chunksBySize<T extends { value: Buffer }>(messages: readonly T[]): T[][] {
  const out: T[][] = [];
  let cur: T[] = [];
  let bytes = 0;
  for (const m of messages) {
    if (cur.length > 0 && bytes + m.value.length > MAX_SEND_BYTES) {
      out.push(cur);
      cur = [];
      bytes = 0;
    }
    cur.push(m);
    bytes += m.value.length;
  }
  if (cur.length > 0) out.push(cur);
  return out;
}

/**
 * Packs consecutive txs into `catalog.tx.batch` records (at most
 * TX_BATCH.maxItems txs and TX_RECORD_TARGET_BYTES each, or one larger tx
 * alone), each stamped with the logical offset of its first tx.
 */
function packTxs(
  txs: readonly Uint8Array[],
  from: number,
): Array<{ value: Buffer; headers: Record<string, string> }> {
  const sizes = txs.map((t) => t.byteLength);
  const out: Array<{ value: Buffer; headers: Record<string, string> }> = [];
  const limits = { maxRecords: TX_BATCH.maxItems, maxBytes: TX_RECORD_TARGET_BYTES };
  for (let at = 0; at < txs.length; ) {
    const n = nextGroupSize(sizes, at, limits);
    out.push({
      value: pack(TX_BATCH, txs.slice(at, at + n)),
      headers: { [OFFSET_HEADER]: String(from + at) },
    });
    at += n;
  }
  return out;
}

/** The proposals in one record of the proposals topic: a batch's items, or the record itself (a single proposal, or bytes the writer will reject). */
function proposalItems(value: Uint8Array): Uint8Array[] {
  if (!mayBePacked(PROPOSAL_BATCH, value)) return [value];
  try {
    return unpack(PROPOSAL_BATCH, value) ?? [value];
  } catch {
    // Malformed or over the bounds: handed over whole, and decideBatch turns it into one rejection naming why.
    return [value];
  }
}

/** The txs of one catalog.tx record (a packed record, or one tx as a writer before packing wrote it). */
function txItems(value: Uint8Array, topic: string, kafkaOffset: string): Uint8Array[] {
  if (!mayBePacked(TX_BATCH, value)) return [value];
  try {
    return unpack(TX_BATCH, value) ?? [value];
  } catch (err) {
    throw new CatalogLogError(`${topic}@${kafkaOffset}: ${(err as Error).message}`);
  }
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
      const head = this.queue.slice(0, this.limits.maxRecords).map((m) => m.value.length);
      const n = nextGroupSize(head, 0, this.limits);
      let bytes = 0;
      for (let i = 0; i < n; i++) bytes += head[i]!;
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
  async writerState(): Promise<{ proposalsOffset: number; txEnd: number; rejEnd: number }> {
    const [topic] = await this.admin.fetchOffsets({
      groupId: writerGroupId(this.opts.topics),
      topics: [this.opts.topics.proposals],
    });
    const p = topic?.partitions.find((x) => x.partition === 0);
    const offset = p === undefined ? -1 : Number(p.offset);
    if (p === undefined || offset < 0) return { proposalsOffset: 0, txEnd: 0, rejEnd: 0 };
    let meta: { txEnd?: unknown; rejEnd?: unknown };
    try {
      meta = JSON.parse(p.metadata ?? "");
    } catch {
      throw new CatalogLogError(
        `group ${writerGroupId(this.opts.topics)}: committed offset without writer metadata (was it committed by something other than the catalog writer?)`,
      );
    }
    const txEnd = Number(meta.txEnd);
    const rejEnd = Number(meta.rejEnd);
    if (!Number.isSafeInteger(txEnd) || !Number.isSafeInteger(rejEnd)) {
      throw new CatalogLogError(
        `group ${writerGroupId(this.opts.topics)}: bad writer metadata ${p.metadata}`,
      );
    }
    return { proposalsOffset: offset, txEnd, rejEnd };
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

  /**
   * Reads a writer-stamped topic from logical offset `fromOffset` with a
   * private consumer group that never commits. Invariant: records are handed
   * out densely (next, next+1, …); a gap means the topic was written by
   * something else and is reported, not skipped.
   */
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
    const consumer = this.kafka.consumer({
      groupId: `${this.opts.clientId}.reader.${randomUUID()}`,
      readUncommitted: false,
      maxBytesPerPartition: 8 << 20,
      maxWaitTimeInMs: 100,
    });
    let next = fromOffset;
    // catalog.tx records are packed (at most TX_BATCH.maxItems txs each), so the record holding logical
    // offset N is preceded by at least ⌊N / maxItems⌋ records and sits at partition offset ≥ that:
    // a safe place to start reading, skipping what is below N. Rejections are one per record, and each
    // record takes a partition offset of its own, so partition offset ≥ logical offset there.
    // That start can be far behind on a log of sparse records (one tx each: it reads about
    // N − N/maxItems records to skip them), so a caller that knows the position of a record at or
    // before N (a replica's snapshot does) passes it, and reading starts there.
    const packed = topic === this.opts.topics.tx;
    // Partition offset to read from at a (re)join: the start above, then one past the last record handed out.
    let kafkaNext = position ?? (packed ? Math.floor(fromOffset / TX_BATCH.maxItems) : fromOffset);
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    consumer.on(consumer.events.GROUP_JOIN, () =>
      consumer.seek({ topic, partition: 0, offset: String(kafkaNext) }),
    );
    await consumer.run({
      autoCommit: false,
      eachBatch: async ({ batch, heartbeat, isRunning, isStale }: EachBatchPayload) => {
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
        for (let i = 0; i < records.length; i += this.maxBatch) {
          if (!isRunning() || isStale()) return;
          const part = records.slice(i, i + this.maxBatch);
          await onBatch(part);
          next = part[part.length - 1]!.offset + 1;
          await heartbeat();
        }
        if (lastKafka !== "") kafkaNext = Math.max(kafkaNext, Number(lastKafka) + 1);
      },
    });
    const stop = async (): Promise<void> => {
      this.closers.delete(stop);
      await consumer.disconnect();
    };
    this.closers.add(stop);
    return { stop };
  }

  async acquireWriter(signal?: AbortSignal): Promise<WriterLease> {
    this.checkOpen("acquireWriter");
    const lease = new KafkaWriterLease(this.kafka, this, this.opts, this.writerTx);
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

/**
 * Keeps partition 0 of the proposals topic with the member that already owns
 * it; otherwise gives it to the first member by id. Every other member gets
 * nothing (a standby). `owns()` is read when this member joins.
 */
function stickyWriterAssigner(owns: () => boolean): PartitionAssigner {
  const name = "ContinuumStickyWriter";
  const version = 1;
  return ({ cluster }) => ({
    name,
    version,
    protocol({ topics }) {
      return {
        name,
        metadata: AssignerProtocol.MemberMetadata.encode({
          version,
          topics,
          userData: Buffer.from(owns() ? "owner" : "standby"),
        }),
      };
    },
    async assign({ members, topics }) {
      const decoded = members
        .map((m) => ({
          memberId: m.memberId,
          meta: AssignerProtocol.MemberMetadata.decode(m.memberMetadata),
        }))
        .sort((a, b) => (a.memberId < b.memberId ? -1 : a.memberId > b.memberId ? 1 : 0));
      const owner = decoded.find((m) => m.meta?.userData.toString() === "owner") ?? decoded[0];
      const assignment: Record<string, number[]> = {};
      for (const topic of topics) {
        assignment[topic] = cluster.findTopicPartitionMetadata(topic).map((p) => p.partitionId);
      }
      return decoded.map((m) => ({
        memberId: m.memberId,
        memberAssignment: AssignerProtocol.MemberAssignment.encode({
          version,
          assignment: m.memberId === owner?.memberId ? assignment : {},
          userData: Buffer.alloc(0),
        }),
      }));
    },
  });
}

/** A record's bytes without a copy (kafkajs values are views of the fetch response, which they keep alive). */
function view(value: Buffer | null): Uint8Array {
  return value === null
    ? new Uint8Array(0)
    : new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
}

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

class KafkaWriterLease implements WriterLease {
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
  private owner = false;
  private readonly stateChanged: Array<() => void> = [];

  constructor(
    kafka: Kafka,
    private readonly log: KafkaLog,
    opts: KafkaLogOptions,
    private readonly txLimits: BatchLimits,
  ) {
    this.topics = opts.topics;
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
    try {
      await abortable(gotPartition, signal);
      // Fencing: bumps the epoch of the transactional id and aborts (or waits out) the previous holder's open transaction.
      await this.producer.connect();
      const st = await this.log.writerState();
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
      await Promise.race([this.waitState(), sleep(1_000)]);
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
      const metadata = JSON.stringify({
        txEnd: this.txEnd + c.tx.length,
        rejEnd: this.rejEnd + c.rejections.length,
      });
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
