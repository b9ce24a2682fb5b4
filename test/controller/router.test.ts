import { describe, expect, it } from "vitest";
import { deriveCandidates, planChain } from "../../controller/candidates.ts";
import { emptyView, type HeartbeatView, observe } from "../../controller/heartbeat-view.ts";
import { defaultRouterPolicy, type Outstanding, type RouterPolicy, route } from "../../controller/router.ts";
import type { Heartbeat } from "../../schema/control.ts";
import type { WorkerId } from "../../schema/ids.ts";
import { chain, FP, heartbeat, OTHER_FP, request, wid } from "./fixtures.ts";

const policy: RouterPolicy = { ...defaultRouterPolicy, heartbeatTtlMs: 1000, residentFreshMs: 500 };

function viewOf(...hbs: Heartbeat[]): HeartbeatView {
  let v = emptyView;
  for (const hb of hbs) v = observe(v, hb, 0).view;
  return v;
}

function routeWith(v: HeartbeatView, opts: Partial<Parameters<typeof route>[0]> = {}) {
  const c = chain(8);
  return route({
    request: request(c, 8 * 256 + 100),
    attempt: 1,
    view: v,
    nowMs: 0,
    catalog: { replicas: [] },
    outstanding: new Map(),
    exclude: new Set(),
    policy,
    ...opts,
  });
}

const c8 = chain(8);
const resident = (n: number) => c8.slice(0, n).map((b) => ({ nodeId: b.nodeId, tokens: b.tokens }));

describe("candidate derivation", () => {
  it("plans the chain of the processed prompt (the pending last token is not hashed)", () => {
    const prompt = Array.from({ length: 513 }, (_, i) => i);
    expect(planChain(FP, prompt, 256).map((b) => b.tokens)).toEqual([256, 512]);
    expect(planChain(FP, prompt.slice(0, 512), 256).map((b) => b.tokens)).toEqual([256]);
    expect(planChain(FP, prompt, 256, "tenant-a")[0]!.nodeId).not.toBe(planChain(FP, prompt, 256)[0]!.nodeId);
  });

  it("keeps resident, each durable tier class, peer, S3 and recompute as separate alternatives", () => {
    const a = heartbeat("a", { residentPrefixes: resident(2) });
    const catalog = {
      replicas: c8.map((_, i) => [
        { tier: "s3" as const, workerId: null },
        ...(i < 4 ? [{ tier: "ram" as const, workerId: wid("a") }] : []),
        ...(i < 6 ? [{ tier: "ram" as const, workerId: wid("b") }] : []),
      ]),
    };
    const { candidates } = deriveCandidates(request(c8, 2200), [{ heartbeat: a, ageMs: 0 }], catalog, {
      residentFreshMs: 500,
    });
    const bySource = Object.fromEntries(candidates.map((c) => [c.source, c]));
    expect(Object.keys(bySource)).toEqual(["resident", "ram", "peer", "s3", "recompute"]);
    expect(bySource.resident!.cachedTokens).toBe(512);
    expect(bySource.ram!.cachedTokens).toBe(1024);
    // Peer extends the prefix with b's RAM chunks; a's own chunks still come from its RAM.
    expect(bySource.peer!.cachedTokens).toBe(1536);
    expect(bySource.peer!.bytesByTier.ram).toBe(1024 * 128 * 1024);
    expect(bySource.peer!.bytesByTier.peer).toBe(512 * 128 * 1024);
    expect(bySource.s3!.cachedTokens).toBe(2048);
    expect(bySource.recompute!.cachedTokens).toBe(0);
  });

  it("with peer transfer off another worker's RAM is no source: S3 is the only shared tier", () => {
    const a = heartbeat("a", { residentPrefixes: resident(2) });
    const catalog = {
      replicas: c8.map((_, i) => [
        { tier: "s3" as const, workerId: null },
        ...(i < 4 ? [{ tier: "ram" as const, workerId: wid("a") }] : []),
        ...(i < 6 ? [{ tier: "ram" as const, workerId: wid("b") }] : []),
      ]),
    };
    const { candidates } = deriveCandidates(request(c8, 2200), [{ heartbeat: a, ageMs: 0 }], catalog, {
      residentFreshMs: 500,
      peers: false,
    });
    const bySource = Object.fromEntries(candidates.map((c) => [c.source, c]));
    expect(Object.keys(bySource)).toEqual(["resident", "ram", "s3", "recompute"]);
    // Its own RAM chunks, then S3 for the rest: b's copies are not read.
    expect(bySource.s3!.bytesByTier).toEqual({
      ram: 1024 * 128 * 1024,
      ssd: 0,
      peer: 0,
      s3: 1024 * 128 * 1024,
    });
  });

  it("a replica on a worker that is not live is no peer source", () => {
    const a = heartbeat("a");
    const catalog = {
      replicas: c8.map(() => [
        { tier: "s3" as const, workerId: null },
        { tier: "ram" as const, workerId: wid("dead") },
      ]),
    };
    const withDead = deriveCandidates(request(c8, 2200), [{ heartbeat: a, ageMs: 0 }], catalog, {
      residentFreshMs: 500,
    });
    expect(withDead.candidates.map((c) => c.source)).toContain("peer");
    const liveOnly = deriveCandidates(request(c8, 2200), [{ heartbeat: a, ageMs: 0 }], catalog, {
      residentFreshMs: 500,
      liveHolders: new Set([wid("a")]),
    });
    expect(liveOnly.candidates.map((c) => c.source)).toEqual(["s3", "recompute"]);
    // route() passes the live set itself: a worker whose heartbeat expired holds nothing it can serve.
    const view = viewOf(a);
    const decision = routeWith(view, { catalog });
    expect(decision.ranked.some((c) => c.source === "peer")).toBe(false);
  });

  it("a stale resident entry falls back to the same worker's durable prefix, not to recompute", () => {
    const a = heartbeat("a", { residentPrefixes: resident(8) });
    const catalog = { replicas: c8.map(() => [{ tier: "ram" as const, workerId: wid("a") }]) };
    const r = deriveCandidates(request(c8, 2200), [{ heartbeat: a, ageMs: 900 }], catalog, {
      residentFreshMs: 500,
    });
    expect(r.dropped).toMatchObject([{ workerId: "a", source: "resident", reason: "stale_resident" }]);
    expect(r.candidates.map((c) => [c.source, c.cachedTokens])).toEqual([
      ["ram", 2048],
      ["recompute", 0],
    ]);
  });
});

describe("TTFT router", () => {
  it("predicts max(queue, fetch) + upload + missing × prefill + first token", () => {
    const q = heartbeat("a", {
      queue: { queuedTokens: 1000 as never, queuedRequests: 2, runningRequests: 0 },
    });
    const d = routeWith(viewOf(q));
    const rc = d.ranked.find((c) => c.source === "recompute")!;
    expect(rc.terms.queueMs).toBeCloseTo(1000 * 0.15 + 2 * 20);
    expect(rc.terms.prefillMs).toBeCloseTo((8 * 256 + 100) * 0.15);
    expect(rc.predictedTtftMs).toBeCloseTo(190 + 2148 * 0.15 + 20);
  });

  it("a worker reporting per-attempt progress is loaded by the controller's own count: a stale heartbeat's finished prefill does not count", () => {
    // The heartbeat was sent before its one attempt's first token; the controller has seen that token since.
    const stale = { queuedTokens: 1000 as never, queuedRequests: 1, runningRequests: 0 };
    const reporting = heartbeat("a", {
      queue: {
        ...stale,
        prefilling: [{ requestId: "r1" as never, attempt: 1, remainingTokens: 1000 as never }],
      },
    });
    const none = new Map<WorkerId, Outstanding>();
    const q = (hb: Heartbeat, outstanding = none) =>
      routeWith(viewOf(hb), { outstanding }).ranked.find((c) => c.source === "recompute")!.terms.queueMs;
    expect(q(reporting)).toBe(0);
    // An older worker (no per-attempt list) keeps the larger of both.
    expect(q(heartbeat("a", { queue: stale }))).toBeCloseTo(1000 * 0.15 + 20);
    // What the controller still counts is the queue.
    const out = new Map<WorkerId, Outstanding>([[wid("a"), { requests: 2, tokens: 300, running: 1 }]]);
    expect(q(reporting, out)).toBeCloseTo(300 * 0.15 + 2 * 20);
  });

  it("locality beats a farther durable prefix", () => {
    // a holds 6 chunks resident; b can fetch all 8 from S3 (longer, but far).
    const a = heartbeat("a", { residentPrefixes: resident(6) });
    const b = heartbeat("b");
    const catalog = { replicas: c8.map(() => [{ tier: "s3" as const, workerId: null }]) };
    const d = routeWith(viewOf(a, b), { catalog });
    expect(d.choice).toMatchObject({ workerId: "a", source: "resident", cachedTokens: 1536 });
    const bS3 = d.ranked.find((c) => c.workerId === "b" && c.source === "s3")!;
    expect(bS3.cachedTokens).toBe(2048);
    expect(bS3.predictedTtftMs).toBeGreaterThan(d.choice!.predictedTtftMs);
  });

  it("drops offline, wrong-model, too-long and page-short workers with reasons", () => {
    let v = viewOf(
      heartbeat("ok"),
      heartbeat("model", { modelFingerprint: OTHER_FP }),
      heartbeat("ctx", { maxContext: 1024 as never }),
      heartbeat("pages", { freePages: 100 as never, evictablePages: 30 as never }),
    );
    v = observe(v, heartbeat("gone"), -5000).view;
    const d = routeWith(v);
    expect(new Set(d.ranked.map((c) => c.workerId))).toEqual(new Set(["ok"]));
    const reasons = Object.fromEntries(d.dropped.map((x) => [x.workerId, x.reason]));
    expect(reasons).toEqual({
      gone: "offline",
      model: "wrong_model",
      ctx: "context_too_long",
      pages: "pages_short",
    });
    expect(d.dropped.find((x) => x.workerId === "pages")!.detail).toMatch(
      /needs 137 pages, has 100 free \+ 30 evictable/,
    );
  });

  it("ties break by cached tokens, then worker id", () => {
    const d = routeWith(viewOf(heartbeat("c"), heartbeat("a"), heartbeat("b")));
    expect(d.ranked.map((c) => c.workerId)).toEqual(["a", "b", "c"]);
    // Same TTFT, more cached tokens first: make b's fetch free and equal to a's recompute time.
    const tie = routeWith(viewOf(heartbeat("a"), heartbeat("b", { residentPrefixes: resident(1) })), {
      request: request(chain(8).slice(0, 1), 257),
    });
    expect(tie.choice).toMatchObject({ workerId: "b", source: "resident" });
  });

  it("excludes workers that already failed the request", () => {
    const d = routeWith(viewOf(heartbeat("a"), heartbeat("b")), { exclude: new Set([wid("a")]) });
    expect(d.ranked.every((c) => c.workerId === "b")).toBe(true);
    expect(d.dropped).toMatchObject([{ workerId: "a", reason: "already_tried" }]);
  });

  it("the load term spreads a hot prefix instead of pinning it to one worker", () => {
    const hot = heartbeat("a", { residentPrefixes: resident(8) });
    const workers = [hot, heartbeat("b"), heartbeat("c"), heartbeat("d")];
    const catalog = { replicas: c8.map(() => [{ tier: "ram" as const, workerId: wid("a") }]) };
    const outstanding = new Map<WorkerId, Outstanding>();
    const picks: string[] = [];
    for (let i = 0; i < 40; i++) {
      const d = routeWith(viewOf(...workers), { catalog, outstanding });
      const w = d.choice!.workerId;
      picks.push(w);
      const o = outstanding.get(w) ?? { requests: 0, tokens: 0, running: 0 };
      outstanding.set(w, { ...o, requests: o.requests + 1, tokens: o.tokens + 100 });
    }
    const count = (w: string) => picks.filter((p) => p === w).length;
    // Locality first, up to the load slack.
    expect(picks.slice(0, policy.loadSlack)).toEqual(Array(policy.loadSlack).fill("a"));
    expect(count("a")).toBeGreaterThanOrEqual(count("b"));
    // Bounded load: nobody above factor × mean (+ one for rounding).
    for (const w of ["a", "b", "c", "d"]) expect(count(w)).toBeLessThanOrEqual(policy.loadFactor * 10 + 1);
    // Without the bound the cached worker would take everything the queue term allows.
    const unbounded = new Map<WorkerId, Outstanding>();
    let pinned = 0;
    for (let i = 0; i < 5; i++) {
      const d = routeWith(viewOf(...workers), {
        catalog,
        outstanding: unbounded,
        policy: { ...policy, loadFactor: Number.POSITIVE_INFINITY },
      });
      if (d.choice!.workerId === "a") pinned++;
      const o = unbounded.get(d.choice!.workerId) ?? { requests: 0, tokens: 0, running: 0 };
      unbounded.set(d.choice!.workerId, { ...o, requests: o.requests + 1, tokens: o.tokens + 100 });
    }
    expect(pinned).toBe(5);
  });
});
