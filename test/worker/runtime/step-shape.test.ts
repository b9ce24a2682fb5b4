import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { type Lane, stepShape } from "../../../worker/runtime/batch.ts";

function lane(firstPosition: number, rows: number, wantLogits: boolean): Lane {
  return {
    tokens: Array.from({ length: rows }, () => 1),
    firstPosition,
    slots: Array.from({ length: rows }, (_, k) => firstPosition + k),
    pageTable: [],
    wantLogits,
  };
}

describe("stepShape", () => {
  it("splits rows by kind and counts the keys each row attends (position + 1)", () => {
    // Two decodes at positions 10 and 99; a prefill tile of 3 rows from 40 and one of 1 row from 0.
    const s = stepShape([lane(10, 1, true), lane(40, 3, false), lane(99, 1, true), lane(0, 1, false)]);
    expect(s).toEqual({ decodeRows: 2, decodeKeys: 11 + 100, prefillRows: 4, prefillKeys: 41 + 42 + 43 + 1 });
    expect(stepShape([])).toEqual({ decodeRows: 0, decodeKeys: 0, prefillRows: 0, prefillKeys: 0 });
  });

  it("equals the row-by-row sum for any lanes", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.tuple(fc.integer({ min: 0, max: 5000 }), fc.integer({ min: 1, max: 300 }), fc.boolean()),
          {
            maxLength: 20,
          },
        ),
        (ls) => {
          const want = { decodeRows: 0, decodeKeys: 0, prefillRows: 0, prefillKeys: 0 };
          for (const [p, t, d] of ls)
            for (let k = 0; k < t; k++) {
              if (d) {
                want.decodeRows++;
                want.decodeKeys += p + k + 1;
              } else {
                want.prefillRows++;
                want.prefillKeys += p + k + 1;
              }
            }
          expect(stepShape(ls.map(([p, t, d]) => lane(p, t, d)))).toEqual(want);
        },
      ),
    );
  });
});
