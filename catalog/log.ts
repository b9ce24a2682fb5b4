/**
 * The catalog log: the transport under the event-sourced catalog.
 *
 * Three streams, named after their Kafka topics:
 *   - `catalog.proposals`  anyone appends proposals (ProposalSink);
 *   - `catalog.tx`         the single writer appends accepted transactions; the
 *                          total order every replica replays (TxLogReader);
 *   - `catalog.rejections` the writer appends a record per refused proposal.
 *
 * Offsets of `catalog.tx` are LOGICAL and dense: the n-th committed record has
 * offset n (0, 1, 2, …) in every implementation. For Kafka this differs from
 * the partition offset, which also counts transaction markers and aborted
 * records; the Kafka log stamps each record with its logical offset (header
 * `continuum-offset`) so a snapshot taken at offset N means the same thing in
 * the embedded log and in Kafka, and `endOffset()` is exactly one past the
 * last record a subscriber will ever be handed.
 *
 * The writer side (WriterLog) is what makes "consume → produce → commit"
 * atomic: a batch of proposals is consumed, and its transactions, rejections
 * and the consumed proposal offset are committed together or not at all.
 * Exactly one lease is active at a time; acquiring one fences the previous
 * holder (a zombie's later commits fail).
 */

export interface LogRecord {
  readonly offset: number;
  readonly bytes: Uint8Array;
  /**
   * Where this transport can start reading to reach this record again, when
   * that is not the offset itself: for Kafka the partition offset of the
   * packed record that carries it. Absent where offsets are positions
   * (the embedded log). A replica keeps it with its snapshots, so a replica
   * started from one seeks straight there instead of skipping forward.
   */
  readonly position?: number;
}

/** A hint for subscribe: a `LogRecord.position` at or before the first record wanted. */
export interface SubscribeFrom {
  readonly position?: number;
}

/** A running subscription to catalog.tx or catalog.rejections. */
export interface Subscription {
  /** Stops delivery; the onBatch call in progress finishes first. */
  stop(): Promise<void>;
  /**
   * Pending while records are delivered; rejects with the cause when delivery
   * ends without stop() (onBatch threw, a gap, the transport gave up), so a
   * caller waiting for records can stop waiting; resolves after stop().
   */
  readonly ended: Promise<void>;
}

export interface TxLogReader {
  /**
   * Delivers catalog.tx records from `fromOffset` in order, in batches, until
   * stop(); onBatch is awaited (back-pressure). `from.position` (a record's
   * position at or before `fromOffset`) saves the transport a search; a
   * position past `fromOffset` is an error (a gap), never a silent skip.
   * Transports whose offsets are positions ignore it.
   */
  subscribe(
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
    from?: SubscribeFrom,
  ): Promise<Subscription>;
  /** Offset one past the last record of catalog.tx. */
  endOffset(): Promise<number>;
}

export interface ProposalSink {
  /** Resolves once the proposal is durably appended to catalog.proposals (acknowledged = never lost). */
  propose(bytes: Uint8Array): Promise<void>;
}

export interface CatalogLog extends TxLogReader, ProposalSink {
  close(): Promise<void>;
}

/** What the writer appends for one consumed batch of proposals. */
export interface WriterCommit {
  /** Encoded catalog.tx records, in order; they get consecutive logical offsets from the lease's `txEnd`. */
  readonly tx: readonly Uint8Array[];
  /** Encoded catalog.rejections records. */
  readonly rejections: readonly Uint8Array[];
}

/**
 * The right to write, held by one writer at a time. Obtained from
 * `WriterLog.acquireWriter`; lost when stopped, when fenced by a newer
 * holder, or on any transport error (the holder then rebuilds its state from
 * catalog.tx and acquires again: its in-memory db may include a batch that
 * was never committed).
 */
export interface WriterLease {
  /** Logical end of catalog.tx when the lease was granted: the writer's db must hold exactly [0, txEnd) before it runs. */
  readonly txEnd: number;
  /** Offset in catalog.proposals of the first proposal not yet committed. */
  readonly proposalsOffset: number;
  /**
   * Batches this lease has committed so far (a handler call is not a
   * commit: a commit that fails after its batch was decided never counts).
   * The writer's retry loop reads it to tell progress from a failed try.
   */
  readonly commits: number;
  /**
   * Delivers uncommitted proposals in batches (offsets non-decreasing from
   * `proposalsOffset`; proposals a transport packed in one record share its
   * offset, and are committed together) and commits the results of one or more consecutive
   * handler calls together with "consumed up to their last proposal + 1"
   * atomically, in order. An implementation may pipeline: call the handler
   * for the next batches while the previous commit is in flight (so the
   * handler's state can run ahead of what is committed). Resolves after
   * stop(); rejects when the lease is lost (fenced, transport failure,
   * handler error) — nothing of an uncommitted batch is visible then, and
   * the holder must discard state derived from batches not yet committed.
   */
  run(handler: (proposals: readonly LogRecord[]) => Promise<WriterCommit> | WriterCommit): Promise<void>;
  /** Stops delivering; the batch in progress finishes its commit first. Idempotent. */
  stop(): Promise<void>;
}

export interface WriterLog {
  /**
   * Waits until this process may be the active writer (a standby waits here
   * while another holds the lease), fences any previous holder, and returns
   * the lease with the state to resume from. Rejects if `signal` aborts first.
   */
  acquireWriter(signal?: AbortSignal): Promise<WriterLease>;
}

/** Reads catalog.rejections (for tests, the tail and operators). */
export interface RejectionReader {
  subscribeRejections(
    fromOffset: number,
    onBatch: (records: readonly LogRecord[]) => Promise<void>,
  ): Promise<Subscription>;
}

/** The whole log as the writer process and the test suites see it. */
export interface FullCatalogLog extends CatalogLog, WriterLog, RejectionReader {}

/** A log operation on a closed log, or an offset out of range: a caller bug, named. */
export class CatalogLogError extends Error {
  override readonly name = "CatalogLogError";
}

/** Checks a subscription start: a non-negative integer. */
export function checkOffset(what: string, offset: number): void {
  if (!Number.isSafeInteger(offset) || offset < 0) {
    throw new CatalogLogError(`${what}: offset must be a non-negative integer, got ${String(offset)}`);
  }
}
