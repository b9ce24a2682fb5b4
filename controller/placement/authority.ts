import { randomUUID } from "node:crypto";
import type { ProposalSink } from "../../catalog/log.ts";
import type { Replica } from "../../catalog/replica.ts";
import { type CatalogOp, ProposalMsg } from "../../schema/catalog.ts";
import type { ModelFingerprint, NodeId, WorkerId } from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import { encodeMessage } from "../../schema/wire.ts";
import { leaseFact, placementInput, placementOps } from "./catalog-input.ts";
import { DecayedDemand } from "./demand.ts";
import { claimFrom, type LeaseClaim, mayIssue, nextLeaseAction } from "./lease.ts";
import { type PlacedTier, type PlacementPlan, type PlacementPolicy, planPlacements } from "./policy.ts";

/**
 * The placement authority: a role of the controller. Every `intervalMs` it
 *
 *  1. renews its lease on `key`, or acquires it once the holder let it lapse
 *     (controller/placement/lease.ts: the writer judges expiry, this process
 *     acts only within a claim measured from when it sent the acquire);
 *  2. while it holds a claim: reads the policy's input from its catalog
 *     replica (decayed demand of the `demand.observed` facts, the published
 *     chunks on their chains, the current placements) and the live, ready
 *     workers, plans (controller/placement/policy.ts, pure) and proposes the
 *     changes as `placement.set` ops at its epoch.
 *
 * Any number of controllers run one; one issues at a time. A placement it
 * sends late (after the writer saw a takeover, or after its lease expired)
 * is rejected by the writer, never applied. Bounds: one lease proposal and at
 * most one placement proposal (≤ policy.maxChanges ops) per interval; one
 * round at a time (a slow round skips ticks); demand of at most
 * `maxDemandNodes` nodes.
 */

export interface AuthorityReplica {
  readonly catalog: Replica["catalog"];
  listen: Replica["listen"];
}

export interface PlacementAuthorityOptions {
  /** The lease key (one authority per key: the fleet's model). */
  readonly key: string;
  /** This candidate's holder name; a per-process nonce is appended, so two processes never share one. */
  readonly holder: string;
  readonly fingerprint: ModelFingerprint;
  readonly intervalMs: number;
  readonly leaseTtlMs: number;
  readonly halfLifeMs: number;
  readonly maxDemandNodes: number;
  readonly budgetBytes: Readonly<Record<PlacedTier, number>>;
  readonly policy: PlacementPolicy;
  /** Workers that may hold copies now (live and ready). */
  readonly workers: () => readonly WorkerId[];
  readonly log: Logger;
  /** Monotonic clock (default performance.now); tests freeze it to make a holder late. */
  readonly monoNow?: () => number;
  /** Wall clock (default Date.now): demand decay, and skipping acquires the writer would refuse. */
  readonly wallNow?: () => number;
}

export interface AuthorityCounters {
  rounds: number;
  acquired: number;
  renewed: number;
  lost: number;
  plans: number;
  placementsProposed: number;
  withdrawalsProposed: number;
  proposeFailures: number;
}

/** How long a lease proposal may take to show in the replica before the round gives up on it. */
const CONFIRM_FRACTION = 0.5;

export class PlacementAuthority {
  readonly holderId: string;
  private claim: LeaseClaim | null = null;
  private timer: NodeJS.Timeout | null = null;
  private round: Promise<void> | null = null;
  private stopped = false;
  private seq = 0;
  private readonly demand: DecayedDemand;
  private readonly unlisten: () => void;
  private readonly mono: () => number;
  private readonly wall: () => number;
  lastPlan: PlacementPlan | null = null;
  readonly counters: AuthorityCounters = {
    rounds: 0,
    acquired: 0,
    renewed: 0,
    lost: 0,
    plans: 0,
    placementsProposed: 0,
    withdrawalsProposed: 0,
    proposeFailures: 0,
  };

  constructor(
    private readonly replica: AuthorityReplica,
    private readonly sink: ProposalSink,
    private readonly opts: PlacementAuthorityOptions,
  ) {
    if (!(opts.intervalMs > 0)) throw new RangeError("placement intervalMs must be > 0");
    if (!(opts.leaseTtlMs > 2 * opts.intervalMs))
      throw new RangeError(
        `controller.placement.leaseTtlMs (${opts.leaseTtlMs}) must exceed two controller.placement.intervalMs (${2 * opts.intervalMs} ms): a holder renews once per interval`,
      );
    this.holderId = `${opts.holder}.${randomUUID().slice(0, 8)}`;
    this.mono = opts.monoNow ?? (() => performance.now());
    this.wall = opts.wallNow ?? (() => Date.now());
    this.demand = new DecayedDemand(opts.halfLifeMs, opts.maxDemandNodes);
    const db = replica.catalog;
    for (const e of db.holders("demand/count")) this.addDemand(e);
    this.unlisten = replica.listen((reports) => {
      for (const { tx } of reports)
        for (const [e, a, , added] of tx.datoms) if (added && a === "demand/count") this.addDemand(e);
    });
  }

  private addDemand(e: number): void {
    const db = this.replica.catalog;
    const model = db.get(e, "demand/model") as number;
    if (db.get(model, "model/fingerprint") !== this.opts.fingerprint) return;
    this.demand.add(
      db.get(e, "demand/node") as NodeId,
      db.get(e, "demand/count") as number,
      db.get(e, "demand/time") as number,
    );
  }

  /** The epoch this process may issue at now, or null. */
  get epoch(): number | null {
    return mayIssue(this.claim, this.mono()) ? this.claim.epoch : null;
  }

  start(): void {
    if (this.timer !== null) return;
    this.timer = setInterval(() => void this.tick(), this.opts.intervalMs);
    void this.tick();
  }

  /** One round now unless one is running (tests and start()). */
  tick(): Promise<void> {
    if (this.stopped) return Promise.resolve();
    this.round ??= this.runRound().finally(() => {
      this.round = null;
    });
    return this.round;
  }

  /** Stops the rounds and releases the lease when this process holds it (a standby takes over at once). */
  async stop(opts: { release?: boolean } = {}): Promise<void> {
    this.stopped = true;
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    await this.round;
    this.unlisten();
    const claim = this.claim;
    this.claim = null;
    if ((opts.release ?? true) && claim !== null) {
      await this.propose([
        { op: "lease.release", key: this.opts.key, holder: this.holderId, epoch: claim.epoch },
      ]).catch(() => undefined);
    }
  }

  private async runRound(): Promise<void> {
    this.counters.rounds++;
    try {
      await this.leaseStep();
      if (this.epoch !== null) await this.placeStep(this.epoch);
    } catch (err) {
      this.opts.log.log("warn", "placement.round_failed", { message: (err as Error).message });
    }
  }

  private async leaseStep(): Promise<void> {
    const { key, leaseTtlMs } = this.opts;
    const db = this.replica.catalog;
    const fact = leaseFact(db, key);
    if (
      this.claim !== null &&
      (fact === null || fact.holder !== this.holderId || fact.epoch !== this.claim.epoch)
    ) {
      this.counters.lost++;
      this.opts.log.log("warn", "placement.lease_lost", {
        epoch: this.claim.epoch,
        holder: fact?.holder ?? null,
        now: fact?.epoch ?? null,
      });
      this.claim = null;
    }
    const action = nextLeaseAction(fact, this.holderId, this.claim, this.wall());
    if (action.kind === "wait") return;
    const before = fact?.holder === this.holderId ? fact.expiresAt : Number.NEGATIVE_INFINITY;
    const sentAt = this.mono();
    await this.propose([
      { op: "lease.acquire", key, holder: this.holderId, epoch: action.epoch, ttlMs: leaseTtlMs },
    ]);
    // Applied when the replica shows this holder at the epoch with a later expiry than before.
    const applied = await this.until(() => {
      const f = leaseFact(this.replica.catalog, key);
      return f !== null && f.holder === this.holderId && f.epoch === action.epoch && f.expiresAt > before;
    }, leaseTtlMs * CONFIRM_FRACTION);
    if (!applied) return; // refused (another holds it) or slow: the claim, if any, runs out on its own
    const fresh = this.claim === null;
    this.claim = claimFrom(action.epoch, sentAt, leaseTtlMs, this.opts.intervalMs);
    if (fresh) {
      this.counters.acquired++;
      this.opts.log.log("info", "placement.lease_acquired", { holder: this.holderId, epoch: action.epoch });
    } else this.counters.renewed++;
  }

  private async placeStep(epoch: number): Promise<void> {
    const db = this.replica.catalog;
    const input = placementInput(db, this.demand.at(this.wall()), {
      key: this.opts.key,
      fingerprint: this.opts.fingerprint,
      workers: this.opts.workers(),
      budgetBytes: this.opts.budgetBytes,
      policy: this.opts.policy,
    });
    const plan = planPlacements(input);
    this.lastPlan = plan;
    this.counters.plans++;
    if (plan.changes.length === 0) return;
    // Checked again right before sending: a claim that ran out while planning sends nothing.
    if (this.epoch !== epoch) return;
    await this.propose(placementOps(plan.changes, this.opts.key, epoch));
    const added = plan.changes.filter((c) => c.desired).length;
    this.counters.placementsProposed += added;
    this.counters.withdrawalsProposed += plan.changes.length - added;
    this.opts.log.log("info", "placement.proposed", {
      epoch,
      placed: added,
      withdrawn: plan.changes.length - added,
      desired: plan.desired.length,
      deferred: plan.deferred,
      chunks: input.chunks.length,
      workers: input.workers.length,
    });
  }

  /** Proposes placements of an explicit epoch now, claim or not (what a late holder would send; tests). */
  proposeAt(epoch: number, changes: PlacementPlan["changes"]): Promise<void> {
    return this.propose(placementOps(changes, this.opts.key, epoch));
  }

  private async propose(ops: CatalogOp[]): Promise<void> {
    const id = `${this.holderId}/${++this.seq}`;
    try {
      await this.sink.propose(encodeMessage(ProposalMsg, { id, clientId: this.holderId, ops }));
    } catch (err) {
      this.counters.proposeFailures++;
      throw err;
    }
  }

  /** Resolves true once `pred` holds on the replica (checked after each applied batch), false after `timeoutMs`. */
  private until(pred: () => boolean, timeoutMs: number): Promise<boolean> {
    if (pred()) return Promise.resolve(true);
    return new Promise((resolve) => {
      const stop = this.replica.listen(() => {
        if (!pred()) return;
        clearTimeout(timer);
        stop();
        resolve(true);
      });
      const timer = setTimeout(() => {
        stop();
        resolve(pred());
      }, timeoutMs);
    });
  }
}
