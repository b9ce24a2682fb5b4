import { AssignerProtocol, type PartitionAssigner } from "kafkajs";

/**
 * Keeps partition 0 of the proposals topic with the member that already owns
 * it; otherwise gives it to the first member by id. Every other member gets
 * nothing (a standby). `owns()` is read when this member joins.
 */
export function stickyWriterAssigner(owns: () => boolean): PartitionAssigner {
  const name = "ContinuumStickyWriter";
  const version = 1;
  return ({ cluster }) => ({
    name,
    version,
    protocol({ topics }) {
      return {
        name,
        metadata: AssignerProtocol.MemberMetadata.encode({
          version,
          topics,
          userData: Buffer.from(owns() ? "owner" : "standby"),
        }),
      };
    },
    async assign({ members, topics }) {
      const decoded = members
        .map((m) => ({
          memberId: m.memberId,
          meta: AssignerProtocol.MemberMetadata.decode(m.memberMetadata),
        }))
        .sort((a, b) => (a.memberId < b.memberId ? -1 : a.memberId > b.memberId ? 1 : 0));
      const owner = decoded.find((m) => m.meta?.userData.toString() === "owner") ?? decoded[0];
      const assignment: Record<string, number[]> = {};
      for (const topic of topics) {
        assignment[topic] = cluster.findTopicPartitionMetadata(topic).map((p) => p.partitionId);
      }
      return decoded.map((m) => ({
        memberId: m.memberId,
        memberAssignment: AssignerProtocol.MemberAssignment.encode({
          version,
          assignment: m.memberId === owner?.memberId ? assignment : {},
          userData: Buffer.alloc(0),
        }),
      }));
    },
  });
}
