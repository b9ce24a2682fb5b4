import datascript from "datascript";
import { describe, expect, it } from "vitest";
import { CatalogApplyError, CatalogDb } from "../../catalog/db.ts";
import { ProposalMsg, TxMsg } from "../../schema/catalog.ts";
import { decodeMessage, encodeMessage, WireError } from "../../schema/wire.ts";
import { randomCatalog } from "./gen.ts";
import { prop, publish, world } from "./world.ts";

describe("CatalogDb.apply", () => {
  it("refuses a tx out of order and a retraction of a value that is not there", () => {
    const db = world();
    expect(() => db.apply({ txNo: 5, proposalId: "x", clientId: "c", time: 1, datoms: [] })).toThrow(
      CatalogApplyError,
    );
    expect(() =>
      db.apply({
        txNo: 2,
        proposalId: "x",
        clientId: "c",
        time: 1,
        datoms: [[1, "model/name", "nope", false]],
      }),
    ).toThrow(/current value is m0/);
  });

  it("refuses a unique value another entity holds, and a hex value that is not 64 lowercase hex digits", () => {
    const db = world();
    const tx = (datoms: [number, string, string | number | boolean, boolean][]) => ({
      txNo: db.nextTxNo,
      proposalId: `t${db.nextTxNo}`,
      clientId: "c",
      time: 1,
      datoms,
    });
    const fp0 = db.get(1, "model/fingerprint") as string;
    const next = db.highestEid + 1;
    expect(() => db.apply(tx([[next, "model/fingerprint", fp0, true]]))).toThrow(
      new RegExp(`model/fingerprint ${fp0} already held by 1`),
    );
    expect(() => db.apply(tx([[next, "worker/id", "w0", true]]))).toThrow(
      /worker\/id w0 already held by \d+/,
    );
    expect(() => db.apply(tx([[next, "chunk/node", "A".repeat(64), true]]))).toThrow(
      /chunk\/node takes 64 lowercase hex digits/,
    );
    // None of them changed the db; the same value on its own holder is no conflict.
    expect(db.highestEid).toBe(next - 1);
    db.apply(tx([[1, "model/fingerprint", fp0, true]]));
    expect(db.eidOf("model/fingerprint", fp0)).toBe(1);
  });

  it("serializes and deserializes to an equal db", () => {
    const { db } = randomCatalog(7, 2000);
    const copy = CatalogDb.deserialize(db.serialize());
    expect(copy.dbHash()).toBe(db.dbHash());
    expect(copy.lastTxNo).toBe(db.lastTxNo);
    expect(() => CatalogDb.deserialize(new Uint8Array([1, 2, 3]))).toThrow(
      /not a catalog snapshot|not msgpack/,
    );
  });

  it("keeps the Datalog view equal to the entity store, incrementally and rebuilt", () => {
    const { db, gen } = randomCatalog(11, 500);
    const viewDatoms = (): string[] =>
      datascript
        .datoms(db.datalog(), ":eavt")
        .map((d) => `${d.e} ${d.a} ${JSON.stringify(d.v)}`)
        .sort();
    const storeDatoms = (): string[] => {
      const out: string[] = [];
      for (const [e, ent] of db.entities())
        for (const [a, v] of ent) out.push(`${e} ${a} ${JSON.stringify(v)}`);
      return out.sort();
    };
    expect(viewDatoms()).toEqual(storeDatoms()); // first call: bulk rebuild
    for (let i = 0; i < 40; i++) {
      const p = gen.next();
      const r = db.resolve(p, 1);
      if (r.ok)
        db.apply({ txNo: db.nextTxNo, proposalId: p.id, clientId: p.clientId, time: 1, datoms: r.datoms });
    }
    expect(viewDatoms()).toEqual(storeDatoms()); // few pending: folded in with db_with
  });
});

describe("catalog messages", () => {
  it("round-trip proposals and txs and reject bad shapes with a WireError", () => {
    const p = prop(publish(0));
    expect(decodeMessage(ProposalMsg, encodeMessage(ProposalMsg, p))).toEqual(p);
    const tx = {
      txNo: 1,
      proposalId: "p",
      clientId: "c",
      time: 2,
      datoms: [[1, "chunk/node", "x", true]] as const,
    };
    expect(decodeMessage(TxMsg, encodeMessage(TxMsg, { ...tx, datoms: [...tx.datoms] }))).toEqual({
      ...tx,
      datoms: [[1, "chunk/node", "x", true]],
    });
    expect(() =>
      decodeMessage(TxMsg, encodeMessage(TxMsg, { ...tx, datoms: [[1, "chunk/nope", "x", true]] })),
    ).toThrow(WireError);
    // The guard decides alone; what it refuses reaches the Effect schema for the message.
    const bad: unknown[] = [
      { ...tx, datoms: [[0, "chunk/node", "x", true]] },
      { ...tx, datoms: [[1.5, "chunk/node", "x", true]] },
      { ...tx, datoms: [[1, "chunk/node", "x"]] },
      { ...tx, datoms: [[1, "chunk/node", null, true]] },
      { ...tx, datoms: [[1, "chunk/node", "x", 1]] },
      { ...tx, datoms: [[1, "toString", "x", true]] },
      { ...tx, txNo: 0 },
      { ...tx, clientId: 3 },
    ];
    for (const body of bad)
      expect(() => decodeMessage(TxMsg, encodeMessage(TxMsg, body as never))).toThrow(
        /catalog.tx: invalid message/,
      );
    expect(() =>
      decodeMessage(
        ProposalMsg,
        encodeMessage(ProposalMsg, { id: "p", clientId: "c", ops: [{ op: "chunk.published" }] } as never),
      ),
    ).toThrow(/catalog.proposal: invalid message/);
  });
});
