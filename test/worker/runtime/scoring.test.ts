import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { TokenLogprob } from "../../../worker/model/logits.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { referenceForward } from "../../../worker/model/reference.ts";
import type { SubmitRequest } from "../../../worker/runtime/runtime-api.ts";
import { greedyRequest, prompt, type RuntimeFixture, startRuntime, tinyModel } from "./fixture.ts";

/**
 * Scoring a continuation (what lm-eval-harness's loglikelihood asks through
 * echo + logprobs): the prompt's log-probabilities from the runtime, against
 * the float64 reference forward, and across batch compositions and cached
 * prefixes.
 *
 * Bound: the reference with K/V rounded to f16 matches the engine's logits
 * within 1e-3 absolute (test/worker/model/decoders.test.ts argues why:
 * f32 accumulation ≈ 2e-5, f16 rounding flips of K/V up to ≈ 2e-4). A
 * log-probability is a logit minus the row's log-sum-exp, whose error is a
 * convex mix of the logits' errors, so it is within twice that.
 */
const LOGPROB_BOUND = 2e-3;

let model: LoadedModel;
let cleanup: () => Promise<void>;
let f: RuntimeFixture;

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
  f = await startRuntime(model, { prefillTile: 16, minPrefillTokens: 8 });
});
afterAll(async () => {
  await f?.close();
  await cleanup();
});

let n = 0;
function request(p: number[], extra: Partial<SubmitRequest> = {}): SubmitRequest {
  return greedyRequest(`score-${n++}`, p, 1, extra);
}

interface Scored {
  prompt: readonly TokenLogprob[];
  generated: TokenLogprob[];
  cachedTokens: number;
}

async function score(req: SubmitRequest): Promise<Scored> {
  const out: Scored = { prompt: [], generated: [], cachedTokens: -1 };
  for await (const ev of f.runtime.submit(req).events) {
    if (ev.type === "token") {
      if (ev.promptLogprobs) out.prompt = ev.promptLogprobs;
      if (ev.logprob) out.generated.push(ev.logprob);
    } else if (ev.type === "end") out.cachedTokens = ev.cachedTokens;
    else throw new Error(ev.message);
  }
  return out;
}

const bits = (xs: readonly TokenLogprob[]) =>
  Buffer.from(Float64Array.from(xs.flatMap((x) => [x.logprob, ...x.top.flat()])).buffer);

describe("scoring a prompt (echo + logprobs, prompt_logprobs)", () => {
  const context = prompt(21, 37);
  const continuation = prompt(22, 9);
  const full = [...context, ...continuation];

  it("every prompt position's log-probability equals the float64 reference's log-softmax", async () => {
    const got = await score(request(full, { promptLogprobs: 3 }));
    expect(got.prompt).toHaveLength(full.length - 1);
    const ref = referenceForward(model.config.spec, model.weights, full, { roundKvToF16: true });
    let worst = 0;
    for (let q = 1; q < full.length; q++) {
      const row = ref[q - 1]!;
      let max = Number.NEGATIVE_INFINITY;
      for (const x of row) max = Math.max(max, x);
      let sum = 0;
      for (const x of row) sum += Math.exp(x - max);
      const lse = max + Math.log(sum);
      const e = got.prompt[q - 1]!;
      expect(e.token).toBe(full[q]);
      worst = Math.max(worst, Math.abs(e.logprob - (row[full[q]!]! - lse)));
      // rank: 1 + ids strictly more likely in the reference (no near-ties at these sizes)
      const refRank = 1 + row.filter((x) => x > row[full[q]!]! + LOGPROB_BOUND).length;
      expect(e.rank).toBeGreaterThanOrEqual(refRank);
      for (const [id, lp] of e.top) worst = Math.max(worst, Math.abs(lp - (row[id]! - lse)));
    }
    expect(worst).toBeLessThan(LOGPROB_BOUND);
    // the continuation's log-likelihood, as a harness sums it
    const ll = got.prompt.slice(context.length - 1).reduce((a, e) => a + e.logprob, 0);
    expect(Number.isFinite(ll) && ll < 0).toBe(true);
  });

  it("is bit-identical whatever else is batched with it", async () => {
    const alone = await score(request(full, { promptLogprobs: 5, logprobs: 5, maxTokens: 4 }));
    const others = Array.from({ length: 6 }, (_, i) =>
      score(
        request(prompt(300 + i, 10 + 13 * i), { maxTokens: 12, promptLogprobs: i % 2 === 0 ? 2 : undefined }),
      ),
    );
    const mixed = score(request(full, { promptLogprobs: 5, logprobs: 5, maxTokens: 4 }));
    const [busy] = await Promise.all([mixed, ...others]);
    expect(bits(busy!.prompt).equals(bits(alone.prompt))).toBe(true);
    expect(bits(busy!.generated).equals(bits(alone.generated))).toBe(true);
  });

  it("a scored prompt is computed whole; a generated token's log-probabilities match with its prefix reused", async () => {
    const p = prompt(41, 70);
    const first = await score(request(p, { logprobs: 5, maxTokens: 6 }));
    const again = await score(request(p, { logprobs: 5, maxTokens: 6 }));
    expect(first.cachedTokens).toBe(0);
    expect(again.cachedTokens).toBeGreaterThanOrEqual(64);
    expect(bits(again.generated).equals(bits(first.generated))).toBe(true);
    const scored = await score(request(p, { promptLogprobs: 0 }));
    expect(scored.cachedTokens).toBe(0);
    expect(scored.prompt).toHaveLength(p.length - 1);
  });
});
