import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { chainDemand, DecayedDemand } from "../../../controller/placement/demand.ts";
import { claimFrom, mayIssue, nextLeaseAction } from "../../../controller/placement/lease.ts";
import {
  defaultPlacementPolicy,
  type Placement,
  type PlacementChunk,
  type PlacementInput,
  planPlacements,
} from "../../../controller/placement/policy.ts";
import type { NodeId, WorkerId } from "../../../schema/ids.ts";

const node = (...parts: (string | number)[]) =>
  createHash("sha256").update(parts.join("/")).digest("hex") as NodeId;
const MIB = 1 << 20;

/** A chain of `n` 1-MiB chunks for `name`, each with `demand` (a parent's demand includes its children's). */
function chain(name: string, n: number, demand: number): PlacementChunk[] {
  const out: PlacementChunk[] = [];
  for (let i = 0; i < n; i++)
    out.push({
      node: node(name, i),
      parent: i === 0 ? null : node(name, i - 1),
      bytes: MIB,
      demand,
      localHolders: [],
    });
  return out;
}

const workers = (n: number, ram = 4 * MIB, ssd = 4 * MIB) =>
  Array.from({ length: n }, (_, i) => ({ workerId: `w${i}` as WorkerId, budgetBytes: { ram, ssd } }));

function input(over: Partial<PlacementInput>): PlacementInput {
  return { chunks: [], workers: workers(3), current: [], policy: defaultPlacementPolicy, ...over };
}

const where = (ps: readonly Placement[], n: NodeId) =>
  ps
    .filter((p) => p.node === n)
    .map((p) => `${p.workerId}:${p.tier}`)
    .sort();

describe("planPlacements", () => {
  it("spreads a hot chain over more workers than a cold one, whole chains from the root", () => {
    const hot = chain("hot", 3, 30);
    const cold = chain("cold", 3, 3);
    const plan = planPlacements(input({ chunks: [...hot, ...cold] }));
    // share(hot) = 30/33 → 1 + ⌊0.91 × 3 × 2⌋ = 6 → capped at 3 workers; share(cold) = 0.09 → 1 + 0 = 1.
    for (const c of hot) expect(where(plan.desired, c.node)).toHaveLength(3);
    for (const c of cold) expect(where(plan.desired, c.node)).toHaveLength(1);
    // A child is only where its parent is.
    for (const list of [hot, cold])
      for (let i = 1; i < list.length; i++) {
        const parentAt = new Set(where(plan.desired, list[i - 1]!.node).map((s) => s.split(":")[0]));
        for (const w of where(plan.desired, list[i]!.node)) expect(parentAt.has(w.split(":")[0])).toBe(true);
      }
    expect(plan.changes.every((c) => c.desired)).toBe(true);
    expect(plan.changes).toHaveLength(plan.desired.length);
  });

  it("gives a chain a second home: a worker without a local copy first, unless another holds the placement now", () => {
    // Two chains of equal demand: share 0.5 → 1 + ⌊0.5 × 3 × 0⌋ = 1 replica each (spread 0).
    const held = (name: string, holder: string) =>
      chain(name, 2, 10).map((c) => ({ ...c, localHolders: [holder as WorkerId] }));
    const chunks = [...held("a", "w0"), ...held("b", "w1")];
    const policy = { ...defaultPlacementPolicy, spread: 0 };
    const plan = planPlacements(input({ chunks, workers: workers(2), policy }));
    // Budget and id alone would put both on w0; each goes where it is not held.
    expect(where(plan.desired, node("a", 0))).toEqual(["w1:ram"]);
    expect(where(plan.desired, node("a", 1))).toEqual(["w1:ram"]);
    expect(where(plan.desired, node("b", 0))).toEqual(["w0:ram"]);
    // A placement desired now stays where it is (no churn), even on a holder.
    const current = [0, 1].map((i) => ({
      node: node("a", i),
      workerId: "w0" as WorkerId,
      tier: "ram" as const,
    }));
    const kept = planPlacements(input({ chunks, workers: workers(2), policy, current }));
    expect(where(kept.desired, node("a", 0))).toEqual(["w0:ram"]);
    expect(kept.changes.filter((c) => c.node === node("a", 0))).toEqual([]);
  });

  it("keeps each worker's placed bytes within its budget: RAM first, then SSD, then nothing", () => {
    const chunks = [...chain("a", 3, 50), ...chain("b", 3, 40), ...chain("c", 3, 30)];
    const plan = planPlacements(
      input({
        chunks,
        workers: workers(2, 2 * MIB, 3 * MIB),
        policy: { ...defaultPlacementPolicy, spread: 4 },
      }),
    );
    for (const w of ["w0", "w1"]) {
      const mine = plan.desired.filter((p) => p.workerId === w);
      expect(mine.filter((p) => p.tier === "ram")).toHaveLength(2);
      expect(mine.filter((p) => p.tier === "ssd")).toHaveLength(3);
    }
    // The hottest chain took the RAM.
    expect(where(plan.desired, node("a", 0))).toEqual(["w0:ram", "w1:ram"]);
    expect(where(plan.desired, node("a", 2))).toEqual(["w0:ssd", "w1:ssd"]);
    // Five of nine chunks fit per worker: the coldest chain's tail is left out.
    expect(where(plan.desired, node("c", 2))).toEqual([]);
  });

  it("is a function of its input: shuffled inputs give the same plan", () => {
    const chunks = [...chain("a", 4, 9), ...chain("b", 2, 7), ...chain("c", 5, 2)];
    const base = planPlacements(input({ chunks }));
    const shuffled = planPlacements(
      input({ chunks: [...chunks].reverse(), workers: [...workers(3)].reverse() }),
    );
    expect(shuffled).toEqual(base);
  });

  it("keeps a chunk where it is placed now, and withdraws what is no longer wanted", () => {
    const hot = chain("hot", 2, 10);
    const gone = chain("gone", 1, 1);
    const current: Placement[] = [
      { node: hot[0]!.node, workerId: "w2" as WorkerId, tier: "ram" },
      { node: hot[1]!.node, workerId: "w2" as WorkerId, tier: "ram" },
      { node: gone[0]!.node, workerId: "w0" as WorkerId, tier: "ram" },
      // A worker that left: its placement goes.
      { node: hot[0]!.node, workerId: "w9" as WorkerId, tier: "ram" },
    ];
    const plan = planPlacements(
      input({ chunks: [...hot, ...gone], current, policy: { ...defaultPlacementPolicy, maxReplicas: 1 } }),
    );
    expect(where(plan.desired, hot[0]!.node)).toEqual(["w2:ram"]);
    expect(where(plan.desired, hot[1]!.node)).toEqual(["w2:ram"]);
    // Nothing new to add; two withdrawals, first among the changes.
    expect(plan.changes.map((c) => `${c.workerId}:${c.desired}`)).toEqual(["w0:false", "w9:false"]);
  });

  it("bounds the changes of one plan and says how many it deferred", () => {
    const chunks = Array.from({ length: 20 }, (_, i) => chain(`p${i}`, 1, 5 + i)).flat();
    const plan = planPlacements(
      input({
        chunks,
        workers: workers(3, 64 * MIB, 0),
        policy: { ...defaultPlacementPolicy, maxChanges: 7 },
      }),
    );
    expect(plan.changes).toHaveLength(7);
    expect(plan.deferred).toBe(plan.desired.length - 7);
    // The most wanted first.
    expect(plan.changes[0]!.node).toBe(node("p19", 0));
  });

  it("places nothing below minDemand and refuses a bad policy", () => {
    expect(planPlacements(input({ chunks: chain("x", 2, 1.5) })).desired).toEqual([]);
    expect(() => planPlacements(input({ policy: { ...defaultPlacementPolicy, maxReplicas: 0 } }))).toThrow(
      /maxReplicas/,
    );
  });
});

describe("demand", () => {
  it("decays by half-life and credits ancestors", () => {
    const d = new DecayedDemand(1_000, 16);
    d.add(node("a", 1), 4, 0);
    d.add(node("a", 1), 4, 1_000);
    expect(d.at(1_000).get(node("a", 1))).toBeCloseTo(6, 10);
    expect(d.at(2_000).get(node("a", 1))).toBeCloseTo(3, 10);
    const parents = new Map([[node("a", 1), node("a", 0)]]);
    const chained = chainDemand(d.at(2_000), (n) => parents.get(n) ?? null);
    expect(chained.get(node("a", 0))).toBeCloseTo(3, 10);
  });

  it("holds at most maxNodes nodes, dropping the coldest", () => {
    const d = new DecayedDemand(1_000, 2);
    d.add(node("hot"), 10, 0);
    d.add(node("cold"), 1, 0);
    d.add(node("new"), 2, 0);
    expect([...d.at(0).keys()].sort()).toEqual([node("hot"), node("new")].sort());
  });
});

describe("lease candidate", () => {
  const fact = (holder: string, epoch: number, expiresAt: number, held = true) => ({
    holder,
    epoch,
    held,
    expiresAt,
  });
  it("acquires a free or lapsed lease at the next epoch, renews its own, waits on another's", () => {
    expect(nextLeaseAction(null, "a", null, 0)).toEqual({ kind: "acquire", epoch: 1 });
    const claim = claimFrom(3, 100, 6_000, 500);
    expect(nextLeaseAction(fact("a", 3, 9_000), "a", claim, 5_000)).toEqual({ kind: "renew", epoch: 3 });
    expect(nextLeaseAction(fact("b", 3, 9_000), "a", null, 5_000).kind).toBe("wait");
    expect(nextLeaseAction(fact("b", 3, 9_000), "a", null, 9_000)).toEqual({ kind: "acquire", epoch: 4 });
    expect(nextLeaseAction(fact("b", 3, 9_000, false), "a", null, 0)).toEqual({ kind: "acquire", epoch: 4 });
    // Its own lease without a claim (it lapsed here): a fresh epoch, never a renewal.
    expect(nextLeaseAction(fact("a", 3, 9_000), "a", null, 0)).toEqual({ kind: "acquire", epoch: 4 });
  });

  it("issues only within the claim measured from when the acquire was sent", () => {
    const claim = claimFrom(2, 1_000, 6_000, 500);
    expect(mayIssue(claim, 6_499)).toBe(true);
    expect(mayIssue(claim, 6_500)).toBe(false);
    expect(mayIssue(null, 0)).toBe(false);
  });
});
