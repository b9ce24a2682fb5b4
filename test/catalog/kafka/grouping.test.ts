import { describe, expect, it } from "vitest";
import { type BatchLimits, checkBatchLimits, groupEnd, groups } from "../../../catalog/kafka/grouping.ts";
import { sizes } from "./helpers.ts";

/**
 * The one greedy grouping rule (catalog/kafka/grouping.ts) that cuts the
 * proposer's produce requests, the writer's transactions, the tx records it
 * packs and the produce requests of a commit.
 */

describe("greedy grouping (pure)", () => {
  it("groups end on item boundaries, hold at most maxRecords records and maxBytes unless one item alone exceeds them, and concatenate to the input", () => {
    for (const [seed, limits] of [
      [1, { maxRecords: 7, maxBytes: 1_000 }],
      [2, { maxRecords: 1, maxBytes: 10 }],
      [3, { maxRecords: 500, maxBytes: 300 }],
      [4, { maxRecords: 3, maxBytes: 1 << 20 }],
    ] as const) {
      // Items of 1-3 records (a packed record is never split) of 1..400 bytes each.
      const counts = sizes(2_000, seed + 100, 3);
      const items = sizes(2_000, seed, 400).map((size, i) => ({ i, records: counts[i]!, bytes: size }));
      const gs = groups(
        items,
        limits,
        (t) => t.bytes,
        (t) => t.records,
      );
      for (const g of gs) {
        expect(g.length).toBeGreaterThanOrEqual(1);
        const records = g.reduce((s, t) => s + t.records, 0);
        const total = g.reduce((s, t) => s + t.bytes, 0);
        if (g.length > 1) {
          expect(records).toBeLessThanOrEqual(limits.maxRecords);
          expect(total).toBeLessThanOrEqual(limits.maxBytes);
        }
      }
      expect(gs.flat().map((t) => t.i)).toEqual(items.map((t) => t.i));
      // Greedy: the next group's first item would not have fit in the one before.
      for (let k = 1; k < gs.length; k++) {
        const prev = gs[k - 1]!;
        const first = gs[k]![0]!;
        const records = prev.reduce((s, t) => s + t.records, 0) + first.records;
        const total = prev.reduce((s, t) => s + t.bytes, 0) + first.bytes;
        expect(records > limits.maxRecords || total > limits.maxBytes).toBe(true);
      }
    }
  });

  it("fills a group as far as the bounds allow, an item over maxBytes goes alone, and an item counts one record unless told", () => {
    const limits: BatchLimits = { maxRecords: 4, maxBytes: 100 };
    const end = (xs: number[], from = 0) => groupEnd(xs.length, from, limits, (i) => xs[i]!);
    expect(end([10, 10, 10, 10, 10])).toBe(4);
    expect(end([60, 40, 1])).toBe(2);
    expect(end([60, 41])).toBe(1);
    expect(end([500, 1])).toBe(1);
    expect(end([1, 500])).toBe(1);
    expect(end([1, 2, 3], 3)).toBe(3);
    expect(end([1, 2, 3, 4, 5, 6], 2)).toBe(6);
    // Three records per item: one item fits 4, two do not; an item of 9 records goes alone.
    const three = [3, 3, 3];
    expect(
      groupEnd(
        3,
        0,
        limits,
        () => 1,
        (i) => three[i]!,
      ),
    ).toBe(1);
    expect(
      groupEnd(
        2,
        0,
        limits,
        () => 1,
        (i) => [9, 1][i]!,
      ),
    ).toBe(1);
    expect(groups([], limits, () => 1)).toEqual([]);
  });

  it("refuses bounds that are not positive integers, naming the field", () => {
    expect(() => checkBatchLimits("writerTx", { maxRecords: 0, maxBytes: 1 })).toThrow(
      /writerTx\.maxRecords must be a positive integer, got 0/,
    );
    expect(() => checkBatchLimits("proposalSend", { maxRecords: 2, maxBytes: 1.5 })).toThrow(
      /proposalSend\.maxBytes must be a positive integer, got 1\.5/,
    );
  });
});
