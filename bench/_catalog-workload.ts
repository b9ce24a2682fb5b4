import { createHash, randomUUID } from "node:crypto";
import type { CatalogOp, Proposal, Tier } from "../schema/catalog.ts";
import {
  type ChainNode,
  catalogNodeId,
  chainHash,
  chainRoot,
  modelFingerprint,
  prefixChain,
} from "../schema/identity.ts";
import type { PrefixHash } from "../schema/ids.ts";

/** The catalog bench's workload: one model, four workers, chains of 16-token chunks published one proposal each or in ranges. */

export const CHUNK = 16;
export const LAYOUT = "kv-bench/v1";
export const TIERS: Tier[] = ["ram", "ssd", "s3", "peer"];
export const fp = modelFingerprint({
  weightsDigest: "bench",
  architecture: {},
  kvDtype: "f16",
  layout: LAYOUT,
  variant: "bench",
});
export const WORKERS = ["w0", "w1", "w2", "w3"];

export function setup(): Proposal {
  return {
    id: `setup-${randomUUID()}`,
    clientId: "bench",
    ops: [
      { op: "model.registered", fingerprint: fp, name: "bench", layout: LAYOUT, chunkTokens: CHUNK },
      ...WORKERS.map(
        (w, i): CatalogOp => ({
          op: "worker.registered",
          worker: w,
          model: fp,
          address: `127.0.0.1:${9000 + i}`,
        }),
      ),
    ],
  };
}

/** Token i of synthetic document c: chain c's tokens start with c, so chains are distinct. */
function token(c: number, i: number): number {
  return i === 0 ? c : (c * 7919 + i) % 50_000;
}

/** Chain c: `length` chunks of document c. */
export function chain(c: number, length: number): ChainNode[] {
  return prefixChain(
    Array.from({ length: length * CHUNK }, (_, i) => token(c, i)),
    CHUNK,
  );
}

export function publication(n: ChainNode, worker: string, tier: Tier, id: string): Proposal {
  const node = catalogNodeId(fp, n.hash);
  return {
    id,
    clientId: worker,
    ops: [
      {
        op: "chunk.published",
        node,
        prefix: n.hash,
        parent: n.parent,
        model: fp,
        start: n.start,
        tokens: n.count,
        content: createHash("sha256").update(node).digest("hex"),
        bytes: 1 << 20,
        layout: LAYOUT,
        created: 1_700_000_000_000,
      },
      { op: "replica.ready", node, worker, tier, verifiedAt: 1_700_000_000_000 },
    ],
  };
}

/** Chains used so far: every call below takes fresh chains, so no run republishes another's chunks. */
let nextChain = 0;

/**
 * `count` publications on fresh chains of `chainLength` chunks, in wave
 * order: wave w holds the w-th group of `perProposal` chunks of every chain,
 * one proposal per group. Proposals of one wave are independent; a wave needs
 * the one before it applied (a chunk's parent must be published), so callers
 * send a wave only once the previous one is acknowledged. (Concurrent
 * proposals may be appended in any order.) Each proposal, and its chunks'
 * hashes, are made when it is asked for (the generator keeps one prefix hash
 * per chain), so a caller that offers them over time (the lag run) does not
 * hold tens of MB of proposals or hashes in the heap it measures. The chunks
 * equal `chain(c, chainLength)`'s.
 */
export function* publications(
  count: number,
  tag: string,
  chainLength: number,
  perProposal = 1,
): Generator<{ readonly wave: number; readonly proposal: Proposal }> {
  if (chainLength % perProposal !== 0) throw new RangeError("perProposal must divide chainLength");
  const chains = Math.ceil(count / chainLength);
  const firstDoc = nextChain;
  nextChain += chains;
  // Chain c's prefix hash so far: its next chunk's parent.
  const last = new Array<PrefixHash>(chains).fill(chainRoot());
  let made = 0;
  for (let w = 0; w < chainLength / perProposal; w++) {
    for (let c = 0; c < chains && made < count; c++) {
      const ops: CatalogOp[] = [];
      for (let k = 0; k < perProposal && made < count; k++, made++) {
        const start = (w * perProposal + k) * CHUNK;
        const tokens = Array.from({ length: CHUNK }, (_, j) => token(firstDoc + c, start + j));
        const node: ChainNode = { hash: chainHash(last[c]!, tokens), parent: last[c]!, start, count: CHUNK };
        last[c] = node.hash;
        const worker = WORKERS[c % WORKERS.length]!;
        ops.push(...publication(node, worker, TIERS[c % TIERS.length]!, "").ops);
      }
      if (ops.length > 0)
        yield { wave: w, proposal: { id: `${tag}-${w}-${c}`, clientId: WORKERS[c % WORKERS.length]!, ops } };
    }
  }
}

/** publications() collected, one array per wave. */
export function publicationWaves(
  count: number,
  tag: string,
  chainLength: number,
  perProposal = 1,
): Proposal[][] {
  const waves: Proposal[][] = Array.from({ length: chainLength / perProposal }, () => []);
  for (const { wave, proposal } of publications(count, tag, chainLength, perProposal))
    waves[wave]!.push(proposal);
  return waves.filter((w) => w.length > 0);
}
