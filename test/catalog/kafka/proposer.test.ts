import { afterAll, describe, expect, it } from "vitest";
import { KafkaLog } from "../../../catalog/kafka/log.ts";
import { mayBePacked, PROPOSAL_BATCH, unpack } from "../../../catalog/kafka/records.ts";
import { bytes, kafkaBrokers, text, uniqueTopics } from "../log-helpers.ts";
import { committedRecords, openLog, sizes } from "./helpers.ts";

/**
 * The proposer's group commit (catalog/kafka/proposer.ts): proposals queued
 * together go in one produce request, packed in one record, within the
 * proposalSend bounds; each caller is answered once the broker acknowledged.
 */

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
});

describe("Kafka proposer (real broker)", () => {
  it("one packed record per produce request within its bounds, and every acknowledged proposal is in the topic, in order", async () => {
    const topics = uniqueTopics();
    const limits = { maxRecords: 7, maxBytes: 1_500 };
    const sends: Array<{ proposals: number; bytes: number }> = [];
    const log = await openLog(cleanups, topics, {
      proposalSend: limits,
      onProposalSend: (proposals, b) => sends.push({ proposals, bytes: b }),
    });
    const payloads = sizes(100, 7, 400).map((n, i) => `${i}:${"x".repeat(n)}`);
    payloads.push(`big:${"y".repeat(3_000)}`);
    await Promise.all(payloads.map((p) => log.propose(bytes(p))));
    expect(sends.reduce((s, x) => s + x.proposals, 0)).toBe(payloads.length);
    for (const s of sends) {
      expect(s.proposals).toBeLessThanOrEqual(limits.maxRecords);
      if (s.proposals > 1) expect(s.bytes).toBeLessThanOrEqual(limits.maxBytes);
    }
    // Proposed together, they are grouped: far fewer requests than proposals.
    expect(sends.length).toBeLessThan(payloads.length / 2);
    // One record per request: a lone proposal as it is, several packed in a catalog.proposal.batch.
    const records = await committedRecords(topics.proposals, (r) => r.length >= sends.length);
    expect(records).toHaveLength(sends.length);
    const items = records.map((r) =>
      mayBePacked(PROPOSAL_BATCH, r.value) ? unpack(PROPOSAL_BATCH, r.value)! : [r.value],
    );
    expect(items.map((i) => i.length)).toEqual(sends.map((s) => s.proposals));
    expect(records.filter((r) => r.value.includes("catalog.proposal.batch")).length).toBe(
      sends.filter((s) => s.proposals > 1).length,
    );
    expect(items.flat().map(text)).toEqual(payloads);
  });

  it("a proposal batch bound the batch record cannot hold is refused at open, naming it", async () => {
    await expect(
      KafkaLog.open({
        brokers: kafkaBrokers(),
        clientId: "proposer-test",
        topics: uniqueTopics(),
        proposalSend: { maxRecords: PROPOSAL_BATCH.maxItems + 1, maxBytes: 1 << 20 },
      }),
    ).rejects.toThrow(/proposalSend: 4097 proposals .* do not fit one proposal batch/);
  });
});
