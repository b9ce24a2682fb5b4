import { describe, expect, it } from "vitest";
import type { ProposalSink } from "../../../catalog/log.ts";
import { decisionText, parseDecisionText } from "../../../controller/fleet/decision-text.ts";
import { DecisionRecorder, decisionOps } from "../../../controller/fleet/decisions.ts";
import { type Proposal, ProposalMsg } from "../../../schema/catalog.ts";
import type { CandidateRecord, DecisionRecord } from "../../../schema/control.ts";
import { silentLogger } from "../../../schema/log.ts";
import { decodeMessage } from "../../../schema/wire.ts";
import { FP, rid, wid } from "../fixtures.ts";

/** Decision records: their catalog ops, the candidates text bound, and the recorder's batching and bounds. */

const terms = { queueMs: 1, fetchMs: 0, uploadMs: 0, prefillMs: 2, firstTokenMs: 3 };
const cand = (w: string): CandidateRecord => ({
  workerId: wid(w),
  source: "recompute",
  cachedTokens: 0 as never,
  boundary: null,
  terms,
  predictedTtftMs: 6,
});

function decision(requestId: string, over: Partial<DecisionRecord> = {}): DecisionRecord {
  return {
    requestId: rid(requestId),
    attempt: 1,
    modelFingerprint: FP,
    promptTokens: 10 as never,
    maxTokens: 4 as never,
    policy: "ttft/v1",
    ranked: [cand("w1"), cand("w2")],
    dropped: [],
    choice: cand("w1"),
    measuredTtftMs: null,
    ...over,
  };
}

/** A proposal sink that keeps what it is given; `hold` keeps proposals pending until released. */
class CollectingSink implements ProposalSink {
  readonly proposals: Proposal[] = [];
  private held: (() => void)[] = [];
  hold = false;
  propose(bytes: Uint8Array): Promise<void> {
    this.proposals.push(decodeMessage(ProposalMsg, bytes));
    if (!this.hold) return Promise.resolve();
    return new Promise((resolve) => this.held.push(resolve));
  }
  release(): void {
    this.hold = false;
    for (const r of this.held.splice(0)) r();
  }
}

async function until(what: string, ok: () => boolean): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe("decision records", () => {
  it("become a decision.recorded op, plus decision.measured when a first token was measured", () => {
    expect(decisionOps(decision("r", { choice: null }), "t", 5, null)).toEqual([]);
    const ops = decisionOps(decision("r"), "tenant-a", 1234, { ttftMs: 42.5 });
    expect(ops).toEqual([
      expect.objectContaining({
        op: "decision.recorded",
        request: "r",
        attempt: 1,
        tenant: "tenant-a",
        model: FP,
        time: 1234,
        worker: "w1",
        source: "recompute",
        cachedTokens: 0,
        predictedTtftMs: 6,
      }),
      { op: "decision.measured", request: "r", attempt: 1, measuredTtftMs: 42.5 },
    ]);
    expect(JSON.parse((ops[0] as { candidates: string }).candidates).ranked).toHaveLength(2);
  });

  it("cut the candidates text to the catalog's bound and say how many were left out", () => {
    const many = Array.from({ length: 1000 }, (_, i) => ({
      workerId: wid(`worker-${i}`),
      source: "ram" as const,
      reason: "pages_short" as const,
      detail: "x".repeat(100),
    }));
    const text = decisionText(decision("r", { dropped: many }), null, null);
    expect(text.length).toBeLessThanOrEqual(60_000);
    const parsed = JSON.parse(text) as { ranked: unknown[]; dropped: unknown[]; omitted: number };
    expect(parsed.ranked).toHaveLength(2);
    expect(parsed.dropped.length + parsed.omitted).toBe(1000);
    expect(parsed.omitted).toBeGreaterThan(0);
  });
});

describe("decision text", () => {
  const snapshot = (i: number) => ({
    id: wid(`w${i}`),
    ageMs: 5,
    costs: {
      prefillPerTokenMs: 0.5,
      firstTokenMs: 3,
      uploadMsPerMiB: 0,
      restoreMsPerMiB: { ram: 0.1, ssd: 1, peer: 2, s3: 4 },
      samples: 9,
    },
    queue: { queuedTokens: 0 as never, queuedRequests: 0, runningRequests: 1 },
    freePages: 10,
    evictablePages: 2,
    pageTokens: 16,
    kvBytesPerToken: 1024,
    maxContext: 4096,
    durableTiers: ["ram", "ssd", "s3"],
    residentTokens: 128,
    outstanding: { requests: 1, tokens: 20, running: 0 },
  });
  const context = (workers: number) => ({
    routedAtMs: 1_000,
    turn: 3,
    weights: { queue: 1, fetch: 1, upload: 1, prefill: 1.5, firstToken: 1 },
    chain: [["a".repeat(64), 128] as const, ["b".repeat(64), 256] as const] as never,
    published: 1,
    workers: Array.from({ length: workers }, (_, i) => snapshot(i)),
  });

  it("carries the router's inputs and the measured split, and reads back as it was written", () => {
    const text = decisionText(decision("r"), context(2), {
      ttftMs: 40,
      terms: { queueMs: 1, fetchMs: 10, prefillMs: 25 },
    });
    const back = parseDecisionText(text)!;
    expect(back.context).toEqual({ ...context(2), chainOmitted: 0 });
    expect(back.measured).toEqual({ ttftMs: 40, terms: { queueMs: 1, fetchMs: 10, prefillMs: 25 } });
    expect(back.promptTokens).toBe(10);
    expect(back.ranked).toHaveLength(2);
    // Version 1 text (before the inputs were recorded) is told apart, not misread.
    expect(parseDecisionText(JSON.stringify({ ranked: [], dropped: [], omitted: 0 }))).toBeNull();
  });

  it("cuts workers after candidates to stay within the bound", () => {
    const text = decisionText(decision("r"), context(400), null);
    expect(text.length).toBeLessThanOrEqual(60_000);
    const back = parseDecisionText(text)!;
    expect(back.context!.workers.length).toBeLessThan(400);
    expect(back.context!.chain).toHaveLength(2);
  });
});

describe("the decision recorder", () => {
  it("proposes full batches at once and the rest on its interval, with unique proposal ids", async () => {
    const sink = new CollectingSink();
    const rec = new DecisionRecorder(sink, { clientId: "ctl", maxBatch: 3, flushMs: 20, log: silentLogger });
    for (let i = 0; i < 7; i++) rec.add(decisionOps(decision(`r${i}`), "t", i, null));
    await until("the interval flush", () => sink.proposals.reduce((a, p) => a + p.ops.length, 0) === 7);
    await rec.close();
    expect(sink.proposals.map((p) => p.ops.length)).toEqual([3, 3, 1]);
    expect(new Set(sink.proposals.map((p) => p.id)).size).toBe(3);
    expect(sink.proposals.every((p) => p.clientId === "ctl")).toBe(true);
    expect(rec.counters).toMatchObject({ recorded: 7, proposed: 7, dropped: 0 });
  });

  it("holds at most maxBuffered decisions while the log is slow, dropping the oldest and counting them", async () => {
    const sink = new CollectingSink();
    sink.hold = true;
    const rec = new DecisionRecorder(sink, {
      clientId: "ctl",
      maxBatch: 2,
      maxBuffered: 4,
      flushMs: 60_000,
      log: silentLogger,
    });
    for (let i = 0; i < 10; i++) rec.add(decisionOps(decision(`r${i}`), "t", i, null));
    // The first batch (r0, r1) is in flight; of the rest only the newest four wait.
    expect(rec.counters.dropped).toBe(4);
    sink.release();
    await rec.close();
    const requests = sink.proposals.flatMap((p) => p.ops.map((o) => (o as { request: string }).request));
    expect(requests).toEqual(["r0", "r1", "r6", "r7", "r8", "r9"]);
  });

  it("refuses bounds that cannot hold one batch", () => {
    expect(
      () =>
        new DecisionRecorder(new CollectingSink(), {
          clientId: "c",
          maxBatch: 8,
          maxBuffered: 4,
          log: silentLogger,
        }),
    ).toThrow(RangeError);
  });
});
