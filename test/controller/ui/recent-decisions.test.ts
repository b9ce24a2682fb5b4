import { describe, expect, it } from "vitest";
import { MAX_LISTED, RecentDecisions } from "../../../controller/ui/recent-decisions.ts";
import type { CandidateRecord, DecisionRecord } from "../../../schema/control.ts";
import { ModelFingerprint, RequestId, WorkerId } from "../../../schema/ids.ts";

const terms = { queueMs: 0, fetchMs: 0, uploadMs: 0, prefillMs: 3, firstTokenMs: 1 };

function candidate(worker: number, predicted: number): CandidateRecord {
  return {
    workerId: WorkerId(`worker-${worker}`),
    source: "recompute",
    cachedTokens: 0 as CandidateRecord["cachedTokens"],
    boundary: null,
    terms,
    predictedTtftMs: predicted,
  };
}

function decision(id: string, attempt: number, ranked: CandidateRecord[]): DecisionRecord {
  return {
    requestId: RequestId(id),
    attempt,
    modelFingerprint: ModelFingerprint("ab".repeat(32)),
    promptTokens: 40 as DecisionRecord["promptTokens"],
    maxTokens: 8 as DecisionRecord["maxTokens"],
    policy: "ttft/v1",
    ranked,
    dropped: [],
    choice: ranked[0] ?? null,
    measuredTtftMs: null,
  };
}

describe("the web view's recent decisions", () => {
  it("keeps the newest `capacity`, newest first, and fills in the measured TTFT of the right attempt", () => {
    const ring = new RecentDecisions(3);
    let changes = 0;
    const off = ring.onChange(() => changes++);
    for (let i = 0; i < 5; i++) ring.routed(decision(`r${i}`, 1, [candidate(0, 10.123)]), 1000 + i);
    ring.routed(decision("r4", 2, [candidate(1, 20)]), 2000);
    expect(ring.list().map((r) => `${r.requestId}#${r.attempt}`)).toEqual(["r4#2", "r4#1", "r3#1"]);
    ring.measured("r4", 1, 12.3456);
    ring.measured("r0", 1, 5); // dropped from the ring: nothing to fill
    const [latest, older] = ring.list();
    expect(latest!.measuredTtftMs).toBeNull();
    expect(older!.measuredTtftMs).toBe(12.35);
    expect(older!.predictedTtftMs).toBe(10.12);
    expect(changes).toBe(7);
    off();
    ring.routed(decision("r5", 1, []), 3000);
    expect(changes).toBe(7);
    expect(ring.list()[0]).toMatchObject({ workerId: null, source: null, predictedTtftMs: null });
  });

  it("lists at most MAX_LISTED candidates and counts the rest", () => {
    const ring = new RecentDecisions();
    const many = Array.from({ length: MAX_LISTED + 5 }, (_, i) => candidate(i, i + 1));
    ring.routed(decision("big", 1, many), 0);
    const row = ring.list()[0]!;
    expect(row.ranked).toHaveLength(MAX_LISTED);
    expect(row.omitted).toBe(5);
    expect(() => new RecentDecisions(0)).toThrow(RangeError);
  });
});
