import { describe, expect, it } from "vitest";
import { CatalogDb } from "../../catalog/db.ts";
import type { LogRecord } from "../../catalog/log.ts";
import { decideBatch } from "../../catalog/writer.ts";
import { type CatalogOp, type Proposal, ProposalMsg, RejectionMsg, TxMsg } from "../../schema/catalog.ts";
import { catalogNodeId, prefixChain } from "../../schema/identity.ts";
import { decodeMessage, encodeMessage } from "../../schema/wire.ts";
import { CatalogGen, CHUNK_TOKENS, fingerprintOf, LAYOUT } from "./gen.ts";

const fp = fingerprintOf(0);
const chain = prefixChain(
  Array.from({ length: 4 * CHUNK_TOKENS }, (_, i) => i + 1),
  CHUNK_TOKENS,
);
const limits = { maxProposalBytes: 4096 };

function publish(i: number): CatalogOp {
  return {
    op: "chunk.published",
    node: catalogNodeId(fp, chain[i]!.hash),
    prefix: chain[i]!.hash,
    parent: chain[i]!.parent,
    model: fp,
    start: chain[i]!.start,
    tokens: CHUNK_TOKENS,
    content: "c".repeat(64),
    bytes: 1024,
    layout: LAYOUT,
    created: 1,
  };
}

const records = (bytes: readonly Uint8Array[]): LogRecord[] =>
  bytes.map((b, offset) => ({ offset, bytes: b }));
const enc = (p: Proposal) => encodeMessage(ProposalMsg, p);

/** Decides `bytes` as one group and one by one; both must give the same records and db. */
function groupedEqualsOneByOne(bytes: readonly Uint8Array[]) {
  const grouped = CatalogDb.empty();
  const g = decideBatch(grouped, records(bytes), 5, limits);
  const single = CatalogDb.empty();
  const tx: Uint8Array[] = [];
  const rejections: Uint8Array[] = [];
  records(bytes).forEach((r) => {
    const out = decideBatch(single, [r], 5, limits);
    tx.push(...out.tx);
    rejections.push(...out.rejections);
  });
  expect(g.tx).toEqual(tx);
  expect(g.rejections).toEqual(rejections);
  expect(grouped.dbHash()).toBe(single.dbHash());
  return { out: g, db: grouped };
}

describe("decideBatch", () => {
  it("a group with rejected proposals in the middle: the others applied exactly as if sent one by one", () => {
    const setup: Proposal = {
      id: "setup",
      clientId: "t",
      ops: [
        { op: "model.registered", fingerprint: fp, name: "m", layout: LAYOUT, chunkTokens: CHUNK_TOKENS },
        { op: "worker.registered", worker: "w0", model: fp, address: "127.0.0.1:1" },
      ],
    };
    const p = (id: string, ...ops: CatalogOp[]): Proposal => ({ id, clientId: "t", ops });
    const bytes = [
      enc(setup),
      enc(p("a", publish(0))),
      enc(p("orphan", publish(3))), // rejected: its parent (2) is not published
      new Uint8Array([0xc1, 0x00]), // malformed
      new Uint8Array(limits.maxProposalBytes + 1), // oversized
      encodeMessage(RejectionMsg, { proposalId: null, clientId: null, reason: "x", proposalOffset: 0 }), // another kind
      enc(p("a", publish(1))), // duplicate id: rejected, chunk 1 not published
      enc(p("b", publish(1))), // sees a's chunk 0 from earlier in the group
      enc(
        p("c", publish(2), {
          op: "replica.ready",
          node: catalogNodeId(fp, chain[2]!.hash),
          worker: "w0",
          tier: "ram",
          verifiedAt: 1,
        }),
      ),
    ];
    const { out, db } = groupedEqualsOneByOne(bytes);
    expect(out.accepted).toBe(4);
    expect(out.rejected).toBe(5);
    const txs = out.tx.map((b) => decodeMessage(TxMsg, b));
    expect(txs.map((t) => [t.txNo, t.proposalId, t.time])).toEqual([
      [1, "setup", 5],
      [2, "a", 5],
      [3, "b", 5],
      [4, "c", 5],
    ]);
    const reasons = out.rejections.map((b) => decodeMessage(RejectionMsg, b));
    expect(reasons.map((r) => [r.proposalOffset, r.proposalId])).toEqual([
      [2, "orphan"],
      [3, null],
      [4, null],
      [5, null],
      [6, "a"],
    ]);
    expect(reasons[0]!.reason).toMatch(/parent chunk .* is not published/);
    expect(reasons[1]!.reason).toMatch(/^malformed: /);
    expect(reasons[2]!.reason).toMatch(/^oversized: /);
    expect(reasons[3]!.reason).toBe("malformed: expected a catalog.proposal message, got catalog.rejection");
    expect(reasons[4]!.reason).toMatch(/^duplicate: /);
    const chunk = (i: number) => db.eidOf("chunk/node", catalogNodeId(fp, chain[i]!.hash));
    expect(db.get(chunk(2)!, "chunk/parent")).toBe(chunk(1));
    expect(chunk(3)).toBeUndefined();
  });

  it("random proposals, some invalid: one group equals one by one", () => {
    const gen = new CatalogGen(11);
    const ps = [gen.setup(), ...Array.from({ length: 400 }, () => gen.next())];
    // Every 40th proposal is sent again right away (a client retry: a duplicate).
    const bytes = ps.flatMap((p, i) => (i % 40 === 39 ? [enc(p), enc(p)] : [enc(p)]));
    const { out } = groupedEqualsOneByOne(bytes);
    expect(out.accepted).toBeGreaterThan(300);
    expect(out.rejected).toBeGreaterThanOrEqual(10);
  });
});
