import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { DemandWindow } from "../../../controller/fleet/demand.ts";
import type { ModelFingerprint, NodeId } from "../../../schema/ids.ts";

const hex = (s: string) => createHash("sha256").update(s).digest("hex");

describe("DemandWindow", () => {
  it("sums a window's requests per (node, tenant) into demand.observed ops, then starts afresh", () => {
    const w = new DemandWindow(hex("m") as ModelFingerprint, 8);
    const a = hex("a") as NodeId;
    const b = hex("b") as NodeId;
    w.observe(a, "t1");
    w.observe(b, "t1");
    w.observe(a, "t1");
    w.observe(a, "t2");
    const ops = w.drain(5_000);
    expect(ops).toEqual(
      [
        { node: a, tenant: "t1", count: 2 },
        { node: a, tenant: "t2", count: 1 },
        { node: b, tenant: "t1", count: 1 },
      ]
        .sort((x, y) => (x.node < y.node ? -1 : x.node > y.node ? 1 : x.tenant < y.tenant ? -1 : 1))
        .map((e) => ({ op: "demand.observed", model: hex("m"), time: 5_000, ...e })),
    );
    expect(w.drain(6_000)).toEqual([]);
  });

  it("holds at most maxKeys pairs per window and counts what it drops", () => {
    const w = new DemandWindow(hex("m") as ModelFingerprint, 2);
    for (let i = 0; i < 5; i++) w.observe(hex(`n${i}`) as NodeId, "t");
    w.observe(hex("n0") as NodeId, "t");
    expect(w.drain(1)).toHaveLength(2);
    expect(w.dropped).toBe(3);
  });
});
