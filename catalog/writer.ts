import { abortable, sleep } from "../schema/abort.ts";
import {
  decodeProposalValue,
  type Proposal,
  ProposalMsg,
  type Rejection,
  RejectionMsg,
  TxMsg,
  type TxRecord,
} from "../schema/catalog.ts";
import type { Logger } from "../schema/log.ts";
import { type Backoff, backoffMs } from "../schema/retry.ts";
import { encodeTx } from "../schema/tx-encode.ts";
import { decodeMessage, encodeMessage, openMessage, WireError } from "../schema/wire.ts";
import { mayBePacked, PackedRecordError, PROPOSAL_BATCH, packedItems, unpack } from "./kafka/records.ts";
import {
  CatalogLogError,
  type LogRecord,
  type TxLogReader,
  type WriterCommit,
  type WriterLease,
  type WriterLog,
} from "./log.ts";
import type { ResolveResult } from "./rules.ts";

/** Between lease attempts after a failure: 100 ms · 2^(failures−1), at most 5 s. */
const LEASE_BACKOFF: Backoff = { baseMs: 100, capMs: 5_000 };

/**
 * The catalog writer: the one process that turns proposals into the total
 * order of catalog.tx.
 *
 * Design
 * ------
 *  standby ──acquire lease──▶ catch up ──▶ active ──lease lost──▶ (fresh db) standby …
 *
 *  - Standby: the writer tails catalog.tx into its own db (like a replica)
 *    while it waits in `acquireWriter`, so a takeover replays only the last
 *    few transactions instead of the whole log.
 *  - Takeover: acquiring the lease fences the previous holder (Kafka: the
 *    fixed transactional id's epoch is bumped and its open transaction
 *    aborted) and yields `txEnd` and `proposalsOffset` as committed by the
 *    last successful batch. The writer applies catalog.tx up to exactly
 *    `txEnd` (invariant: db.lastTxNo === txEnd, txNo = logical offset + 1),
 *    stops tailing, and runs.
 *  - Active: each batch of proposals is decided by `decideBatch` (decode,
 *    size check, resolve against the db, number consecutively, apply) and the
 *    lease commits the resulting tx records, rejections and the consumed
 *    proposal offset in one atomic step (one Kafka transaction). Nothing of a
 *    batch is visible unless all of it is.
 *  - Lease lost (fenced, broker unreachable beyond the client's retries,
 *    partition moved): the db may hold a batch that was never committed, so
 *    it is discarded; the writer starts over as a standby with an empty db.
 *    Consecutive losses without a committed batch back off (bounded) and,
 *    past a bound, the writer stops with the last error.
 *  - Exactly once: a proposal's effects reach catalog.tx only in the
 *    transaction that also advances the consumed offset past it, so a crash
 *    anywhere either redoes the whole batch (nothing was committed) or skips
 *    it (it was). A proposal delivered twice (a client retry: same id) is
 *    applied once — `resolve` reports the second as a duplicate, which becomes
 *    a rejection naming the earlier application.
 *  - Bad input never stops the writer: bytes over `maxProposalBytes`, bytes
 *    that do not decode as a proposal, and proposals that fail validation
 *    each become a rejection with a reason. A proposal batch
 *    (`catalog.proposal.batch`, catalog/kafka/records.ts) is decided
 *    proposal by proposal; one that does not unpack, or is over its bounds,
 *    is one rejection.
 */

/** What the writer needs of a catalog db (catalog/db.ts CatalogDb satisfies it). */
export interface WriterDb {
  /** `now`: the writer's clock, ms since the epoch (lease expiry). */
  resolve(p: Proposal, now: number): ResolveResult;
  apply(tx: TxRecord): void;
  readonly lastTxNo: number;
}

export interface DecideLimits {
  /** Proposals larger than this are rejected undecoded. */
  readonly maxProposalBytes: number;
}

/** Default bound on one proposal's encoded size (1 MiB). */
export const DEFAULT_MAX_PROPOSAL_BYTES = 1 << 20;

/**
 * Decides one batch: values in (db, proposals, the writer's clock reading),
 * commit out; the db advances by the accepted txs. No I/O, no clock.
 */
export function decideBatch(
  db: WriterDb,
  proposals: readonly LogRecord[],
  now: number,
  limits: DecideLimits,
): WriterCommit & { readonly accepted: number; readonly rejected: number } {
  const tx: Uint8Array[] = [];
  const rejections: Uint8Array[] = [];
  const reject = (r: Rejection) => rejections.push(encodeMessage(RejectionMsg, r));
  const oversized = (offset: number, bytes: Uint8Array): void => {
    reject({
      proposalId: null,
      clientId: null,
      reason: `oversized: proposal of ${bytes.length} bytes exceeds the ${limits.maxProposalBytes}-byte limit`,
      proposalOffset: offset,
    });
  };
  /** The envelope of bytes, or undefined once they are rejected as malformed. */
  const open = (offset: number, bytes: Uint8Array): ReturnType<typeof openMessage> | undefined => {
    try {
      return openMessage(bytes);
    } catch (err) {
      if (!(err instanceof WireError)) throw err;
      reject({
        proposalId: null,
        clientId: null,
        reason: `malformed: ${err.message}`,
        proposalOffset: offset,
      });
      return undefined;
    }
  };
  const decideOpened = (offset: number, env: ReturnType<typeof openMessage>): void => {
    let p: Proposal;
    try {
      if (env.kind !== ProposalMsg.kind)
        throw new WireError(`expected a ${ProposalMsg.kind} message, got ${env.kind}`);
      p = decodeProposalValue(env.value);
    } catch (err) {
      if (!(err instanceof WireError)) throw err;
      reject({
        proposalId: null,
        clientId: null,
        reason: `malformed: ${err.message}`,
        proposalOffset: offset,
      });
      return;
    }
    const r = db.resolve(p, now);
    if (!r.ok) {
      reject({
        proposalId: p.id,
        clientId: p.clientId,
        reason: r.duplicate ? `duplicate: ${r.reason}` : r.reason,
        proposalOffset: offset,
      });
      return;
    }
    const record: TxRecord = {
      txNo: db.lastTxNo + 1,
      proposalId: p.id,
      clientId: p.clientId,
      time: now,
      datoms: r.datoms,
    };
    let encoded: Uint8Array;
    try {
      encoded = encodeTx(record);
    } catch (err) {
      if (!(err instanceof WireError)) throw err;
      reject({ proposalId: p.id, clientId: p.clientId, reason: err.message, proposalOffset: offset });
      return;
    }
    db.apply(record);
    tx.push(encoded);
  };
  /** A batch's item: one proposal, never unpacked again. */
  const decideItem = (offset: number, bytes: Uint8Array): void => {
    if (bytes.length > limits.maxProposalBytes) {
      oversized(offset, bytes);
      return;
    }
    const env = open(offset, bytes);
    if (env !== undefined) decideOpened(offset, env);
  };
  const refuseBatch = (offset: number, err: unknown): void => {
    if (!(err instanceof PackedRecordError)) throw err;
    reject({
      proposalId: null,
      clientId: null,
      reason: `${err.problem}: ${err.message}`,
      proposalOffset: offset,
    });
  };
  for (const rec of proposals) {
    // A record is a proposal, or a proposal batch (catalog/kafka/records.ts) that the transport handed
    // over whole — the embedded log never unpacks, and the Kafka log hands over one it could not unpack —
    // decided item by item, or refused as a whole with the reason. Its envelope is opened once and its
    // kind decides which; only a record over the proposal limit is scanned for the batch kind first, so
    // that an oversized proposal is refused undecoded.
    const { offset, bytes } = rec;
    if (bytes.length > limits.maxProposalBytes) {
      if (!mayBePacked(PROPOSAL_BATCH, bytes)) {
        oversized(offset, bytes);
        continue;
      }
      let items: Uint8Array[] | undefined;
      try {
        items = unpack(PROPOSAL_BATCH, bytes);
      } catch (err) {
        refuseBatch(offset, err);
        continue;
      }
      if (items === undefined) oversized(offset, bytes);
      else for (const item of items) decideItem(offset, item);
      continue;
    }
    const env = open(offset, bytes);
    if (env === undefined) continue;
    if (env.kind !== PROPOSAL_BATCH.kind) {
      decideOpened(offset, env);
      continue;
    }
    let items: Uint8Array[];
    try {
      items = packedItems(PROPOSAL_BATCH, env.value, bytes.length);
    } catch (err) {
      refuseBatch(offset, err);
      continue;
    }
    for (const item of items) decideItem(offset, item);
  }
  return { tx, rejections, accepted: tx.length, rejected: rejections.length };
}

export interface CatalogWriterOptions<D extends WriterDb> {
  readonly log: TxLogReader & WriterLog;
  readonly newDb: () => D;
  readonly logger: Logger;
  readonly maxProposalBytes?: number;
  /**
   * Consecutive lease losses without a committed batch before the writer gives
   * up (default 60). With the backoff capped at 5 s that is at least
   * 0.1 + 0.2 + … + 3.2 + 54 × 5 ≈ 276 s of outage: a broker restart (tens of
   * seconds, each attempt refused at once) must not exhaust it, or the fleet
   * is left without a writer.
   */
  readonly maxConsecutiveFailures?: number;
  readonly clock?: () => number;
  /** Told of each lease loss (after it is logged): its cause and the consecutive count. */
  readonly onLeaseLost?: (err: Error, failures: number) => void;
}

export class CatalogWriter<D extends WriterDb> {
  private readonly stopping = new AbortController();
  private stopLease: (() => Promise<void>) | undefined;
  private db: D | undefined;

  constructor(private readonly opts: CatalogWriterOptions<D>) {}

  /** The db of the current role (standby or active); replaced on every lease loss. */
  get current(): D | undefined {
    return this.db;
  }

  /**
   * Runs standby → active until stop() (resolves) or too many consecutive
   * lease losses (rejects with the last error).
   */
  async run(): Promise<void> {
    const { log, logger } = this.opts;
    const limits = { maxProposalBytes: this.opts.maxProposalBytes ?? DEFAULT_MAX_PROPOSAL_BYTES };
    const maxFailures = this.opts.maxConsecutiveFailures ?? 60;
    const clock = this.opts.clock ?? Date.now;
    let failures = 0;
    while (!this.stopping.signal.aborted) {
      const db = this.opts.newDb();
      this.db = db;
      let lease: WriterLease | undefined;
      try {
        const caughtUp = new Tail(db);
        const tail = await log.subscribe(0, (records) => caughtUp.apply(records));
        logger.log("info", "writer.standby", {});
        let granted: WriterLease;
        try {
          granted = await log.acquireWriter(this.stopping.signal);
          lease = granted;
          await caughtUp.reach(granted.txEnd, this.stopping.signal, tail.ended);
        } finally {
          await tail.stop();
        }
        if (db.lastTxNo !== granted.txEnd) {
          throw new CatalogLogError(`writer db holds ${db.lastTxNo} txs, the log ${granted.txEnd}`);
        }
        this.stopLease = () => granted.stop();
        if (this.stopping.signal.aborted) {
          await granted.stop();
          break;
        }
        logger.log("info", "writer.active", {
          pid: process.pid,
          txEnd: granted.txEnd,
          proposalsOffset: granted.proposalsOffset,
        });
        await granted.run((proposals) => {
          const out = decideBatch(db, proposals, clock(), limits);
          logger.log("debug", "writer.batch", {
            from: proposals[0]?.offset,
            count: proposals.length,
            accepted: out.accepted,
            rejected: out.rejected,
          });
          return out;
        });
      } catch (err) {
        if (this.stopping.signal.aborted) break;
        // Progress is a commit that succeeded; a batch decided and then lost with its commit is not.
        failures = (lease?.commits ?? 0) > 0 ? 1 : failures + 1;
        logger.log("warn", "writer.lease_lost", { error: (err as Error).message, failures });
        this.opts.onLeaseLost?.(err as Error, failures);
        if (failures >= maxFailures) throw err;
        await sleep(backoffMs(LEASE_BACKOFF, failures), this.stopping.signal);
      } finally {
        this.stopLease = undefined;
      }
    }
    logger.log("info", "writer.stopped", {});
  }

  /** Stops waiting or writing; a batch being committed completes first. */
  async stop(): Promise<void> {
    this.stopping.abort(new CatalogLogError("writer stopped"));
    await this.stopLease?.();
  }
}

/** Applies catalog.tx records to a db and lets a caller wait for a given count. */
class Tail {
  private readonly waiters: Array<() => void> = [];
  constructor(private readonly db: WriterDb) {}

  async apply(records: readonly LogRecord[]): Promise<void> {
    for (const r of records) this.db.apply(decodeMessage(TxMsg, r.bytes));
    for (const w of this.waiters.splice(0)) w();
  }

  /** Waits until the db holds `txEnd` txs; rejects if the subscription feeding it ends first (it never would). */
  async reach(txEnd: number, signal: AbortSignal, ended: Promise<void>): Promise<void> {
    const gone = ended.then(() => {
      throw new CatalogLogError(`the writer's catalog.tx tail ended at ${this.db.lastTxNo} of ${txEnd} txs`);
    });
    gone.catch(() => undefined);
    while (this.db.lastTxNo < txEnd) {
      await abortable(
        Promise.race([new Promise<void>((resolve) => this.waiters.push(resolve)), gone]),
        signal,
      );
    }
  }
}
