import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { candidates, type SamplingParams, samplingParams } from "../../../worker/model/sampling.ts";

/**
 * The runtime samples every generated token over the whole vocabulary, so
 * candidates() selects the top k with a heap and sorts float32 logits by
 * packed numeric keys instead of a comparator sort of every id. These check
 * that the result is exactly (ids and probability bits) what the plain
 * definition gives: sort all ids by logit descending, ties by lower id; keep
 * k; softmax by temperature; top-p cut; renormalise.
 */
function reference(logits: ArrayLike<number>, p: SamplingParams): { ids: number[]; probs: number[] } {
  const n = logits.length;
  const ids = Array.from({ length: n }, (_, i) => i);
  ids.sort((a, b) => logits[b]! - logits[a]! || a - b);
  const kept = ids.slice(0, p.topK > 0 ? Math.min(p.topK, n) : n);
  const top = logits[kept[0]!]!;
  let sum = 0;
  const w = kept.map((id) => {
    const e = Math.exp((logits[id]! - top) / p.temperature);
    sum += e;
    return e;
  });
  let probs = w.map((x) => x / sum);
  let out = kept;
  if (p.topP < 1) {
    let mass = 0;
    let cut = probs.length;
    for (let i = 0; i < probs.length; i++) {
      mass += probs[i]!;
      if (mass >= p.topP) {
        cut = i + 1;
        break;
      }
    }
    out = kept.slice(0, cut);
    const renorm = probs.slice(0, cut).reduce((a, b) => a + b, 0);
    probs = probs.slice(0, cut).map((x) => x / renorm);
  }
  return { ids: out, probs };
}

// Few distinct values (many ties), both zeros, negatives, and extremes.
const logit = fc.oneof(
  fc.constantFrom(0, -0, 1, -1, 2.5, -2.5, 1e-30, -1e-30, 3.4e38, -3.4e38),
  fc.float({ noNaN: true, noDefaultInfinity: true }),
);
const params = fc.record({
  temperature: fc.constantFrom(0.05, 0.7, 1, 2),
  topK: fc.nat({ max: 70 }),
  topP: fc.constantFrom(1, 0.95, 0.5, 0.01),
});

describe("sampling candidates (selection without a full comparator sort)", () => {
  it("float32 logits: same ids and probabilities as the full sort", () => {
    fc.assert(
      fc.property(fc.array(logit, { minLength: 1, maxLength: 300 }), params, (values, q) => {
        // A subarray at an offset, as the runtime passes one row of the step's logits.
        const backing = new Float32Array(values.length + 3);
        backing.set(values, 3);
        const row = backing.subarray(3);
        const p = samplingParams(q);
        expect(candidates(row, p)).toEqual(reference(row, p));
      }),
      { numRuns: 400 },
    );
  });

  it("plain number logits: same ids and probabilities as the full sort", () => {
    fc.assert(
      fc.property(
        fc.array(fc.double({ noNaN: true, min: -50, max: 50 }), { minLength: 1, maxLength: 200 }),
        params,
        (values, q) => {
          const p = samplingParams(q);
          expect(candidates(values, p)).toEqual(reference(values, p));
        },
      ),
      { numRuns: 300 },
    );
  });

  it("a vocabulary-sized row: top-k and the whole vocabulary", () => {
    const row = new Float32Array(8192);
    let x = 12345;
    for (let i = 0; i < row.length; i++) {
      x = (x * 1103515245 + 12345) >>> 0;
      // Quantised so ties occur across the vocabulary.
      row[i] = Math.round(((x % 20000) - 10000) / 50) / 10;
    }
    for (const q of [
      { temperature: 0.8, topK: 40, topP: 0.95 },
      { temperature: 1, topK: 0, topP: 1 },
      { temperature: 0.7, topK: 0, topP: 0.9 },
    ]) {
      const p = samplingParams(q);
      expect(candidates(row, p)).toEqual(reference(row, p));
    }
  });
});
