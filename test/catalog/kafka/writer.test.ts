import { afterAll, describe, expect, it } from "vitest";
import { CatalogDb } from "../../../catalog/db.ts";
import { KafkaLog } from "../../../catalog/kafka/log.ts";
import type { FullCatalogLog } from "../../../catalog/log.ts";
import { EmbeddedLog } from "../../../catalog/log-embedded.ts";
import { ProposalMsg, RejectionMsg, TxMsg } from "../../../schema/catalog.ts";
import { decodeMessage, encodeMessage } from "../../../schema/wire.ts";
import { collect, kafkaBrokers, leaseProposal, startWriter, uniqueTopics, until } from "../log-helpers.ts";

const impls = [
  { name: "embedded", open: (): Promise<FullCatalogLog> => EmbeddedLog.open() },
  {
    name: "kafka",
    open: (): Promise<FullCatalogLog> =>
      KafkaLog.open({ brokers: kafkaBrokers(), clientId: "writer-test", topics: uniqueTopics() }),
  },
];

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

describe.each(impls)("catalog writer on the $name log", (impl) => {
  it("turns garbage, oversized, invalid and duplicate proposals into rejections and keeps going", async () => {
    const log = await impl.open();
    cleanups.push(() => log.close());
    const w = await startWriter(log);
    try {
      await log.propose(new Uint8Array([0xc1, 0x00, 0xff])); // not msgpack
      await log.propose(new Uint8Array(1_500_000)); // over the writer's 1 MiB limit
      await log.propose(encodeMessage(ProposalMsg, leaseProposal("p-1", "lease-a")));
      await log.propose(encodeMessage(ProposalMsg, leaseProposal("p-1", "lease-a"))); // a client retry
      await log.propose(encodeMessage(ProposalMsg, leaseProposal("p-2", "lease-a", "h2"))); // another holder, same epoch: refused
      await log.propose(encodeMessage(ProposalMsg, leaseProposal("p-3", "lease-b")));
      await until(async () => (await log.endOffset()) >= 2);
      const rej = (await collect(log, 0, 4, "rejections")).map((r) => decodeMessage(RejectionMsg, r.bytes));
      expect(rej.map((r) => r.proposalOffset)).toEqual([0, 1, 3, 4]);
      expect(rej[0]!.reason).toMatch(/^malformed: /);
      expect(rej[0]!.proposalId).toBeNull();
      expect(rej[1]!.reason).toMatch(/^oversized: proposal of 1500000 bytes/);
      expect(rej[2]).toMatchObject({ proposalId: "p-1", reason: expect.stringMatching(/^duplicate: /) });
      expect(rej[3]).toMatchObject({
        proposalId: "p-2",
        reason: expect.stringMatching(/lease lease-a is held/),
      });
      const tx = (await collect(log, 0, 2)).map((r) => decodeMessage(TxMsg, r.bytes));
      expect(tx.map((t) => [t.txNo, t.proposalId])).toEqual([
        [1, "p-1"],
        [2, "p-3"],
      ]);
      expect(await log.endOffset()).toBe(2);
    } finally {
      await w.stop();
    }
  });

  it("a new writer replays catalog.tx, so a duplicate sent after a restart is still applied once", async () => {
    const log = await impl.open();
    cleanups.push(() => log.close());
    const first = await startWriter(log);
    await log.propose(encodeMessage(ProposalMsg, leaseProposal("once", "lease-x")));
    await until(async () => (await log.endOffset()) >= 1);
    await first.stop();
    const second = await startWriter(log);
    try {
      await log.propose(encodeMessage(ProposalMsg, leaseProposal("once", "lease-x")));
      await log.propose(encodeMessage(ProposalMsg, leaseProposal("twice", "lease-y")));
      await until(async () => (await log.endOffset()) >= 2);
      const rej = (await collect(log, 0, 1, "rejections")).map((r) => decodeMessage(RejectionMsg, r.bytes));
      expect(rej[0]).toMatchObject({ proposalId: "once", reason: expect.stringMatching(/^duplicate: /) });
      const tx = (await collect(log, 0, 2)).map((r) => decodeMessage(TxMsg, r.bytes));
      expect(tx.map((t) => [t.txNo, t.proposalId])).toEqual([
        [1, "once"],
        [2, "twice"],
      ]);
      // The writer's db and a replica built from the log agree.
      const replica = CatalogDb.empty();
      for (const t of tx) replica.apply(t);
      await until(() => second.writer.current?.lastTxNo === 2);
      expect(replica.dbHash()).toBe((second.writer.current as CatalogDb).dbHash());
    } finally {
      await second.stop();
    }
  });
});
