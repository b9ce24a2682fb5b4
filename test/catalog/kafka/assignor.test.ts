import { AssignerProtocol, type Cluster, type Logger } from "kafkajs";
import { describe, expect, it } from "vitest";
import { stickyWriterAssigner } from "../../../catalog/kafka/assignor.ts";

/**
 * The sticky writer assignor (catalog/kafka/assignor.ts), pure: the member
 * that owns the proposals partition keeps it when another joins; without an
 * owner the first member by id gets it; everyone else gets nothing.
 */

const TOPIC = "catalog.proposals";
/** Only the one cluster call the assignor makes: the topic's partitions. */
const cluster = {
  findTopicPartitionMetadata: (topic: string) => (topic === TOPIC ? [{ partitionId: 0 }] : []),
} as unknown as Cluster;

/**
 * A member's join metadata as its own assignor would encode it: an owner claims the partition under
 * the member id it held it with (`heldAs`, by default its current one), a standby claims nothing.
 */
function member(memberId: string, owner: boolean, heldAs = memberId) {
  const assigner = stickyWriterAssigner(() => (owner ? heldAs : undefined))({
    cluster,
    groupId: "g",
    logger: {} as Logger,
  });
  return { memberId, memberMetadata: assigner.protocol({ topics: [TOPIC] }).metadata };
}

async function assign(members: ReturnType<typeof member>[]): Promise<Record<string, number[]>> {
  const leader = stickyWriterAssigner(() => undefined)({ cluster, groupId: "g", logger: {} as Logger });
  const out: Record<string, number[]> = {};
  for (const a of await leader.assign({ members, topics: [TOPIC] })) {
    out[a.memberId] = AssignerProtocol.MemberAssignment.decode(a.memberAssignment)?.assignment[TOPIC] ?? [];
  }
  return out;
}

describe("sticky writer assignor (pure)", () => {
  it("keeps the partition with its owner when a standby with a lower id joins", async () => {
    expect(await assign([member("b-owner", true), member("a-standby", false)])).toEqual({
      "a-standby": [],
      "b-owner": [0],
    });
  });

  it("without an owner, gives the partition to the first member by id and nothing to the rest", async () => {
    expect(await assign([member("m3", false), member("m1", false), member("m2", false)])).toEqual({
      m1: [0],
      m2: [],
      m3: [],
    });
  });

  it("a claim made under an expired member id loses to the member that took over (a thawed zombie does not win the partition back)", async () => {
    // "a-zombie" held the partition as "old-zombie", was frozen past its session and rejoined under a
    // new id; "b-owner" took over meanwhile. Sorted by id the zombie comes first, yet its claim is stale.
    expect(await assign([member("a-zombie", true, "old-zombie"), member("b-owner", true)])).toEqual({
      "a-zombie": [],
      "b-owner": [0],
    });
    // Alone with stale claims, the first member by id gets it as if nobody owned it.
    expect(await assign([member("m2", true, "old-m2"), member("m1", false)])).toEqual({ m1: [0], m2: [] });
  });

  it("a lone member gets the partition", async () => {
    expect(await assign([member("only", false)])).toEqual({ only: [0] });
  });
});
