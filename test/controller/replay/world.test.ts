import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import type { ParsedDecision, WorkerSnapshot } from "../../../controller/fleet/decision-text.ts";
import { predictionError, type RecordedDecision } from "../../../controller/replay/records.ts";
import { recordedWorld, replay } from "../../../controller/replay/replay.ts";
import type { NodeId, WorkerId } from "../../../schema/ids.ts";

/**
 * Replay on a recorded world small enough to reason about: two workers, one
 * (w1) reporting a tenth of the other's prefill cost, and six requests, one
 * at a time, each with a prefix nobody holds (so each is a recompute).
 */
const hex = (s: string) => createHash("sha256").update(s).digest("hex");
const FP = hex("model");

function snapshot(id: string, prefillPerTokenMs: number): WorkerSnapshot {
  return {
    id: id as WorkerId,
    ageMs: 10,
    costs: {
      prefillPerTokenMs,
      firstTokenMs: 5,
      uploadMsPerMiB: 0,
      restoreMsPerMiB: { ram: 0.1, ssd: 0.5, peer: 2, s3: 5 },
      samples: 10,
    },
    queue: { queuedTokens: 0 as never, queuedRequests: 0, runningRequests: 0 },
    freePages: 500,
    evictablePages: 0,
    pageTokens: 16,
    kvBytesPerToken: 4096,
    maxContext: 8192,
    durableTiers: ["ram", "ssd", "s3"],
    residentTokens: 0,
    outstanding: { requests: 0, tokens: 0, running: 0 },
    totalPages: 500,
  };
}

function decision(i: number, measured: { ttftMs: number; prefillMs: number }): RecordedDecision {
  const chain = [[hex(`n${i}/0`) as NodeId, 256] as const, [hex(`n${i}/1`) as NodeId, 512] as const];
  const terms = { queueMs: 0, fetchMs: 0, uploadMs: 0, prefillMs: 0.1 * 600, firstTokenMs: 5 };
  const text: ParsedDecision = {
    ranked: [
      {
        workerId: "w1" as WorkerId,
        source: "recompute",
        cachedTokens: 0 as never,
        boundary: null,
        terms,
        predictedTtftMs: 65,
      },
    ],
    dropped: [],
    promptTokens: 600,
    maxTokens: 4,
    policy: "ttft/v1",
    context: {
      routedAtMs: 1_000_000 + i * 5_000,
      turn: i,
      weights: { queue: 1, fetch: 1, upload: 1, prefill: 1, firstToken: 1 },
      chain,
      chainOmitted: 0,
      published: 0,
      workers: [snapshot("w0", 1), snapshot("w1", 0.1)],
    },
    measured: { ttftMs: measured.ttftMs, terms: { queueMs: 0, fetchMs: 0, prefillMs: measured.prefillMs } },
  };
  return {
    request: `r${i}`,
    attempt: 1,
    tenant: "t",
    model: FP,
    worker: "w1",
    source: "recompute",
    cachedTokens: 0,
    predictedTtftMs: 65,
    measuredTtftMs: measured.ttftMs,
    text,
  };
}

// Measured prefill was twice the predicted (upload + prefill + first token = 65 ms).
const records = Array.from({ length: 6 }, (_, i) => decision(i, { ttftMs: 131, prefillMs: 130 }));

describe("replay on a recorded world", () => {
  it("rebuilds the workload and the workers, with true costs scaled by what was measured", () => {
    const world = recordedWorld(records)!;
    expect(world.workload.requests.map((r) => r.arrivalMs)).toEqual([0, 5000, 10000, 15000, 20000, 25000]);
    expect(world.workers.map((w) => w.id)).toEqual(["w0", "w1"]);
    const w1 = world.workers[1]!;
    expect(w1.reported.prefillPerTokenMs).toBe(0.1);
    expect(w1.costs.prefillPerTokenMs).toBeCloseTo(0.2, 10);
    expect(w1.shape.totalPages).toBe(500);
  });

  it("says by term where the live router's prediction was off", () => {
    const e = predictionError(records);
    expect(e.measured).toBe(6);
    expect(e.withinQuarter).toBe(0);
    expect(e.terms.prefill.measuredOverPredicted).toBeCloseTo(2, 10);
    expect(e.terms.prefill.biasMs).toBeCloseTo(65, 10);
    expect(e.terms.queue.biasMs).toBe(0);
  });

  it("predicts what a changed weight would have done: a router blind to prefill takes the slow worker", () => {
    const a = replay(records, { seed: 3, weights: { prefill: 0 } })!;
    expect(replay(records, { seed: 3, weights: { prefill: 0 } })).toEqual(a);
    const live = a.variants.live!;
    const weighted = a.variants.weighted!;
    // Live: every request on w1, whose (true) prefill is 600 × 0.2 = 120 ms, plus its first token.
    expect(live.meanTtftMs).toBeGreaterThan(120);
    expect(live.meanTtftMs).toBeLessThan(200);
    // Blind to prefill, both workers look alike and the tie goes to w0: ten times slower.
    expect(weighted.meanTtftMs).toBeGreaterThan(1_000);
    expect(weighted.traceHash).not.toBe(live.traceHash);
  });
});
