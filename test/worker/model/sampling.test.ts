import { describe, expect, it } from "vitest";
import { TokenHistory } from "../../../worker/model/logits.ts";
import { seedRng } from "../../../worker/model/prng.ts";
import {
  argmax,
  candidates,
  initialSamplerState,
  nextToken,
  sampleToken,
  samplingParams,
} from "../../../worker/model/sampling.ts";

const probs = [0.05, 0.5, 0.15, 0.3];
const logits = probs.map(Math.log);

function draws(p: ReturnType<typeof samplingParams>, n: number, lg: ArrayLike<number> = logits): number[] {
  let rng = seedRng(p.seed);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const r = sampleToken(lg, p, rng);
    out.push(r.token);
    rng = r.rng;
  }
  return out;
}

describe("sampling", () => {
  it("greedy is argmax with ties to the lowest id, and consumes no randomness", () => {
    expect(argmax([1, 3, 3, 2])).toBe(1);
    const p = samplingParams({});
    const rng = seedRng(1);
    const r = sampleToken(logits, p, rng);
    expect(r.token).toBe(1);
    expect(r.rng).toBe(rng);
  });

  it("is reproducible from the seed and differs across seeds", () => {
    const flat = Array.from({ length: 50 }, (_, i) => Math.sin(i) * 0.1);
    const a = draws(samplingParams({ temperature: 1, seed: 42 }), 40, flat);
    const b = draws(samplingParams({ temperature: 1, seed: 42 }), 40, flat);
    const c = draws(samplingParams({ temperature: 1, seed: 43 }), 40, flat);
    expect(a).toEqual(b);
    expect(c).not.toEqual(a);
  });

  it("follows the softmax distribution at temperature 1", () => {
    const n = 20000;
    const got = draws(samplingParams({ temperature: 1, seed: 9 }), n);
    for (let id = 0; id < probs.length; id++) {
      const freq = got.filter((t) => t === id).length / n;
      expect(Math.abs(freq - probs[id]!)).toBeLessThan(0.02);
    }
  });

  it("top-k keeps exactly the k most likely tokens", () => {
    const p = samplingParams({ temperature: 1, topK: 2, seed: 3 });
    expect(candidates(logits, p).ids).toEqual([1, 3]);
    expect(new Set(draws(p, 500))).toEqual(new Set([1, 3]));
  });

  it("top-p keeps the smallest most-likely set whose mass reaches p", () => {
    expect(candidates(logits, samplingParams({ temperature: 1, topP: 0.79 })).ids).toEqual([1, 3]);
    expect(candidates(logits, samplingParams({ temperature: 1, topP: 0.81 })).ids).toEqual([1, 3, 2]);
    expect(candidates(logits, samplingParams({ temperature: 1, topP: 0.1 })).ids).toEqual([1]);
    const c = candidates(logits, samplingParams({ temperature: 1, topP: 0.79 }));
    expect(c.probs[0]! + c.probs[1]!).toBeCloseTo(1, 12);
    expect(new Set(draws(samplingParams({ temperature: 1, topP: 0.79, seed: 4 }), 500))).toEqual(
      new Set([1, 3]),
    );
  });

  it("min-p keeps the tokens at least min_p times as likely as the most likely, at the temperature", () => {
    // probs 0.05, 0.5, 0.15, 0.3: min_p 0.5 keeps p >= 0.25 -> ids 1, 3
    expect(candidates(logits, samplingParams({ temperature: 1, minP: 0.5 })).ids).toEqual([1, 3]);
    expect(candidates(logits, samplingParams({ temperature: 1, minP: 0.29 })).ids).toEqual([1, 3, 2]);
    // temperature 2 flattens: p ∝ sqrt(probs), sqrt(0.05/0.5) ≈ 0.32 clears min_p 0.3
    expect(candidates(logits, samplingParams({ temperature: 2, minP: 0.3 })).ids).toEqual([1, 3, 2, 0]);
    // with top-k both cuts hold
    expect(candidates(logits, samplingParams({ temperature: 1, minP: 0.29, topK: 2 })).ids).toEqual([1, 3]);
  });

  it("applies the request's rules before the draw and reports raw log-probabilities", () => {
    const params = samplingParams({
      logprobs: 2,
      rules: {
        repetitionPenalty: 1,
        presencePenalty: 0,
        frequencyPenalty: 0,
        logitBias: new Map([[0, 100]]),
        minTokens: 0,
        allowedTokenIds: null,
      },
    });
    const r = nextToken(initialSamplerState(params), logits, new TokenHistory([], false));
    expect(r.token).toBe(0);
    // raw: id 0 had probability 0.05, and the top two are ids 1 and 3 (f32 exp: within 1e-6)
    expect(r.logprob!.logprob).toBeCloseTo(Math.log(0.05), 6);
    expect(r.logprob!.top.map(([id]) => id)).toEqual([1, 3]);
  });

  it("low temperature sharpens towards the argmax", () => {
    const c = candidates(logits, samplingParams({ temperature: 0.1 }));
    expect(c.ids[0]).toBe(1);
    expect(c.probs[0]!).toBeGreaterThan(0.99);
  });

  it("keeps its state in the request: forks from one state sample alike, stop tokens and length end it", () => {
    const params = samplingParams({ temperature: 1, seed: 5, stopTokens: [0], maxTokens: 3 });
    const s0 = initialSamplerState(params);
    const a = nextToken(s0, logits);
    const b = nextToken(s0, logits);
    expect(a.token).toBe(b.token);
    expect(a.state).toEqual(b.state);
    expect(s0.generated).toBe(0);
    expect(nextToken(s0, [10, 0, 0, 0]).finish).toBe("stop");
    let s = s0;
    let last = null as ReturnType<typeof nextToken> | null;
    for (let i = 0; i < 3; i++) {
      last = nextToken(s, [0, 10, 0, 0]);
      s = last.state;
    }
    expect(last!.finish).toBe("length");
    expect(() => nextToken(s, logits)).toThrow(/already produced/);
  });

  it.each([
    [{ temperature: -1 }, /temperature/],
    [{ topK: 1.5 }, /top_k/],
    [{ topP: 0 }, /top_p/],
    [{ topP: 1.5 }, /top_p/],
    [{ maxTokens: 0 }, /max_tokens/],
    [{ stopTokens: [-2] }, /stop token/],
    [{ minP: 1.5 }, /min_p/],
    [{ logprobs: -1 }, /logprobs/],
  ])("rejects bad parameters naming the field (%#)", (p, msg) => {
    expect(() => samplingParams(p)).toThrow(msg);
  });
});
