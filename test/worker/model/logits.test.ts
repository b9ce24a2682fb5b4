import { describe, expect, it } from "vitest";
import {
  applyRules,
  type LogitsRules,
  NO_RULES,
  TokenHistory,
  tokenLogprob,
} from "../../../worker/model/logits.ts";

const rules = (r: Partial<LogitsRules>): LogitsRules => ({ ...NO_RULES, ...r });
const NEG = Number.NEGATIVE_INFINITY;

function applied(
  row: number[],
  r: Partial<LogitsRules>,
  prompt: number[],
  out: number[],
  stops: number[] = [],
): number[] {
  const h = new TokenHistory(prompt, (r.repetitionPenalty ?? 1) !== 1);
  for (const t of out) h.add(t);
  const x = Float32Array.from(row);
  applyRules(x, rules(r), h, out.length, stops);
  return [...x];
}

describe("logits rules (vLLM's processors and penalties)", () => {
  it("repetition divides positive and multiplies negative logits of prompt and output ids, once each", () => {
    // ids 0 (prompt), 1 (output), 2 (both, twice), 3 (untouched)
    const got = applied([4, -4, 2, 1], { repetitionPenalty: 2 }, [0, 2], [1, 2, 2]);
    expect(got).toEqual([2, -8, 1, 1]);
  });

  it("frequency subtracts per occurrence and presence once, over output ids only", () => {
    const got = applied([1, 1, 1, 1], { frequencyPenalty: 0.5, presencePenalty: 0.25 }, [3], [0, 1, 1]);
    expect(got).toEqual([1 - 0.5 - 0.25, 1 - 1 - 0.25, 1, 1]);
  });

  it("logit bias adds, allowed ids mask the rest, before the penalties", () => {
    expect(applied([1, 2, 3], { logitBias: new Map([[0, 10]]) }, [], [])).toEqual([11, 2, 3]);
    expect(applied([1, 2, 3], { allowedTokenIds: new Set([1]) }, [], [])).toEqual([NEG, 2, NEG]);
    // bias then repetition: (1 + 3) / 2
    expect(applied([1, 0, 0], { logitBias: new Map([[0, 3]]), repetitionPenalty: 2 }, [0], [])[0]).toBe(2);
  });

  it("min_tokens masks the stop ids until enough tokens were generated, unless nothing else is left", () => {
    expect(applied([5, 1, 1], { minTokens: 2 }, [], [1], [0])).toEqual([NEG, 1, 1]);
    expect(applied([5, 1, 1], { minTokens: 2 }, [], [1, 1], [0])).toEqual([5, 1, 1]);
    // allowed = the stop id only: a token must still exist, so min_tokens yields.
    expect(applied([5, 1, 1], { minTokens: 2, allowedTokenIds: new Set([0]) }, [], [], [0])).toEqual([
      5,
      NEG,
      NEG,
    ]);
  });

  it("neutral rules leave the row bit for bit", () => {
    const row = [0.1, -3, 7e-8, 2];
    expect(applied(row, {}, [0, 1], [2, 3], [0])).toEqual([...Float32Array.from(row)]);
  });
});

describe("log-probabilities", () => {
  // exp in f32 and the sum in f64 (vLLM's f32 log_softmax): within 1e-6 of the float64 log-softmax.
  it("are the log-softmax, with the top ids in rank order (ties by lower id) and vLLM's rank", () => {
    const row = Float32Array.from([1, 3, 3, -2, 0.5]);
    const lse = Math.log(row.reduce((a, x) => a + Math.exp(x), 0));
    const lp = tokenLogprob(row, 4, 3);
    expect(lp.token).toBe(4);
    expect(lp.logprob).toBeCloseTo(0.5 - lse, 6);
    expect(lp.rank).toBe(4);
    expect(lp.top.map(([id]) => id)).toEqual([1, 2, 0]);
    expect(lp.top[0]![1]).toBeCloseTo(3 - lse, 6);
    expect(lp.top[0]![1]).toBe(lp.top[1]![1]);
    expect(tokenLogprob(row, 0, 0).top).toEqual([]);
    expect(tokenLogprob(row, 1, 9).top).toHaveLength(5);
  });

  it("stay finite for extreme logits (stabilised by the maximum)", () => {
    const row = Float32Array.from([1000, 999, -1000]);
    const lp = tokenLogprob(row, 1, 1);
    expect(lp.logprob).toBeCloseTo(-1 - Math.log(1 + Math.exp(-1)), 6);
    expect(Number.isFinite(lp.top[0]![1])).toBe(true);
  });
});
