import { describe, expect, it } from "vitest";
import { measuredTerms } from "../../../worker/agent/attempt.ts";

describe("measuredTerms", () => {
  it("splits a TTFT into queue, fetch and the rest, each clamped to what is left", () => {
    expect(measuredTerms(100, { queueMs: 30, fetchMs: 20 } as never)).toEqual({
      queueMs: 30,
      fetchMs: 20,
      prefillMs: 50,
    });
    expect(measuredTerms(100, { queueMs: 80, fetchMs: 50 } as never)).toEqual({
      queueMs: 80,
      fetchMs: 20,
      prefillMs: 0,
    });
    expect(measuredTerms(100, { queueMs: null, fetchMs: 10 } as never)).toEqual({
      queueMs: 0,
      fetchMs: 10,
      prefillMs: 90,
    });
  });
});
