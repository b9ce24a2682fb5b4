import { randomUUID } from "node:crypto";
import type { CatalogDb } from "../../catalog/db.ts";
import type { ProposalSink } from "../../catalog/log.ts";
import type { Replica } from "../../catalog/replica.ts";
import { abortable } from "../../schema/abort.ts";
import { type CatalogOp, ProposalMsg, type Tier } from "../../schema/catalog.ts";
import type { ModelFingerprint, NodeId } from "../../schema/ids.ts";
import { encodeMessage } from "../../schema/wire.ts";

/**
 * This worker's side of the catalog: proposals out (through the log's
 * proposals stream), facts in (through its own replica). Publication is only
 * ever proposed here after the store confirmed the bytes; nothing becomes
 * visible until the writer accepted it and the replica applied it.
 */
export interface CatalogIdentity {
  readonly workerId: string;
  readonly fingerprint: ModelFingerprint;
  readonly modelName: string;
  /** The model's attention-state layout (chunk/layout must equal it). */
  readonly layout: string;
  readonly chunkTokens: number;
}

export class CatalogLink {
  /** A per-process nonce so proposal ids of a restarted worker never collide with its last life's. */
  private readonly nonce = randomUUID().slice(0, 8);
  private seq = 0;

  constructor(
    readonly sink: ProposalSink,
    readonly replica: Replica,
    readonly id: CatalogIdentity,
  ) {}

  get db() {
    return this.replica.catalog;
  }

  /** Appends one proposal; resolves once the log holds it (not once it is applied). */
  async propose(ops: readonly CatalogOp[]): Promise<void> {
    const proposal = {
      id: `${this.id.workerId}/${this.nonce}/${++this.seq}`,
      clientId: this.id.workerId,
      ops,
    };
    await this.sink.propose(encodeMessage(ProposalMsg, proposal));
  }

  /** Registers the model and this worker (with its peer address) and waits until the replica holds both. */
  async register(address: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    const { fingerprint, modelName, layout, chunkTokens, workerId } = this.id;
    await this.propose([
      { op: "model.registered", fingerprint, name: modelName, layout, chunkTokens },
      { op: "worker.registered", worker: workerId, model: fingerprint, address },
    ]);
    const ok = await this.waitUntil(
      () => {
        const w = this.db.eidOf("worker/id", workerId);
        return w !== undefined && this.db.get(w, "worker/address") === address;
      },
      timeoutMs,
      signal,
    );
    if (!ok) throw new Error(`catalog: worker ${workerId} was not registered within ${timeoutMs} ms`);
  }

  /**
   * A process starts with empty RAM: its RAM replicas from an earlier life are
   * proposed removed so no one plans on them (a scan of the catalog, once at start).
   */
  async forgetRam(): Promise<number> {
    const db = this.db;
    const me = db.eidOf("worker/id", this.id.workerId);
    if (me === undefined) return 0;
    const ops: CatalogOp[] = [];
    for (const r of db.holders("replica/worker")) {
      if (!isReadyRamOf(db, r, me)) continue;
      const node = db.get(db.get(r, "replica/chunk") as number, "chunk/node") as NodeId;
      ops.push({
        op: "replica.removed",
        node,
        worker: this.id.workerId,
        tier: "ram",
        verifiedAt: Date.now(),
      });
    }
    for (let i = 0; i < ops.length; i += 1024) await this.propose(ops.slice(i, i + 1024));
    return ops.length;
  }

  /**
   * forgetRam, then waits (bounded) until the replica no longer lists any of
   * them as ready. Runs before register(): the removals are valid only while
   * the catalog still lists this worker under the model those replicas are
   * of, and a worker restarted with another model re-registers under it.
   */
  async forgetRamApplied(timeoutMs: number, signal?: AbortSignal): Promise<void> {
    if ((await this.forgetRam()) === 0) return;
    const me = this.db.eidOf("worker/id", this.id.workerId);
    const ok = await this.waitUntil(
      () => {
        if (me === undefined) return true;
        for (const r of this.db.holders("replica/worker")) if (isReadyRamOf(this.db, r, me)) return false;
        return true;
      },
      timeoutMs,
      signal,
    );
    if (!ok)
      throw new Error(
        `catalog: RAM replicas of ${this.id.workerId} were not withdrawn within ${timeoutMs} ms`,
      );
  }

  /** Ready replica of `node` on this worker's `tier` in the local replica. */
  holdsReady(node: NodeId, tier: Tier): boolean {
    const c = this.db.eidOf("chunk/node", node);
    if (c === undefined) return false;
    for (const r of this.db.replicasOf(c)) {
      if (this.db.get(r, "replica/tier") !== tier || this.db.get(r, "replica/state") !== "ready") continue;
      const w = this.db.get(r, "replica/worker") as number;
      if (this.db.get(w, "worker/id") === this.id.workerId) return true;
    }
    return false;
  }

  /** Peer address of a worker, from the catalog. */
  addressOf(worker: string): string | undefined {
    const w = this.db.eidOf("worker/id", worker);
    return w === undefined ? undefined : (this.db.get(w, "worker/address") as string | undefined);
  }

  /**
   * Resolves true when `pred` holds on the replica (checked now and after
   * each applied batch), false at the deadline; rejects with the signal's
   * reason when it aborts first (a start-up that has already failed).
   */
  waitUntil(pred: () => boolean, timeoutMs: number, signal?: AbortSignal): Promise<boolean> {
    if (pred()) return Promise.resolve(true);
    let stop = () => {};
    let timer: NodeJS.Timeout | undefined;
    const waiting = new Promise<boolean>((resolve) => {
      stop = this.replica.listen(() => {
        if (!pred()) return;
        clearTimeout(timer);
        stop();
        resolve(true);
      });
      timer = setTimeout(() => {
        stop();
        resolve(pred());
      }, timeoutMs);
    });
    return abortable(waiting, signal).finally(() => {
      clearTimeout(timer);
      stop();
    });
  }
}

/** True when replica entity r is a ready RAM copy held by worker entity `worker`. */
function isReadyRamOf(db: CatalogDb, r: number, worker: number): boolean {
  return (
    db.get(r, "replica/worker") === worker &&
    db.get(r, "replica/tier") === "ram" &&
    db.get(r, "replica/state") === "ready"
  );
}
