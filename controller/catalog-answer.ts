import type { CatalogDb } from "../catalog/db.ts";
import { longestPublishedPrefix, readyReplicasOfChunk } from "../catalog/queries.ts";
import type { WorkerId } from "../schema/ids.ts";
import type { CatalogAnswer, ChainBoundary, ChunkReplica } from "./candidates.ts";

/**
 * Builds the router's catalog input for one chain from a catalog replica
 * (the prepared index lookups of catalog/queries.ts, no Datalog `q`): the
 * longest published prefix and, per node of it, the ready replicas.
 *
 * Mapping: an S3 replica is reachable by every worker, so it carries no
 * worker; RAM and SSD replicas stay on their worker (other workers see them
 * as `peer` sources). A replica recorded with tier `peer` names no store of
 * its own and is left out: peer reachability is derived from RAM/SSD holders.
 */
export function catalogAnswer(db: CatalogDb, chain: readonly ChainBoundary[]): CatalogAnswer {
  const prefix = longestPublishedPrefix(
    db,
    chain.map((b) => b.nodeId),
  );
  const replicas: ChunkReplica[][] = [];
  for (const chunk of prefix.chunks) {
    const list: ChunkReplica[] = [];
    let s3 = false;
    for (const r of readyReplicasOfChunk(db, chunk)) {
      if (r.tier === "s3") s3 = true;
      else if (r.tier === "ram" || r.tier === "ssd")
        list.push({ tier: r.tier, workerId: r.worker as WorkerId });
    }
    if (s3) list.unshift({ tier: "s3", workerId: null });
    replicas.push(list);
  }
  return { replicas };
}
