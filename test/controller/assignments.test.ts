import { describe, expect, it } from "vitest";
import {
  type AssignmentCommand,
  type AssignmentEvent,
  type AssignmentLimits,
  type AssignmentState,
  outstandingByWorker,
  startAssignment,
  stepAssignment,
} from "../../controller/assignments.ts";
import { emptyView, observe } from "../../controller/heartbeat-view.ts";
import { defaultRouterPolicy, route } from "../../controller/router.ts";
import { admit, cancel, complete, freshAdmission } from "../../schema/admission.ts";
import type { CandidateRecord } from "../../schema/control.ts";
import type { TokenCount } from "../../schema/ids.ts";
import { chain, FP, heartbeat, OTHER_FP, request, rid, wid } from "./fixtures.ts";

const limits: AssignmentLimits = {
  maxAttempts: 3,
  offerTimeoutMs: 100,
  progressTimeoutMs: 1000,
  requestDeadlineMs: 10_000,
};
const R = rid("r1");

function cand(worker: string, cachedTokens = 0): CandidateRecord {
  return {
    workerId: wid(worker),
    source: cachedTokens > 0 ? "resident" : "recompute",
    cachedTokens: cachedTokens as TokenCount,
    boundary: null,
    terms: { queueMs: 0, fetchMs: 0, uploadMs: 0, prefillMs: 10, firstTokenMs: 5 },
    predictedTtftMs: 15,
  };
}

/** Drives one request: a queue of candidates answers every route command. */
class Driver {
  state: AssignmentState;
  readonly commands: AssignmentCommand[] = [];
  constructor(
    private readonly plan: string[],
    now = 0,
  ) {
    const s = startAssignment(R, 1000, now);
    this.state = s.state;
    this.handle(s.commands, now);
  }
  private handle(cmds: AssignmentCommand[], now: number): void {
    for (const c of cmds) {
      this.commands.push(c);
      if (c.type === "route") {
        const next = this.plan.find((w) => !c.exclude.includes(wid(w)));
        this.send({ type: "routed", choice: next ? cand(next) : null }, now);
      }
    }
  }
  send(e: AssignmentEvent, now: number): void {
    const r = stepAssignment(this.state, e, now, limits);
    this.state = r.state;
    this.handle(r.commands, now);
  }
  of<T extends AssignmentCommand["type"]>(t: T) {
    return this.commands.filter((c): c is Extract<AssignmentCommand, { type: T }> => c.type === t);
  }
}

const accept = (w: string, attempt: number): AssignmentEvent => ({
  type: "accept",
  msg: { requestId: R, attempt, workerId: wid(w), epoch: 1, reservedPages: 10 as never },
});
const tokens = (w: string, attempt: number, index: number, n: number): AssignmentEvent => ({
  type: "tokens",
  msg: {
    requestId: R,
    attempt,
    workerId: wid(w),
    index,
    tokens: Array.from({ length: n }, (_, i) => index + i),
  },
});
const result = (w: string, attempt: number, total: number): AssignmentEvent => ({
  type: "result",
  msg: {
    requestId: R,
    attempt,
    workerId: wid(w),
    outcome: "completed",
    finishReason: "length",
    tokensTotal: total,
    measuredTtftMs: 5,
    reason: "",
  },
});

describe("fenced assignments", () => {
  it("completes on the first worker: offer, accept, tokens, result", () => {
    const d = new Driver(["a", "b"]);
    expect(d.of("offer")).toMatchObject([{ workerId: "a", attempt: 1 }]);
    d.send(accept("a", 1), 10);
    d.send(tokens("a", 1, 0, 3), 20);
    d.send(tokens("a", 1, 3, 2), 30);
    d.send(result("a", 1, 5), 31);
    expect(d.state.phase).toBe("completed");
    expect(d.of("deliver").flatMap((c) => c.tokens)).toEqual([0, 1, 2, 3, 4]);
    expect(d.of("finish")).toMatchObject([{ outcome: "completed" }]);
  });

  it("a decline moves to the next candidate with attempt + 1", () => {
    const d = new Driver(["a", "b"]);
    d.send(
      {
        type: "decline",
        msg: { requestId: R, attempt: 1, workerId: wid("a"), reason: "pages_short", detail: "needs 9" },
      },
      5,
    );
    expect(d.of("offer")).toMatchObject([
      { workerId: "a", attempt: 1 },
      { workerId: "b", attempt: 2 },
    ]);
    expect(d.of("route")[1]).toMatchObject({ attempt: 2, exclude: ["a"] });
  });

  it("an offer timeout cancels the old attempt and moves on; its late accept is fenced and counted", () => {
    const d = new Driver(["a", "b"]);
    d.send({ type: "tick" }, 99);
    expect(d.state.attempt).toBe(1);
    d.send({ type: "tick" }, 100);
    expect(d.of("cancel")).toMatchObject([{ workerId: "a", attempt: 1 }]);
    expect(d.of("offer").at(-1)).toMatchObject({ workerId: "b", attempt: 2 });
    d.send(accept("a", 1), 120); // too late
    expect(d.state.lateIgnored).toBe(1);
    expect(d.of("cancel").at(-1)).toMatchObject({
      workerId: "a",
      attempt: 1,
      reason: "fenced: stale attempt",
    });
    d.send(accept("b", 2), 130);
    expect(d.state.phase).toBe("accepted");
  });

  it("a crash before any token falls back; the crashed attempt's late completion is fenced", () => {
    const d = new Driver(["a", "b"]);
    d.send(accept("a", 1), 10);
    d.send({ type: "worker_lost", workerId: wid("a") }, 20);
    expect(d.of("offer").at(-1)).toMatchObject({ workerId: "b", attempt: 2 });
    d.send(accept("b", 2), 25);
    // a was only partitioned: its tokens and result arrive late and are ignored.
    d.send(tokens("a", 1, 0, 4), 30);
    d.send(result("a", 1, 4), 31);
    expect(d.state.lateIgnored).toBe(2);
    expect(d.of("deliver")).toEqual([]);
    d.send(tokens("b", 2, 0, 2), 40);
    d.send(result("b", 2, 2), 41);
    expect(d.state.phase).toBe("completed");
    expect(new Set(d.of("deliver").map((c) => c.attempt))).toEqual(new Set([2]));
  });

  it("after tokens were streamed, a failure fails the request instead of switching attempts", () => {
    const d = new Driver(["a", "b"]);
    d.send(accept("a", 1), 10);
    d.send(tokens("a", 1, 0, 2), 20);
    d.send({ type: "worker_lost", workerId: wid("a") }, 30);
    expect(d.state).toMatchObject({ phase: "failed", failure: "lost_mid_stream" });
    expect(d.of("offer")).toHaveLength(1);
  });

  it("duplicates are dropped, a gap after streaming fails with stream_gap", () => {
    const d = new Driver(["a"]);
    d.send(accept("a", 1), 10);
    d.send(accept("a", 1), 11);
    d.send(tokens("a", 1, 0, 2), 20);
    d.send(tokens("a", 1, 0, 2), 21);
    expect(d.state.duplicates).toBe(2);
    d.send(tokens("a", 1, 5, 2), 30);
    expect(d.state).toMatchObject({ phase: "failed", failure: "stream_gap" });
  });

  it("every request ends: attempts are bounded and the deadline fails what is open", () => {
    const d = new Driver(["a", "b", "c", "d"]);
    for (let t = 100; d.state.phase !== "failed"; t += 100) d.send({ type: "tick" }, t);
    expect(d.state.failure).toBe("attempts_exhausted");
    expect(d.of("offer").map((c) => c.attempt)).toEqual([1, 2, 3]);

    const slow = new Driver(["a"]);
    slow.send(accept("a", 1), 10);
    for (let t = 500; t < 10_000; t += 500) slow.send(tokens("a", 1, t / 500 - 1, 1), t);
    expect(slow.state.phase).toBe("streaming");
    slow.send({ type: "tick" }, 10_000);
    expect(slow.state).toMatchObject({ phase: "failed", failure: "deadline" });
    expect(slow.of("cancel")).toMatchObject([{ workerId: "a", attempt: 1 }]);
  });

  it("no worker at all fails at once with a reason", () => {
    const d = new Driver([]);
    expect(d.state).toMatchObject({ phase: "failed", failure: "no_worker" });
  });

  it("counts outstanding work per worker for the load term", () => {
    const a = new Driver(["a"]);
    const b = new Driver(["a"]);
    b.send(accept("a", 1), 1);
    b.send(tokens("a", 1, 0, 1), 2);
    expect(outstandingByWorker([a.state, b.state]).get(wid("a"))).toEqual({
      requests: 1,
      tokens: 1000,
      running: 1,
    });
  });

  it("joins each outstanding attempt to its worker's reported progress, never above the routing estimate", () => {
    const a = new Driver(["a"]);
    const reported = (remaining: number | undefined) =>
      outstandingByWorker([a.state], (w, r, attempt) =>
        w === wid("a") && r === a.state.requestId && attempt === 1 ? remaining : undefined,
      ).get(wid("a"))!.tokens;
    expect(reported(undefined)).toBe(1000);
    expect(reported(250)).toBe(250);
    expect(reported(5000)).toBe(1000);
  });
});

describe("worker admission", () => {
  const lim = {
    workerId: wid("a"),
    modelFingerprint: FP,
    maxContext: 4096 as TokenCount,
    pageTokens: 16,
    fenceMemory: 2,
  };
  const offer = (attempt: number, promptTokens = 1000, maxTokens = 24) => ({
    requestId: R,
    attempt,
    modelFingerprint: FP,
    promptTokens,
    maxTokens: maxTokens as TokenCount,
  });
  const pool = { freePages: 100, evictablePages: 0, sharedPages: 0 };

  it("re-runs admission against real pages: accept reserves, decline changes nothing", () => {
    const s0 = freshAdmission(1);
    const ok = admit(s0, offer(1), pool, lim);
    expect(ok.decision).toMatchObject({ type: "accept", msg: { reservedPages: 64 } });
    expect(ok.state.reservedPages).toBe(64);
    const short = admit(s0, offer(1), { freePages: 40, evictablePages: 20, sharedPages: 0 }, lim);
    expect(short.decision).toMatchObject({ type: "decline", msg: { reason: "pages_short" } });
    expect(short.state).toBe(s0);
    expect(admit(s0, { ...offer(1), modelFingerprint: OTHER_FP }, pool, lim).decision).toMatchObject({
      msg: { reason: "wrong_model" },
    });
    expect(admit(s0, offer(1, 4090, 10), pool, lim).decision).toMatchObject({
      msg: { reason: "context_too_long" },
    });
    // Shared resident pages are credited.
    expect(
      admit(s0, offer(1), { freePages: 10, evictablePages: 0, sharedPages: 56 }, lim).decision.type,
    ).toBe("accept");
  });

  it("fences: a newer attempt supersedes, an older one is declined, cancel and completion release once", () => {
    let s = admit(freshAdmission(1), offer(1), pool, lim).state;
    const again = admit(s, offer(1), pool, lim);
    expect(again.state).toBe(s); // a repeated offer reserves nothing more
    const newer = admit(s, offer(2), { ...pool, freePages: 0 }, lim); // the old reservation counts as free
    expect(newer.decision.type).toBe("accept");
    expect(newer.superseded).toMatchObject({ attempt: 1 });
    s = newer.state;
    expect(s.reservedPages).toBe(64);
    expect(admit(s, offer(1), pool, lim).decision).toMatchObject({ msg: { reason: "stale_attempt" } });
    expect(cancel(s, { requestId: R, attempt: 1, reason: "x" }, lim).released).toBeNull();
    const done = complete(s, R, 2, lim);
    expect(done.released).toMatchObject({ attempt: 2 });
    expect(done.state.reservedPages).toBe(0);
    expect(complete(done.state, R, 2, lim).released).toBeNull();
    // A duplicated offer of the finished attempt is not run twice.
    expect(admit(done.state, offer(2), pool, lim).decision).toMatchObject({
      msg: { reason: "stale_attempt" },
    });
    // A cancel that overtook its offer fences it.
    const c = cancel(freshAdmission(1), { requestId: rid("r9"), attempt: 1, reason: "x" }, lim).state;
    expect(admit(c, { ...offer(1), requestId: rid("r9") }, pool, lim).decision).toMatchObject({
      msg: { reason: "stale_attempt" },
    });
  });

  it("a stale heartbeat view is overridden by the worker's admission: it declines, the controller moves on", () => {
    // The controller's view says a has plenty of free pages; in reality a has filled up since.
    const view = observe(
      observe(emptyView, heartbeat("a", { freePages: 2000 as never }), 0).view,
      heartbeat("b"),
      0,
    ).view;
    const req = request(chain(2), 600, 32);
    const decide = (attempt: number, exclude: string[]) =>
      route({
        request: req,
        attempt,
        view,
        nowMs: 10,
        catalog: { replicas: [] },
        outstanding: new Map(),
        exclude: new Set(exclude.map(wid)),
        policy: defaultRouterPolicy,
      }).choice;
    const st = startAssignment(R, 600, 10);
    let cmds = st.commands;
    let state = st.state;
    const real = freshAdmission(1);
    const offers: string[] = [];
    for (let guard = 0; guard < 10 && cmds.length > 0; guard++) {
      const next: AssignmentCommand[] = [];
      for (const c of cmds) {
        let e: AssignmentEvent | null = null;
        if (c.type === "route") e = { type: "routed", choice: decide(c.attempt, [...c.exclude]) };
        if (c.type === "offer") {
          offers.push(c.workerId);
          const realPool = c.workerId === "a" ? { freePages: 3, evictablePages: 0, sharedPages: 0 } : pool;
          const a = admit(real, { ...offer(c.attempt, 600, 32), requestId: R }, realPool, {
            ...lim,
            workerId: c.workerId,
          });
          e = { type: a.decision.type, msg: a.decision.msg } as AssignmentEvent;
        }
        if (e) {
          const r = stepAssignment(state, e, 20, limits);
          state = r.state;
          next.push(...r.commands);
        }
      }
      cmds = next;
    }
    expect(offers).toEqual(["a", "b"]);
    expect(state).toMatchObject({ phase: "accepted", attempt: 2, workerId: "b" });
  });
});
