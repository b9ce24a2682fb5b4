import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type LogitsRules, NO_RULES } from "../../../worker/model/logits.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import type { SubmitRequest } from "../../../worker/runtime/runtime-api.ts";
import { collect, greedyRequest, prompt, type RuntimeFixture, startRuntime, tinyModel } from "./fixture.ts";

let model: LoadedModel;
let cleanup: () => Promise<void>;
let f: RuntimeFixture;

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
  f = await startRuntime(model);
});
afterAll(async () => {
  await f?.close();
  await cleanup();
});

let n = 0;
function request(p: number[], maxTokens: number, extra: Partial<SubmitRequest> = {}): SubmitRequest {
  return greedyRequest(`rules-${n++}`, p, maxTokens, extra);
}
const rules = (r: Partial<LogitsRules>): LogitsRules => ({ ...NO_RULES, ...r });
const run = (req: SubmitRequest) => collect(f.runtime.submit(req).events);

describe("the request's logits rules in the runtime's sampling step", () => {
  const p = prompt(11, 20);

  it("logit bias and allowed ids steer greedy decoding", async () => {
    const biased = await run(request(p, 6, { rules: rules({ logitBias: new Map([[97, 100]]) }) }));
    expect(biased.tokens).toEqual([97, 97, 97, 97, 97, 97]);
    const allowed = await run(
      request(p, 12, { temperature: 1, rules: rules({ allowedTokenIds: new Set([3, 4]) }) }),
    );
    expect(allowed.tokens.every((t) => t === 3 || t === 4)).toBe(true);
  });

  it("min_tokens holds a stop token back, then it ends the request", async () => {
    const stop = 97;
    const r = await run(
      request(p, 20, {
        stopTokenIds: [stop],
        rules: rules({ logitBias: new Map([[stop, 100]]), minTokens: 5 }),
      }),
    );
    expect(r.tokens).toHaveLength(6);
    expect(r.tokens.slice(0, 5)).not.toContain(stop);
    expect(r.tokens[5]).toBe(stop);
    expect(r.end).toMatchObject({ type: "end", reason: "stop" });
  });

  it("presence subtracts once, frequency once per occurrence", async () => {
    const bias = rules({ logitBias: new Map([[97, 30]]) });
    const presence = await run(request(p, 20, { rules: { ...bias, presencePenalty: 2 } }));
    // 30 − 2 still outweighs every other logit of the tiny model, however often 97 was generated
    expect(presence.tokens).toEqual(Array(20).fill(97));
    const frequency = await run(request(p, 20, { rules: { ...bias, frequencyPenalty: 2 } }));
    // 30 − 2k falls below the other logits after some k < 20 repetitions
    expect(frequency.tokens[0]).toBe(97);
    expect(frequency.tokens.filter((t) => t === 97).length).toBeLessThan(20);
  });

  it("the repetition penalty covers the prompt's own ids", async () => {
    const t = p[0]!;
    const bias = rules({ logitBias: new Map([[t, 10]]) });
    const plain = await run(request(p, 4, { rules: bias }));
    expect(plain.tokens).toEqual([t, t, t, t]);
    // t is in the prompt: (x + 10) / 50 no longer wins, from the first token on
    const penalised = await run(request(p, 4, { rules: { ...bias, repetitionPenalty: 50 } }));
    expect(penalised.tokens).not.toContain(t);
  });

  it("log-probabilities come with each token when asked for", async () => {
    const r = f.runtime.submit(request(p, 3, { logprobs: 2 }));
    const lps: number[] = [];
    for await (const ev of r.events) {
      if (ev.type === "token") {
        const lp = ev.logprob;
        if (!lp) throw new Error("no log-probability");
        expect(lp.token).toBe(ev.token);
        expect(lp.top).toHaveLength(2);
        // greedy: the token is the most likely one
        expect(lp.top[0]![0]).toBe(ev.token);
        lps.push(lp.logprob);
      }
    }
    expect(lps).toHaveLength(3);
    expect(lps.every((x) => x <= 0 && Number.isFinite(x))).toBe(true);
  });
});
