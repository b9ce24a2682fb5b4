import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { ChunkLinks } from "../../catalog/chunk-links.ts";
import { CatalogApplyError, CatalogDb } from "../../catalog/db.ts";
import { attrInfo, EntityStore, isHex64, ownString } from "../../catalog/entity-store.ts";
import { HexIndex } from "../../catalog/hex-index.ts";
import type { Attr } from "../../schema/catalog.ts";
import { rng } from "./gen.ts";

const info = (a: Attr) => attrInfo(a)!;
const hex = (i: number) => createHash("sha256").update(`v${i}`).digest("hex");

describe("isHex64", () => {
  it("accepts 64 lowercase hex digits and nothing else", () => {
    expect(isHex64(hex(1))).toBe(true);
    expect(isHex64(hex(1).toUpperCase())).toBe(false);
    expect(isHex64(hex(1).slice(1))).toBe(false);
    expect(isHex64(`${hex(1)}0`)).toBe(false);
    expect(isHex64(`${hex(1).slice(0, 63)}g`)).toBe(false);
    expect(isHex64(`${hex(1).slice(0, 63)}\u0661`)).toBe(false);
    expect(isHex64("")).toBe(false);
  });
});

describe("ownString", () => {
  it("returns an equal string", () => {
    const big = `${"x".repeat(1000)}proposal-1234567890${"y".repeat(10)}`;
    const slice = big.slice(1000, 1000 + 19);
    expect(ownString(slice)).toBe("proposal-1234567890");
    expect(ownString("short")).toBe("short");
  });
});

describe("EntityStore", () => {
  it("holds each representation, tracks presence and deletes an emptied entity", () => {
    const s = new EntityStore();
    expect(s.set(1, info("chunk/node"), hex(1))).toBe(true);
    expect(s.set(1, info("chunk/start"), 256)).toBe(true);
    expect(s.set(1, info("chunk/created"), 1.5)).toBe(true);
    expect(s.set(1, info("chunk/layout"), "kv/v1")).toBe(true);
    expect(s.set(2, info("placement/desired"), false)).toBe(true);
    expect(s.set(1, info("chunk/start"), 512)).toBe(false);
    expect(s.get(1, info("chunk/node"))).toBe(hex(1));
    expect(s.get(1, info("chunk/start"))).toBe(512);
    expect(s.get(1, info("chunk/created"))).toBe(1.5);
    expect(s.get(1, info("chunk/layout"))).toBe("kv/v1");
    expect(s.get(2, info("placement/desired"))).toBe(false);
    expect(s.get(1, info("chunk/parent"))).toBeUndefined();
    expect(s.get(1, info("replica/tier"))).toBeUndefined();
    expect(s.get(99, info("chunk/node"))).toBeUndefined();
    expect(s.size).toBe(2);
    expect([...s.attributes(1)].map(([a]) => a)).toEqual([
      "chunk/node",
      "chunk/start",
      "chunk/layout",
      "chunk/created",
    ]);
    for (const a of ["chunk/node", "chunk/start", "chunk/created", "chunk/layout"] as Attr[])
      s.delete(1, info(a));
    expect(s.has(1)).toBe(false);
    expect(s.size).toBe(1);
    expect([...s.holders(info("chunk/node"))]).toEqual([]);
  });

  it("refuses a value of the wrong type or shape, and a second namespace on one entity, changing nothing", () => {
    const s = new EntityStore();
    s.set(1, info("chunk/start"), 0);
    expect(() => s.set(1, info("chunk/node"), hex(1).toUpperCase())).toThrow(/64 lowercase hex/);
    expect(() => s.set(1, info("chunk/start"), "0")).toThrow(/takes a number/);
    expect(() => s.set(1, info("replica/tier"), "ram")).toThrow(/chunk entity and cannot hold replica\/tier/);
    expect([...s.attributes(1)]).toEqual([["chunk/start", 0]]);
  });

  it("grows its tables and id arrays past their first sizes", () => {
    const s = new EntityStore();
    for (let e = 1; e <= 5000; e++) {
      s.set(e, info("replica/verified-at"), e * 0.5);
      s.set(e, info("replica/tier"), e % 2 === 0 ? "ram" : "ssd");
    }
    expect(s.size).toBe(5000);
    expect(s.get(4999, info("replica/verified-at"))).toBe(2499.5);
    expect(s.get(4999, info("replica/tier"))).toBe("ssd");
    expect([...s.holders(info("replica/tier"))].length).toBe(5000);
  });
});

describe("HexIndex", () => {
  it("finds by value and qualifier, forgets changed values, and survives rebuilds", () => {
    const s = new EntityStore();
    const prefix = info("chunk/prefix");
    const model = info("chunk/model");
    const idx = new HexIndex(s, prefix, model);
    const n = 3000; // several rebuilds past the first 1,024 slots
    for (let e = 1; e <= n; e++) {
      s.set(e, prefix, hex(e % 1500)); // each value under two models
      s.set(e, model, e <= 1500 ? 7 : 8);
      idx.add(e);
      idx.add(e); // adding twice is harmless
    }
    for (let e = 1; e <= n; e += 37) expect(idx.find(hex(e % 1500), e <= 1500 ? 7 : 8)).toBe(e);
    expect(idx.find(hex(1), 9)).toBeUndefined();
    expect(idx.find(hex(1).toUpperCase(), 7)).toBeUndefined();
    expect(idx.find("not hex", 7)).toBeUndefined();
    // A changed value: the old one no longer finds the entity, the new one does.
    s.set(5, prefix, hex(100_000));
    idx.add(5);
    expect(idx.find(hex(5), 7)).toBeUndefined();
    expect(idx.find(hex(100_000), 7)).toBe(5);
    // A removed value is not found, also after more adds force rebuilds.
    s.delete(6, prefix);
    for (let e = n + 1; e <= n + 3000; e++) {
      s.set(e, prefix, hex(e));
      s.set(e, model, 7);
      idx.add(e);
    }
    expect(idx.find(hex(6), 7)).toBeUndefined();
    expect(idx.find(hex(100_000), 7)).toBe(5);
    expect(idx.find(hex(n + 2999), 7)).toBe(n + 2999);
  });

  it("a value looked up again finds what a first lookup would, across qualifiers, changes and removals", () => {
    const s = new EntityStore();
    const prefix = info("chunk/prefix");
    const model = info("chunk/model");
    const idx = new HexIndex(s, prefix, model);
    for (const [e, q] of [
      [1, 7],
      [2, 8],
    ] as const) {
      s.set(e, prefix, hex(1));
      s.set(e, model, q);
      idx.add(e);
    }
    // An equal string that is another object, and the same value under another qualifier and back.
    const again = hex(1).split("").join("");
    expect(idx.find(hex(1), 7)).toBe(1);
    expect(idx.find(again, 7)).toBe(1);
    expect(idx.find(again, 8)).toBe(2);
    expect(idx.find(hex(1), 7)).toBe(1);
    expect(idx.find(hex(1).toUpperCase(), 7)).toBeUndefined();
    expect(idx.find(hex(1), 7)).toBe(1);
    // The value moves to another entity, then goes: the repeated lookup follows.
    s.set(1, prefix, hex(2));
    idx.add(1);
    expect(idx.find(hex(1), 7)).toBeUndefined();
    expect(idx.find(hex(2), 7)).toBe(1);
    s.delete(2, prefix);
    expect(idx.find(hex(1), 8)).toBeUndefined();
    expect(idx.findHex(hex(2), 7)).toBe(1);
  });

  it("agrees with a Map on random values, changes and removals", () => {
    const r = rng(5);
    const s = new EntityStore();
    const node = info("chunk/node");
    const idx = new HexIndex(s, node);
    const truth = new Map<string, number>();
    for (let step = 0; step < 20_000; step++) {
      const e = 1 + Math.floor(r() * 4000);
      const old = s.get(e, node) as string | undefined;
      if (old !== undefined) truth.delete(old);
      if (r() < 0.2) {
        s.delete(e, node);
        continue;
      }
      const v = hex(Math.floor(r() * 1e9));
      s.set(e, node, v);
      idx.add(e);
      truth.set(v, e);
    }
    for (const [v, e] of truth) expect(idx.find(v)).toBe(e);
    for (let i = 0; i < 200; i++) expect(idx.find(hex(2e9 + i))).toBeUndefined();
  });
});

describe("ChunkLinks", () => {
  it("keeps members per chunk in link order, once each", () => {
    const l = new ChunkLinks();
    l.link(10, 11);
    l.link(20, 21);
    l.link(10, 12);
    l.link(10, 11);
    l.link(10, 5000);
    expect(l.members(10)).toEqual([11, 12, 5000]);
    expect(l.members(20)).toEqual([21]);
    expect(l.members(30)).toEqual([]);
    expect(l.members(1 << 20)).toEqual([]);
    expect(l.find(10, (m) => m > 11)).toBe(12);
    expect(l.find(10, (m) => m > 1e6)).toBeUndefined();
    expect(l.isLinked(12)).toBe(true);
    expect(l.isLinked(13)).toBe(false);
  });
});

describe("CatalogDb.apply on the entity store", () => {
  const tx = (txNo: number, datoms: [number, string, string | number | boolean, boolean][]) => ({
    txNo,
    proposalId: `p${txNo}`,
    clientId: "c",
    time: 1,
    datoms: datoms as never,
  });

  it("refuses an entity id that skips ids, a second namespace and a bad hex value, and stays at its last tx", () => {
    const db = CatalogDb.empty();
    db.apply(tx(1, [[1, "worker/id", "w0", true]]));
    expect(() => db.apply(tx(2, [[3, "worker/id", "w1", true]]))).toThrow(/entity id 3 skips ids/);
    expect(() => db.apply(tx(2, [[1, "chunk/start", 0, true]]))).toThrow(CatalogApplyError);
    expect(() => db.apply(tx(2, [[2, "chunk/node", "ABC", true]]))).toThrow(/64 lowercase hex/);
    expect(db.lastTxNo).toBe(1);
    expect(db.highestEid).toBe(1);
    db.apply(tx(2, [[2, "worker/id", "w1", true]]));
    expect(db.eidOf("worker/id", "w1")).toBe(2);
  });
});
