import type { CatalogDb } from "../../catalog/db.ts";
import { readyReplicasOfChunk } from "../../catalog/queries.ts";
import type { CatalogOp } from "../../schema/catalog.ts";
import type { ModelFingerprint, NodeId, WorkerId } from "../../schema/ids.ts";
import { chainDemand } from "./demand.ts";
import type { LeaseFact } from "./lease.ts";
import type {
  PlacedTier,
  Placement,
  PlacementChange,
  PlacementChunk,
  PlacementInput,
  PlacementPolicy,
} from "./policy.ts";

/**
 * The placement policy's input read from a catalog db (index lookups and one
 * scan of the placements; no Datalog), and its output as catalog ops. Same
 * db and demand, same input: a plan is replayed from the catalog at any
 * offset.
 */

/** The lease `key` as the db holds it, or null when it was never acquired. */
export function leaseFact(db: CatalogDb, key: string): LeaseFact | null {
  const e = db.eidOf("lease/key", key);
  if (e === undefined) return null;
  return {
    holder: db.get(e, "lease/holder") as string,
    epoch: db.get(e, "lease/epoch") as number,
    held: db.get(e, "lease/state") === "held",
    expiresAt: (db.get(e, "lease/expires") as number | undefined) ?? 0,
  };
}

/** Placements desired now under lease `key`. */
export function currentPlacements(db: CatalogDb, key: string): Placement[] {
  const lease = db.eidOf("lease/key", key);
  if (lease === undefined) return [];
  const out: Placement[] = [];
  for (const p of db.holders("placement/chunk")) {
    if (db.get(p, "placement/lease") !== lease || db.get(p, "placement/desired") !== true) continue;
    const tier = db.get(p, "placement/tier");
    if (tier !== "ram" && tier !== "ssd") continue;
    out.push({
      node: db.get(db.get(p, "placement/chunk") as number, "chunk/node") as NodeId,
      workerId: db.get(db.get(p, "placement/worker") as number, "worker/id") as WorkerId,
      tier,
    });
  }
  return out;
}

/** A published chunk's parent node, or null (a root, or not published). */
export function parentNode(db: CatalogDb, node: NodeId): NodeId | null {
  const c = db.eidOf("chunk/node", node);
  if (c === undefined) return null;
  const p = db.get(c, "chunk/parent") as number | undefined;
  return p === undefined ? null : (db.get(p, "chunk/node") as NodeId);
}

export interface InputOptions {
  readonly key: string;
  readonly fingerprint: ModelFingerprint;
  /** Workers that may hold copies (live, ready); those not registered with this model are left out. */
  readonly workers: readonly WorkerId[];
  readonly budgetBytes: Readonly<Record<PlacedTier, number>>;
  readonly policy: PlacementPolicy;
}

/** The policy input: published chunks of this model on the chains of `direct` (decayed demand per node). */
export function placementInput(
  db: CatalogDb,
  direct: ReadonlyMap<NodeId, number>,
  o: InputOptions,
): PlacementInput {
  const model = db.eidOf("model/fingerprint", o.fingerprint);
  const demand = chainDemand(direct, (n) => parentNode(db, n));
  const chunks: PlacementChunk[] = [];
  for (const [node, d] of demand) {
    const c = db.eidOf("chunk/node", node);
    if (c === undefined || db.get(c, "chunk/model") !== model) continue;
    const localHolders = [
      ...new Set(
        readyReplicasOfChunk(db, c)
          .filter((r) => r.tier === "ram" || r.tier === "ssd")
          .map((r) => r.worker as WorkerId),
      ),
    ];
    chunks.push({
      node,
      parent: parentNode(db, node),
      bytes: db.get(c, "chunk/bytes") as number,
      demand: d,
      localHolders,
    });
  }
  chunks.sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
  const workers = [...new Set(o.workers)]
    .filter((w) => {
      const e = db.eidOf("worker/id", w);
      return e !== undefined && db.get(e, "worker/model") === model;
    })
    .sort()
    .map((workerId) => ({ workerId, budgetBytes: o.budgetBytes }));
  return { chunks, workers, current: currentPlacements(db, o.key), policy: o.policy };
}

/** The plan's changes as catalog ops, fenced by the lease at `epoch`. */
export function placementOps(changes: readonly PlacementChange[], key: string, epoch: number): CatalogOp[] {
  return changes.map((c) => ({
    op: "placement.set" as const,
    node: c.node,
    worker: c.workerId,
    tier: c.tier,
    desired: c.desired,
    lease: key,
    epoch,
  }));
}
