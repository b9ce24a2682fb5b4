import { describe, expect, it } from "vitest";
import { type GroupInput, planRestore, type RestorePlanInput } from "../../../worker/restore/plan.ts";

type Tier = "ram" | "ssd" | "peer" | "s3";
const offer = (sources: { tier: Tier; costMs: number }[]) => ({
  bytes: 1000,
  sources: sources.map((s) => ({ ...s, worker: "w" })),
});
const ram = (costMs = 1) => offer([{ tier: "ram", costMs }]);
const chain = (n: number) => Array.from({ length: n }, (_, i) => ({ start: i * 100, tokens: 100 }));
const global = (chunks: GroupInput["chunks"], availablePages = 100): GroupInput => ({
  window: null,
  chunks,
  availablePages,
});
const base: Omit<RestorePlanInput, "groups"> = {
  processedTokens: 350,
  residentTokens: 0,
  pageTokens: 16,
  prefillPerTokenMs: 1,
  chain: chain(3),
};

describe("restore planning, one group", () => {
  it("restores the longest prefix that is cheaper than recompute, cheapest source first", () => {
    const p = planRestore({
      ...base,
      groups: [
        global([
          offer([
            { tier: "s3", costMs: 50 },
            { tier: "ram", costMs: 5 },
          ]),
          offer([{ tier: "ssd", costMs: 10 }]),
          offer([{ tier: "s3", costMs: 20 }]),
        ]),
      ],
    });
    expect(p.restoreTo).toBe(300);
    const chunks = p.loads[0]!.chunks;
    expect(chunks.map((c) => c.sources[0]!.tier)).toEqual(["ram", "ssd", "s3"]);
    expect(chunks[0]!.sources.map((s) => s.tier)).toEqual(["ram", "s3"]);
    expect(p.predictedMs).toBe(5 + 10 + 20 + 50);
    expect(p.recomputeMs).toBe(350);
    expect(p.loads[0]).toMatchObject({ group: 0, skipPages: 0, from: 0 });
  });

  it("recomputes when every source costs more than the tokens", () => {
    const p = planRestore({ ...base, groups: [global([offer([{ tier: "s3", costMs: 500 }])])] });
    expect(p.restoreTo).toBe(0);
    expect(p.loads).toEqual([]);
  });

  it("stops at a chunk without sources, and picks a shorter prefix under page pressure", () => {
    expect(planRestore({ ...base, groups: [global([ram(), offer([]), ram()])] }).restoreTo).toBe(100);
    expect(planRestore({ ...base, groups: [global([ram(), ram()], 10)] }).restoreTo).toBe(100);
  });

  it("skips what is resident and never restores the pending token's row", () => {
    const p = planRestore({
      ...base,
      processedTokens: 399,
      residentTokens: 160,
      chain: chain(4),
      groups: [global([ram(), ram(), ram(), ram()])],
    });
    expect(p.restoreTo).toBe(300);
    expect(p.loads[0]!.chunks.map((c) => c.index)).toEqual([1, 2]);
    expect(p.loads[0]!.from).toBe(160);
  });

  it("refuses a resident count that is not whole pages, and a chain with a gap", () => {
    expect(() => planRestore({ ...base, residentTokens: 10, groups: [] })).toThrow(/whole pages/);
    const gap = [
      { start: 0, tokens: 100 },
      { start: 120, tokens: 100 },
    ];
    expect(() => planRestore({ ...base, chain: gap, groups: [] })).toThrow(/starts at 120/);
  });
});

describe("restore planning over layer groups", () => {
  // 8 chunks of 100 rows and 790 processed: chunk 7 ends past them, so a restore ends by row 700.
  const long = { ...base, processedTokens: 790, chain: chain(8) };
  const all = (n: number) => Array.from({ length: n }, () => ram());
  const sliding = (chunks: GroupInput["chunks"], window = 150, availablePages = 100): GroupInput => ({
    window,
    chunks,
    availablePages,
  });

  it("restores every group to one row: the global group reads every chunk, the sliding one only its window's", () => {
    const p = planRestore({ ...long, groups: [global(all(8)), sliding(all(8))] });
    expect(p.restoreTo).toBe(700);
    expect(p.loads.map((l) => l.group)).toEqual([0, 1]);
    expect(p.loads[0]!.chunks.map((c) => c.index)).toEqual([0, 1, 2, 3, 4, 5, 6]);
    // At row 700 a window of 150 reads rows ≥ 551: pages from floor(551 / 16) = 34 (row 544) on.
    const s = p.loads[1]!;
    expect(s).toMatchObject({ skipPages: 34, from: 544 });
    expect(s.chunks.map((c) => c.index)).toEqual([5, 6]);
    expect(s.chunks.every((c) => c.group === 1)).toBe(true);
    expect(p.predictedMs).toBe(7 + 2 + 90);
  });

  it("a sliding group's chunks outside its window need no source", () => {
    const unreadable = [...Array.from({ length: 5 }, () => offer([])), ram(), ram(), ram()];
    const p = planRestore({ ...long, groups: [global(all(8)), sliding(unreadable)] });
    expect(p.restoreTo).toBe(700);
    expect(p.loads[1]!.chunks.map((c) => c.index)).toEqual([5, 6]);
  });

  it("recomputes when a needed chunk of any group is missing: all groups or none", () => {
    // The sliding group's chunk 6 has no source, or its chain is published only to chunk 5.
    for (const s of [sliding([...all(6), offer([]), ram()]), sliding(all(6))]) {
      const p = planRestore({ ...long, chain: chain(7), groups: [global(all(7)), s] });
      // Row 700 needs the sliding group's chunk 6; row 600 needs its chunks 4 and 5, which it has.
      expect(p.restoreTo).toBe(600);
      expect(p.loads[1]!.chunks.map((c) => c.index)).toEqual([4, 5]);
    }
    // The global group lacks chunk 0: no row can be restored in it, so none is restored in any group.
    const p = planRestore({ ...long, groups: [global([offer([]), ...all(7)]), sliding(all(8))] });
    expect(p.restoreTo).toBe(0);
    expect(p.loads).toEqual([]);
  });

  it("fits each group's pages into its own reservation", () => {
    // Row 700 leaves the sliding group (window 150) 10 pages, [34, 44); 9 fit only row 100's 7.
    const p = planRestore({ ...long, groups: [global(all(8)), sliding(all(8), 150, 9)] });
    expect(p.restoreTo).toBe(100);
    const q = planRestore({ ...long, groups: [global(all(8)), sliding(all(8), 150, 10)] });
    expect(q.restoreTo).toBe(700);
    // The global group's 44 pages do not fit 40.
    expect(planRestore({ ...long, groups: [global(all(8), 40), sliding(all(8))] }).restoreTo).toBe(600);
  });

  it("a resident prefix inside the window leaves nothing skipped", () => {
    const p = planRestore({ ...long, residentTokens: 640, groups: [global(all(8)), sliding(all(8))] });
    expect(p.restoreTo).toBe(700);
    for (const l of p.loads) {
      expect(l).toMatchObject({ skipPages: 0, from: 640 });
      expect(l.chunks.map((c) => c.index)).toEqual([6]);
    }
  });
});
