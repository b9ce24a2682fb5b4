import { Packr } from "msgpackr";
import { afterAll, describe, expect, it } from "vitest";
import { CatalogDb } from "../../../catalog/db.ts";
import { KafkaLog } from "../../../catalog/kafka/log.ts";
import {
  mayBePacked,
  PackedRecordError,
  PROPOSAL_BATCH,
  pack,
  TX_BATCH,
  unpack,
} from "../../../catalog/kafka/records.ts";
import type { LogRecord } from "../../../catalog/log.ts";
import { CatalogWriter, decideBatch } from "../../../catalog/writer.ts";
import { type Proposal, ProposalMsg, type Rejection, RejectionMsg, TxMsg } from "../../../schema/catalog.ts";
import { silentLogger } from "../../../schema/log.ts";
import { decodeMessage, encodeMessage } from "../../../schema/wire.ts";
import { collect, kafkaBrokers, leaseProposal, uniqueTopics, until } from "../log-helpers.ts";

/**
 * Packed proposal records (`catalog.proposal.batch`, catalog/kafka/records.ts):
 * every proposal inside is decided on its own — its own idempotency key, its
 * own rejection — and a batch that cannot be unpacked becomes one rejection
 * naming why, while the writer goes on.
 */

const limits = { maxProposalBytes: 4096 };
const enc = (p: Proposal) => encodeMessage(ProposalMsg, p);
const rejections = (out: { rejections: readonly Uint8Array[] }): Rejection[] =>
  out.rejections.map((r) => decodeMessage(RejectionMsg, r));
const txIds = (out: { tx: readonly Uint8Array[] }): string[] =>
  out.tx.map((t) => decodeMessage(TxMsg, t).proposalId);
// Any msgpack encoder (here one configured like the wire's) can write a batch by hand.
const raw = new Packr({ useRecords: false, moreTypes: false, mapsAsObjects: true, variableMapSize: true });

describe("proposal batch records (pure)", () => {
  it("a batch whose proposals are partly invalid rejects only those, and applies the rest as if sent one by one", () => {
    const items = [
      enc(leaseProposal("a", "lease-1")),
      enc(leaseProposal("b", "lease-1", "other-holder")), // lease held by another at the same epoch
      new Uint8Array([0xc1, 0x02]), // not msgpack
      new Uint8Array(5_000), // over maxProposalBytes
      enc(leaseProposal("c", "lease-2")),
    ];
    const batched = CatalogDb.empty();
    const out = decideBatch(batched, [{ offset: 7, bytes: pack(PROPOSAL_BATCH, items) }], 1, limits);
    expect(txIds(out)).toEqual(["a", "c"]);
    const rej = rejections(out);
    expect(rej.map((r) => [r.proposalId, r.proposalOffset])).toEqual([
      ["b", 7],
      [null, 7],
      [null, 7],
    ]);
    expect(rej[0]!.reason).toMatch(/lease lease-1 is held/);
    expect(rej[1]!.reason).toMatch(/^malformed: /);
    expect(rej[2]!.reason).toMatch(/^oversized: proposal of 5000 bytes/);

    const single = CatalogDb.empty();
    for (const bytes of items) decideBatch(single, [{ offset: 7, bytes }], 1, limits);
    expect(batched.dbHash()).toBe(single.dbHash());
  });

  it("a proposal in two batches (a client retry) is applied once; the second copy is a duplicate rejection", () => {
    const db = CatalogDb.empty();
    const first = pack(PROPOSAL_BATCH, [
      enc(leaseProposal("x", "lease-x")),
      enc(leaseProposal("y", "lease-y")),
    ]);
    const second = pack(PROPOSAL_BATCH, [
      enc(leaseProposal("z", "lease-z")),
      enc(leaseProposal("x", "lease-x")),
    ]);
    const out = decideBatch(
      db,
      [
        { offset: 0, bytes: first },
        { offset: 1, bytes: second },
      ],
      1,
      limits,
    );
    expect(txIds(out)).toEqual(["x", "y", "z"]);
    expect(rejections(out)).toEqual([
      expect.objectContaining({
        proposalId: "x",
        proposalOffset: 1,
        reason: expect.stringMatching(/^duplicate: /),
      }),
    ]);
  });

  it("a batch that cannot be unpacked becomes one rejection naming why, and the next record is still decided", () => {
    const garbage: Array<[Uint8Array, RegExp]> = [
      [
        raw.pack({ v: 1, kind: PROPOSAL_BATCH.kind, proposals: "nope" }),
        /^malformed: .*'proposals' must be an array/,
      ],
      [
        raw.pack({ v: 1, kind: PROPOSAL_BATCH.kind, proposals: [{ id: "p" }] }),
        /^malformed: .*item 0 is not a msgpack bin/,
      ],
      [raw.pack({ v: 1, kind: PROPOSAL_BATCH.kind, proposals: [] }), /^malformed: .*no items/],
      [raw.pack({ v: 2, kind: PROPOSAL_BATCH.kind, proposals: [] }), /^malformed: unknown wire version 2/],
      // Truncated: the kind's name is there, the map is not whole.
      [pack(PROPOSAL_BATCH, [enc(leaseProposal("t", "lease-t"))]).subarray(0, 40), /^malformed: /],
    ];
    const db = CatalogDb.empty();
    const records: LogRecord[] = garbage.map(([bytes], offset) => ({ offset, bytes }));
    records.push({ offset: garbage.length, bytes: enc(leaseProposal("after", "lease-after")) });
    const out = decideBatch(db, records, 1, limits);
    expect(txIds(out)).toEqual(["after"]);
    const rej = rejections(out);
    expect(rej).toHaveLength(garbage.length);
    rej.forEach((r, i) => {
      expect(r.proposalOffset).toBe(i);
      expect(r.proposalId).toBeNull();
      expect(r.reason).toMatch(garbage[i]![1]);
    });
  });

  it("bounds: more than maxItems proposals, or more than maxBytes, is refused whole as oversized — by pack and by the writer", () => {
    const tiny = enc(leaseProposal("t", "lease-t"));
    const tooMany = Array.from({ length: PROPOSAL_BATCH.maxItems + 1 }, () => tiny);
    expect(() => pack(PROPOSAL_BATCH, tooMany)).toThrow(PackedRecordError);
    expect(() => pack(PROPOSAL_BATCH, [])).toThrow(/0 items, must be 1\.\.4096/);
    const handMade = raw.pack({ v: 1, kind: PROPOSAL_BATCH.kind, proposals: tooMany });
    const tooBig = raw.pack({
      v: 1,
      kind: PROPOSAL_BATCH.kind,
      proposals: [new Uint8Array(PROPOSAL_BATCH.maxBytes)],
    });
    const db = CatalogDb.empty();
    const out = decideBatch(
      db,
      [
        { offset: 0, bytes: handMade },
        { offset: 1, bytes: tooBig },
      ],
      1,
      limits,
    );
    expect(out.tx).toHaveLength(0);
    const rej = rejections(out);
    expect(rej[0]!.reason).toMatch(
      /^oversized: catalog\.proposal\.batch: 4097 items, over the limit of 4096/,
    );
    expect(rej[1]!.reason).toMatch(
      /^oversized: catalog\.proposal\.batch: \d+ bytes, over the 4194304-byte limit/,
    );
    expect(db.lastTxNo).toBe(0);
  });

  it("items come back byte for byte as views of the record; a plain message is not a batch", () => {
    const items = [new Uint8Array([1, 2, 3]), enc(leaseProposal("q", "lease-q"))];
    const packed = pack(TX_BATCH, items);
    expect(mayBePacked(TX_BATCH, packed)).toBe(true);
    const back = unpack(TX_BATCH, packed)!;
    expect(back.map((b) => [...b])).toEqual(items.map((b) => [...b]));
    expect(back[0]!.buffer).toBe(packed.buffer);
    const plain = enc(leaseProposal("q", "lease-q"));
    expect(mayBePacked(PROPOSAL_BATCH, plain)).toBe(false);
    expect(unpack(PROPOSAL_BATCH, plain)).toBeUndefined();
  });
});

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
});

describe("proposal batches through Kafka and the writer (real broker)", () => {
  it("concurrent proposals travel packed; the invalid ones inside are rejected alone, a retried one applies once, and a hand-written garbage batch is one rejection", async () => {
    const log = await KafkaLog.open({
      brokers: kafkaBrokers(),
      clientId: "batch-test",
      topics: uniqueTopics(),
    });
    cleanups.push(() => log.close());
    const writer = new CatalogWriter({ log, newDb: () => CatalogDb.empty(), logger: silentLogger });
    const running = writer.run();
    try {
      // Proposed together: one produce request, one packed record (the proposer's linger is one event-loop turn).
      await Promise.all([
        log.propose(enc(leaseProposal("k1", "lease-k"))),
        log.propose(enc(leaseProposal("k2", "lease-k", "intruder"))),
        log.propose(new Uint8Array([0xc1])),
        log.propose(enc(leaseProposal("k3", "lease-m"))),
      ]);
      await log.propose(raw.pack({ v: 1, kind: PROPOSAL_BATCH.kind, proposals: 42 }));
      await Promise.all([
        log.propose(enc(leaseProposal("k1", "lease-k"))), // a client retry, packed with a new one
        log.propose(enc(leaseProposal("k4", "lease-n"))),
      ]);
      await until(async () => (await log.endOffset()) >= 3);
      const tx = (await collect(log, 0, 3)).map((r) => decodeMessage(TxMsg, r.bytes));
      expect(tx.map((t) => [t.txNo, t.proposalId])).toEqual([
        [1, "k1"],
        [2, "k3"],
        [3, "k4"],
      ]);
      const rej = (await collect(log, 0, 4, "rejections")).map((r) => decodeMessage(RejectionMsg, r.bytes));
      expect(rej.map((r) => r.proposalId)).toEqual(["k2", null, null, "k1"]);
      expect(rej[1]!.reason).toMatch(/^malformed: /);
      expect(rej[2]!.reason).toMatch(
        /^malformed: catalog\.proposal\.batch: field 'proposals' must be an array/,
      );
      expect(rej[3]!.reason).toMatch(/^duplicate: /);
      // The first three shared one record (its offset), the hand-written batch has its own, the retry pair the next.
      expect(rej[0]!.proposalOffset).toBe(rej[1]!.proposalOffset);
      expect(rej[2]!.proposalOffset).toBe(rej[0]!.proposalOffset + 1);
      expect(rej[3]!.proposalOffset).toBe(rej[2]!.proposalOffset + 1);
    } finally {
      await writer.stop();
      await running;
    }
  });
});
