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

/** A member's join metadata as its own assignor (owner or standby) would encode it. */
function member(memberId: string, owner: boolean) {
  const assigner = stickyWriterAssigner(() => owner)({ cluster, groupId: "g", logger: {} as Logger });
  return { memberId, memberMetadata: assigner.protocol({ topics: [TOPIC] }).metadata };
}

async function assign(members: ReturnType<typeof member>[]): Promise<Record<string, number[]>> {
  const leader = stickyWriterAssigner(() => false)({ cluster, groupId: "g", logger: {} as Logger });
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

  it("a lone member gets the partition", async () => {
    expect(await assign([member("only", false)])).toEqual({ only: [0] });
  });
});
