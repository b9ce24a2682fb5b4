import type { DB } from "datascript";
import { TxMsg, type TxRecord } from "../schema/catalog.ts";
import { decodeMessage } from "../schema/wire.ts";
import { CatalogDb } from "./db.ts";
import type { LogRecord, TxLogReader } from "./log.ts";
import { loadLatestSnapshot, type SnapshotStore, writeSnapshot } from "./snapshot.ts";

/**
 * A catalog replica: follows `catalog.tx` from the newest snapshot's offset
 * (or 0) and applies each tx to its CatalogDb, in order, once.
 *
 * Offsets: the tx at log offset n has txNo n + 1, so after applying it the db
 * holds n + 1 txs and `offset()` (the next offset to read) equals
 * `db.lastTxNo`. Two replicas at the same offset hold identical dbs (equal
 * `dbHash()`), since apply is deterministic and the log is one total order.
 *
 * A tx that does not decode, or does not apply, stops the replica for good
 * (it cannot skip a tx: later ones depend on it); `waitFor` then rejects with
 * the reason. Listeners see every applied batch as tx reports, after the db
 * includes them.
 */
export interface TxReport {
  /** Log offset of the tx. */
  readonly offset: number;
  readonly tx: TxRecord;
}

export type ReplicaListener = (reports: readonly TxReport[], db: CatalogDb) => void;

export interface ReplicaOptions {
  readonly log: TxLogReader;
  /** Where snapshots are read from at start and written to. */
  readonly snapshots?: SnapshotStore;
  /** Write a snapshot every this many txs (needs `snapshots`; 0 or absent: never). */
  readonly snapshotEvery?: number;
  /**
   * "eager": fold every applied batch into the DataScript db at once (Datalog
   * always current, apply bound by DataScript's transact rate); "lazy"
   * (default): fold when `datalog()` is asked for.
   */
  readonly datalog?: "eager" | "lazy";
  /** Start from 0 even when a snapshot exists (a reference replica). */
  readonly ignoreSnapshots?: boolean;
  readonly warn?: (msg: string) => void;
}

export class ReplicaError extends Error {
  override readonly name = "ReplicaError";
}

interface Waiter {
  readonly offset: number;
  readonly resolve: () => void;
  readonly reject: (e: Error) => void;
}

export class Replica {
  private readonly listeners = new Set<ReplicaListener>();
  private waiters: Waiter[] = [];
  private failure: Error | undefined;
  private sub: { stop(): Promise<void> } | undefined;
  private lastSnapshotAt: number;
  /** LogRecord.position of the last tx applied (kept with snapshots), when the log gives one. */
  private lastPosition: number | undefined;
  private stopped = false;

  private constructor(
    private db: CatalogDb,
    private readonly opts: ReplicaOptions,
    /** Offset this replica started from (the snapshot's, or 0). */
    readonly startOffset: number,
  ) {
    this.lastSnapshotAt = startOffset;
  }

  static async start(opts: ReplicaOptions): Promise<Replica> {
    const every = opts.snapshotEvery ?? 0;
    if (!Number.isSafeInteger(every) || every < 0)
      throw new ReplicaError(`snapshotEvery must be ≥ 0, got ${every}`);
    if (every > 0 && opts.snapshots === undefined)
      throw new ReplicaError("snapshotEvery needs a snapshot store");
    const snap =
      opts.snapshots !== undefined && !opts.ignoreSnapshots
        ? await loadLatestSnapshot(opts.snapshots, opts.warn)
        : undefined;
    const replica = new Replica(snap?.db ?? CatalogDb.empty(), opts, snap?.offset ?? 0);
    replica.lastPosition = snap?.position;
    replica.sub = await opts.log.subscribe(
      replica.startOffset,
      (records) => replica.onBatch(records),
      snap?.position === undefined ? undefined : { position: snap.position },
    );
    return replica;
  }

  /** The db (read-only by contract: only the replica applies to it). */
  get catalog(): CatalogDb {
    return this.db;
  }

  /** Next log offset to apply = txs applied. */
  offset(): number {
    return this.db.lastTxNo;
  }

  dbHash(): string {
    return this.db.dbHash();
  }

  /** The DataScript db at the current offset. */
  datalog(): DB {
    return this.db.datalog();
  }

  /** Registers a listener; returns its removal. */
  listen(fn: ReplicaListener): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /** Resolves once every tx before `offset` is applied (offset() ≥ offset). */
  waitFor(offset: number, timeoutMs?: number): Promise<void> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.offset() >= offset) return Promise.resolve();
    if (this.stopped) return Promise.reject(new ReplicaError("the replica is stopped"));
    return new Promise<void>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const w: Waiter = {
        offset,
        resolve: () => {
          if (timer) clearTimeout(timer);
          resolve();
        },
        reject: (e) => {
          if (timer) clearTimeout(timer);
          reject(e);
        },
      };
      this.waiters.push(w);
      if (timeoutMs !== undefined) {
        timer = setTimeout(() => {
          this.waiters = this.waiters.filter((x) => x !== w);
          reject(
            new ReplicaError(
              `replica at offset ${this.offset()} did not reach ${offset} within ${timeoutMs} ms`,
            ),
          );
        }, timeoutMs);
      }
    });
  }

  /** Catches up with the log's current end. */
  async catchUp(timeoutMs?: number): Promise<void> {
    await this.waitFor(await this.opts.log.endOffset(), timeoutMs);
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    await this.sub?.stop();
    for (const w of this.waiters) w.reject(new ReplicaError("the replica is stopped"));
    this.waiters = [];
  }

  private async onBatch(records: readonly LogRecord[]): Promise<void> {
    if (this.failure || this.stopped) return;
    const reports: TxReport[] = [];
    try {
      for (const r of records) {
        if (r.offset < this.offset()) continue; // redelivered after a reconnect: already applied
        if (r.offset !== this.offset())
          throw new ReplicaError(`gap in catalog.tx: expected offset ${this.offset()}, got ${r.offset}`);
        const tx = decodeMessage(TxMsg, r.bytes);
        if (tx.txNo !== r.offset + 1)
          throw new ReplicaError(
            `catalog.tx offset ${r.offset} carries txNo ${tx.txNo}, expected ${r.offset + 1}`,
          );
        this.db.apply(tx);
        this.lastPosition = r.position;
        reports.push({ offset: r.offset, tx });
      }
    } catch (err) {
      this.fail(new ReplicaError(`replica stopped at offset ${this.offset()}: ${(err as Error).message}`));
      return;
    }
    if (reports.length === 0) return;
    if (this.opts.datalog === "eager") this.db.datalog();
    for (const fn of this.listeners) {
      try {
        fn(reports, this.db);
      } catch (err) {
        this.opts.warn?.(`catalog replica listener failed: ${(err as Error).message}`);
      }
    }
    const at = this.offset();
    const ready = this.waiters.filter((w) => w.offset <= at);
    if (ready.length > 0) {
      this.waiters = this.waiters.filter((w) => w.offset > at);
      for (const w of ready) w.resolve();
    }
    const every = this.opts.snapshotEvery ?? 0;
    if (every > 0 && at - this.lastSnapshotAt >= every && this.opts.snapshots) {
      try {
        await writeSnapshot(this.opts.snapshots, this.db, this.lastPosition);
        this.lastSnapshotAt = at;
      } catch (err) {
        // A failed snapshot loses nothing (the log has every tx); try again after `every` more.
        this.lastSnapshotAt = at;
        this.opts.warn?.(`catalog snapshot at ${at} failed: ${(err as Error).message}`);
      }
    }
  }

  private fail(err: Error): void {
    this.failure = err;
    this.opts.warn?.(err.message);
    for (const w of this.waiters) w.reject(err);
    this.waiters = [];
  }
}
