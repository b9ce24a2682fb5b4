import fc from "fast-check";
import { describe, expect, it } from "vitest";
import type { PageId } from "../../../schema/ids.ts";
import { EvictionQueue } from "../../../worker/pages/eviction-queue.ts";

interface Entry {
  page: number;
  value: number;
  lastUse: number;
  depth: number;
}

/** The order the queue promises, written plainly: value, then older use, then deeper, then lower id. */
const order = (a: Entry, b: Entry) =>
  a.value - b.value || a.lastUse - b.lastUse || b.depth - a.depth || a.page - b.page;

const N = 64;
const op = fc.record({
  kind: fc.integer({ min: 0, max: 3 }),
  page: fc.nat(N - 1),
  value: fc.integer({ min: 0, max: 4 }),
  lastUse: fc.integer({ min: 0, max: 4 }),
  depth: fc.integer({ min: 1, max: 4 }),
});

describe("EvictionQueue", () => {
  it("pops in eviction order under any mix of inserts, removals and revaluations, at O(log n) per operation", () => {
    fc.assert(
      fc.property(fc.array(op, { maxLength: 300 }), (ops) => {
        const q = new EvictionQueue(N);
        const model = new Map<number, Entry>();
        for (const o of ops) {
          const page = o.page as PageId;
          const before = q.work;
          if (o.kind === 0 && !model.has(o.page)) {
            q.insert(page, o.value, o.lastUse, o.depth);
            model.set(o.page, { page: o.page, value: o.value, lastUse: o.lastUse, depth: o.depth });
          } else if (o.kind === 1 && model.has(o.page)) {
            q.remove(page);
            model.delete(o.page);
          } else if (o.kind === 2 && model.has(o.page)) {
            q.revalue(page, o.value);
            model.get(o.page)!.value = o.value;
          } else if (o.kind === 3) {
            const expected = [...model.values()].sort(order)[0];
            expect(q.pop()).toBe(expected?.page);
            if (expected) model.delete(expected.page);
          }
          // Each operation walks at most two root-to-leaf paths.
          expect(q.work - before).toBeLessThanOrEqual(2 * (Math.log2(N) + 2));
          expect(q.size).toBe(model.size);
          for (let p = 0; p < N; p++) expect(q.has(p as PageId)).toBe(model.has(p));
        }
        const drained: number[] = [];
        for (let p = q.pop(); p !== undefined; p = q.pop()) drained.push(p);
        expect(drained).toEqual([...model.values()].sort(order).map((e) => e.page));
      }),
      { numRuns: 200 },
    );
  });

  it("refuses a page queued twice, an unqueued removal and a value that is not finite", () => {
    const q = new EvictionQueue(4);
    q.insert(1 as PageId, 1, 0, 1);
    expect(() => q.insert(1 as PageId, 2, 0, 1)).toThrow(/twice/);
    expect(() => q.remove(2 as PageId)).toThrow(/not queued/);
    expect(() => q.insert(3 as PageId, Number.NaN, 0, 1)).toThrow(RangeError);
    expect(q.size).toBe(1);
  });
});
