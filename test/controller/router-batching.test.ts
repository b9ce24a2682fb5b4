import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { MAX_SHARED_STEPS, predictTerms, sharedPrefillTokens } from "../../controller/router.ts";
import type { TokenCount } from "../../schema/ids.ts";
import { heartbeat } from "./fixtures.ts";

const BATCHING = { stepTokens: 512, prefillTile: 256 };

describe("the queue term under batching", () => {
  it("a short prompt behind another short one shares its step: it waits for its rows, not its whole turn", () => {
    expect(sharedPrefillTokens(25, 1, 0, 25, BATCHING)).toBe(25);
    // Behind a long prompt: the one step it needs carries that prompt's tile, no more.
    expect(sharedPrefillTokens(400, 1, 0, 25, BATCHING)).toBe(256);
    // Two long prompts ahead fill the step budget: it waits until they leave room (served as if after them).
    expect(sharedPrefillTokens(600, 2, 0, 25, BATCHING)).toBe(600);
    // Nothing ahead: nothing shared.
    expect(sharedPrefillTokens(0, 0, 3, 400, BATCHING)).toBe(0);
  });

  it("decode lanes take their rows of the step budget first", () => {
    // 500 decode rows leave 12 a step: the 100 rows ahead go first, 12 a step, then the prompt's own.
    expect(sharedPrefillTokens(100, 1, 500, 25, BATCHING)).toBe(100);
    // A budget the decodes fill still moves one prefill row a step (never stalls).
    expect(sharedPrefillTokens(10, 1, 600, 1, BATCHING)).toBe(10);
  });

  it("past MAX_SHARED_STEPS the rest ahead counts whole", () => {
    const own = (MAX_SHARED_STEPS + 1) * 256;
    expect(sharedPrefillTokens(1e6, 1, 0, own, BATCHING)).toBe(1e6);
  });

  it("never exceeds the rows ahead and never falls as the prompt grows", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 100_000 }),
        fc.integer({ min: 1, max: 64 }),
        fc.integer({ min: 0, max: 600 }),
        fc.integer({ min: 0, max: 20_000 }),
        fc.integer({ min: 1, max: 2048 }),
        fc.integer({ min: 1, max: 2048 }),
        (ahead, requests, decodes, own, stepTokens, prefillTile) => {
          const b = { stepTokens, prefillTile };
          const s = sharedPrefillTokens(ahead, requests, decodes, own, b);
          expect(s).toBeGreaterThanOrEqual(0);
          expect(s).toBeLessThanOrEqual(ahead);
          expect(sharedPrefillTokens(ahead, requests, decodes, own + 100, b)).toBeGreaterThanOrEqual(s);
        },
      ),
      { numRuns: 300 },
    );
  });

  it("predictTerms models batching only for a worker that reports it and its own progress", () => {
    const queue = {
      queuedTokens: 25 as TokenCount,
      queuedRequests: 1,
      runningRequests: 0,
      prefilling: [],
    };
    const out = { requests: 1, tokens: 25, running: 0 };
    const cand = { cachedTokens: 384 as TokenCount, bytesByTier: { ram: 0, ssd: 0, peer: 0, s3: 0 } };
    const batched = predictTerms(
      heartbeat("a", { queue: { ...queue, batching: BATCHING } as never }),
      cand,
      409,
      out,
    );
    // 25 rows ahead share the step: 25 × 0.15 ms, and no first-token step of theirs.
    expect(batched.queueMs).toBeCloseTo(25 * 0.15, 9);
    expect(batched.prefillMs).toBeCloseTo(25 * 0.15, 9);
    const serial = predictTerms(heartbeat("a", { queue }), cand, 409, out);
    expect(serial.queueMs).toBeCloseTo(25 * 0.15 + 20, 9);
  });
});
