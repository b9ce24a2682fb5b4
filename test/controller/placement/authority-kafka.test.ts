import { createHash } from "node:crypto";
import { afterAll, describe, expect, it } from "vitest";
import { KafkaLog } from "../../../catalog/kafka/log.ts";
import { Replica } from "../../../catalog/replica.ts";
import {
  PlacementAuthority,
  type PlacementAuthorityOptions,
} from "../../../controller/placement/authority.ts";
import { leaseFact } from "../../../controller/placement/catalog-input.ts";
import { defaultPlacementPolicy } from "../../../controller/placement/policy.ts";
import { type CatalogOp, ProposalMsg, RejectionMsg } from "../../../schema/catalog.ts";
import { catalogNodeId } from "../../../schema/identity.ts";
import type { ModelFingerprint, NodeId, PrefixHash, WorkerId } from "../../../schema/ids.ts";
import { silentLogger } from "../../../schema/log.ts";
import { decodeMessage, encodeMessage } from "../../../schema/wire.ts";
import { collect, kafkaBrokers, uniqueTopics, until } from "../../catalog/log-helpers.ts";
import { startWriter } from "../../worker/restore/harness.ts";

/**
 * Two placement authorities on one real catalog (Kafka, one writer): one
 * issues at a time; when the holder stops renewing, the other takes over once
 * the writer's lease lapses, and a placement the old holder sends late (its
 * own clock frozen, so it still believes it holds the lease) is rejected.
 */
const hex = (...p: (string | number)[]) => createHash("sha256").update(p.join("/")).digest("hex");
const fp = hex("model") as ModelFingerprint;
const cleanups: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
});

/** A two-chunk chain, published, with an S3 replica of each, and demand for its tip. */
function seedOps(): { ops: CatalogOp[]; nodes: NodeId[] } {
  const prefixes = [hex("p", 0), hex("p", 1)] as PrefixHash[];
  const nodes = prefixes.map((p) => catalogNodeId(fp, p));
  const ops: CatalogOp[] = [
    { op: "model.registered", fingerprint: fp, name: "m", layout: "kv-gqa/v1", chunkTokens: 128 },
    { op: "worker.registered", worker: "w0", model: fp, address: "127.0.0.1:1" },
    { op: "worker.registered", worker: "w1", model: fp, address: "127.0.0.1:2" },
  ];
  for (let i = 0; i < 2; i++) {
    ops.push({
      op: "chunk.published",
      node: nodes[i]!,
      prefix: prefixes[i]!,
      parent: i === 0 ? "0".repeat(64) : prefixes[i - 1]!,
      model: fp,
      start: i * 128,
      tokens: 128,
      content: hex("content", i),
      bytes: 1 << 20,
      layout: "kv-gqa/v1",
      created: 1,
    });
    ops.push({ op: "replica.ready", node: nodes[i]!, worker: "w0", tier: "s3", verifiedAt: 1 });
  }
  ops.push({ op: "demand.observed", node: nodes[1]!, model: fp, tenant: "t0", time: Date.now(), count: 10 });
  return { ops, nodes };
}

describe.skipIf(!process.env.CONTINUUM_KAFKA_BROKERS)(
  "placement authority under an epoch-fenced lease",
  () => {
    it("one issues at a time; the other takes over when the lease lapses; the old holder's late placements are rejected", async () => {
      const topics = uniqueTopics();
      const open = (who: string) =>
        KafkaLog.open({ brokers: kafkaBrokers(), clientId: `place-${who}`, topics });
      const writerLog = await open("writer");
      cleanups.push(() => writerLog.close());
      const writer = startWriter(writerLog);
      cleanups.push(() => writer.stop());
      const seed = seedOps();
      await writerLog.propose(encodeMessage(ProposalMsg, { id: "seed", clientId: "test", ops: seed.ops }));

      const authority = async (who: string, monoNow?: () => number) => {
        const log = await open(who);
        cleanups.push(() => log.close());
        const replica = await Replica.start({ log });
        cleanups.push(() => replica.stop());
        await replica.waitFor(1, 30_000);
        const opts: PlacementAuthorityOptions = {
          key: `placement/${fp}`,
          holder: `ctl-${who}`,
          fingerprint: fp,
          intervalMs: 400,
          leaseTtlMs: 2_000,
          halfLifeMs: 600_000,
          maxDemandNodes: 1024,
          budgetBytes: { ram: 8 << 20, ssd: 0 },
          policy: defaultPlacementPolicy,
          workers: () => ["w0", "w1"] as WorkerId[],
          log: silentLogger,
          ...(monoNow ? { monoNow } : {}),
        };
        const a = new PlacementAuthority(replica, log, opts);
        cleanups.push(() => a.stop({ release: false }));
        return { a, replica };
      };

      // A's monotonic clock can be frozen: then it believes its claim still holds.
      let frozen: number | null = null;
      const aClock = () => frozen ?? performance.now();
      const A = await authority("a", aClock);
      const B = await authority("b");

      await A.a.tick();
      expect(A.a.epoch).toBe(1);
      // Demand 10 on a 2-chunk chain over 2 workers: both chunks on both workers' RAM.
      await until(() => {
        const p = A.replica.catalog;
        return (
          [...p.holders("placement/chunk")].filter((e) => p.get(e, "placement/desired") === true).length === 4
        );
      });
      expect(A.a.counters.placementsProposed).toBe(4);

      await B.replica.waitFor(A.replica.offset(), 30_000);
      await B.a.tick();
      expect(B.a.epoch).toBeNull();
      expect(B.a.counters.placementsProposed).toBe(0);

      // A stops renewing (a pause, a partition) while its own clock says it still holds the lease.
      frozen = performance.now();
      await new Promise((r) => setTimeout(r, 2_200));
      await B.a.tick();
      expect(B.a.epoch).toBe(2);
      expect(leaseFact(B.replica.catalog, `placement/${fp}`)).toMatchObject({
        holder: B.a.holderId,
        epoch: 2,
      });
      // B found the placements it wants already desired: nothing to change.
      expect(B.a.lastPlan?.changes).toEqual([]);

      // A, late, withdraws a placement at its old epoch: the writer refuses it.
      expect(A.a.epoch).toBe(1);
      const offsetBefore = A.replica.offset();
      await A.a.proposeAt(1, [
        { node: seed.nodes[0]!, workerId: "w0" as WorkerId, tier: "ram", desired: false },
      ]);
      const rejections = await collect(writerLog, 0, 1, "rejections");
      const reasons = rejections.map((r) => decodeMessage(RejectionMsg, r.bytes).reason);
      expect(
        reasons.some((r) => /fenced: lease .* is held at epoch 2; the placement carries epoch 1/.test(r)),
      ).toBe(true);
      // Nothing of it was applied: every placement is still desired.
      await A.replica.waitFor(offsetBefore, 10_000);
      const db = B.replica.catalog;
      expect([...db.holders("placement/chunk")].every((e) => db.get(e, "placement/desired") === true)).toBe(
        true,
      );

      // A's next round sees the takeover and stands down.
      frozen = null;
      await A.replica.waitFor(B.replica.offset(), 30_000);
      await A.a.tick();
      expect(A.a.epoch).toBeNull();
      expect(A.a.counters.lost).toBe(1);
    });
  },
);
