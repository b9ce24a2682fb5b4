import { AssignerProtocol, type PartitionAssigner } from "kafkajs";

/**
 * Keeps partition 0 of the proposals topic with the member that already owns
 * it; otherwise gives it to the first member by id. Every other member gets
 * nothing (a standby). `owner()` is read when this member joins: the member
 * id under which it holds the partition, or undefined.
 *
 * A claim counts only when made under the claimant's current member id: a
 * member whose session expired (a frozen process, thawed) rejoins under a new
 * id while still believing it owns the partition, and must not win it back
 * from the member that took over and fenced it.
 */
export function stickyWriterAssigner(owner: () => string | undefined): PartitionAssigner {
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
          userData: Buffer.from(claim(owner())),
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
      const owner = decoded.find((m) => m.meta?.userData.toString() === claim(m.memberId)) ?? decoded[0];
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

/** A member's userData: `owner:<member id>` for a holder, `standby` otherwise. */
export function claim(memberId: string | undefined): string {
  return memberId === undefined ? "standby" : `owner:${memberId}`;
}
