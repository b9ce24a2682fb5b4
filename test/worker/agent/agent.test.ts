import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { planChain } from "../../../controller/candidates.ts";
import { type AssignmentMessage, WorkerHub } from "../../../controller/fleet/hub.ts";
import type { Offer, Result, Tokens } from "../../../schema/control.ts";
import { type ModelFingerprint, RequestId, type WorkerId } from "../../../schema/ids.ts";
import { silentLogger } from "../../../schema/log.ts";
import { WorkerAgent } from "../../../worker/agent/agent.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { ConstraintCompiler } from "../../../worker/structured/constraint.ts";
import { type RuntimeFixture, startRuntime, tinyModel } from "../runtime/fixture.ts";

/**
 * The worker agent with a real runtime (tiny model, native engine) talking
 * to a real hub over a socket: heartbeats, admission against real pages,
 * streaming, fencing by cancel and by a newer attempt, reconnection.
 */

const WORKER = "agent-w" as WorkerId;
const PAGES = 96;
let model: LoadedModel;
let cleanup: () => Promise<void>;
let rt: RuntimeFixture;
let hub: WorkerHub;
let agent: WorkerAgent;
const messages: AssignmentMessage[] = [];
let port = 0;
/** A prompt whose greedy continuation runs 400 tokens without an end-of-sequence token. */
let longPrompt: number[] = [];

function tokens(n: number, seed: number): number[] {
  const out: number[] = [];
  let s = seed;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    out.push(10 + (s % 490));
  }
  return out;
}

async function until(what: string, ok: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

async function startHub(): Promise<void> {
  hub = new WorkerHub({ host: "127.0.0.1", port, clusterSecret: "s", ttlMs: 60_000, log: silentLogger });
  hub.setListener({ onAssignment: (m) => messages.push(m), onWorkerLost: () => undefined });
  port = await hub.start();
}

function offer(
  requestId: string,
  attempt: number,
  prompt: number[],
  maxTokens: number,
  over: Partial<Offer> = {},
): Offer {
  return {
    requestId: RequestId(requestId),
    attempt,
    workerId: WORKER,
    modelFingerprint: model.fingerprint,
    prompt,
    maxTokens: maxTokens as never,
    cacheSalt: "",
    sampling: { temperature: 0 },
    plan: { source: "recompute", cachedTokens: 0 as never, predictedTtftMs: 1 },
    ...over,
  };
}

const of = (requestId: string, attempt?: number) =>
  messages.filter(
    (m) => m.msg.requestId === requestId && (attempt === undefined || m.msg.attempt === attempt),
  );

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
  rt = await startRuntime(model, { physicalPages: PAGES });
  for (let seed = 1; seed < 20 && longPrompt.length === 0; seed++) {
    const p = tokens(40, seed);
    const g = rt.runtime.submit({
      requestId: RequestId(`probe-${seed}`),
      salt: undefined,
      prompt: p,
      maxTokens: 400,
      temperature: 0,
      topP: 1,
      topK: 0,
      seed: 1,
      stopTokenIds: model.eosTokenIds,
    });
    for await (const ev of g.events) if (ev.type === "end" && ev.reason === "length") longPrompt = p;
  }
  expect(longPrompt.length).toBe(40);
  await startHub();
  agent = new WorkerAgent(rt.runtime, {
    workerId: WORKER,
    controllerUrl: `ws://127.0.0.1:${port}`,
    clusterSecret: "s",
    fingerprint: model.fingerprint,
    maxContext: model.config.spec.maxPosition,
    pageTokens: 16,
    chunkTokens: 128,
    kvBytesPerToken: 256,
    durableTiers: [],
    stopTokenIds: model.eosTokenIds,
    constraints: new ConstraintCompiler(model.tokenizer.tokenBytes()),
    heartbeatIntervalMs: 100,
    reconnectBaseMs: 20,
    reconnectMaxMs: 200,
    fenceMemory: 64,
    maxQueuedBytes: 1 << 20,
    log: silentLogger,
  });
  agent.start();
  await agent.connected;
  await until("the first heartbeat", () => hub.connectedWorkers().length === 1);
}, 120_000);

afterAll(async () => {
  await agent?.stop();
  await hub?.close();
  await rt?.close();
  await cleanup?.();
});

describe("the worker agent", () => {
  it("heartbeats its model, pages and calibrated costs, versioned by epoch and sequence", async () => {
    const first = hub.view.entries.get(WORKER)!.heartbeat!;
    await until("a newer heartbeat", () => hub.view.entries.get(WORKER)!.sequence > first.sequence);
    const hb = hub.view.entries.get(WORKER)!.heartbeat!;
    expect(hb).toMatchObject({
      workerId: WORKER,
      epoch: first.epoch,
      modelFingerprint: model.fingerprint,
      maxContext: model.config.spec.maxPosition,
      pageTokens: 16,
      queue: { queuedRequests: 0, runningRequests: 0 },
    });
    expect(hb.freePages + hb.evictablePages).toBeLessThanOrEqual(PAGES);
    expect(hb.freePages + hb.evictablePages).toBeGreaterThan(PAGES - 2);
    expect(hb.costs.samples).toBeGreaterThan(0); // the probes calibrated it
  });

  it("accepts an offer, streams its tokens in order and ends with a result; the prefix then shows as resident chunks", async () => {
    const prompt = tokens(300, 77);
    expect(hub.sendOffer(WORKER, offer("r-ok", 1, prompt, 12))).toBe(true);
    await until("the result", () => of("r-ok").some((m) => m.type === "result"));
    const got = of("r-ok");
    expect(got[0]).toMatchObject({ type: "accept", msg: { attempt: 1, workerId: WORKER } });
    const frames = got.filter((m) => m.type === "tokens").map((m) => m.msg as Tokens);
    let next = 0;
    for (const f of frames) {
      expect(f.index).toBe(next);
      next += f.tokens.length;
    }
    const result = got.at(-1)!.msg as Result;
    expect(result).toMatchObject({ outcome: "completed", tokensTotal: next });
    expect(result.measuredTtftMs).not.toBeNull();
    expect(next).toBeGreaterThan(0);
    // The chain's chunk boundaries (128, 256 tokens) are resident now, named as the controller names them.
    const chain = planChain(model.fingerprint as ModelFingerprint, prompt, 128);
    await until("residency in a heartbeat", () =>
      (hub.view.entries.get(WORKER)!.heartbeat?.residentPrefixes ?? []).some(
        (p) => p.nodeId === chain[1]!.nodeId,
      ),
    );
    const resident = hub.view.entries.get(WORKER)!.heartbeat!.residentPrefixes;
    expect(resident).toEqual(
      expect.arrayContaining([
        { nodeId: chain[0]!.nodeId, tokens: 128 },
        { nodeId: chain[1]!.nodeId, tokens: 256 },
      ]),
    );
  });

  it("re-runs admission against its real pages and declines what does not fit, the wrong model or too long a context", async () => {
    // 90 prompt + 1500 generated tokens need 100 pages; the pool has 96.
    hub.sendOffer(WORKER, offer("r-big", 1, tokens(90, 5), 1500));
    hub.sendOffer(
      WORKER,
      offer("r-model", 1, tokens(10, 5), 4, { modelFingerprint: "ab".repeat(32) as ModelFingerprint }),
    );
    hub.sendOffer(WORKER, offer("r-ctx", 1, tokens(10, 5), 4000));
    await until("three declines", () => messages.filter((m) => m.type === "decline").length >= 3);
    expect(of("r-big")).toEqual([
      expect.objectContaining({ type: "decline", msg: expect.objectContaining({ reason: "pages_short" }) }),
    ]);
    expect(of("r-model")[0]!.msg).toMatchObject({ reason: "wrong_model" });
    expect(of("r-ctx")[0]!.msg).toMatchObject({ reason: "context_too_long" });
    expect(rt.runtime.stats()).toMatchObject({ waiting: 0, running: 0 });
  });

  it("a cancel fences the attempt: nothing more of it is sent and its pages come back", async () => {
    hub.sendOffer(WORKER, offer("r-cancel", 1, longPrompt, 400));
    await until("tokens", () => of("r-cancel").some((m) => m.type === "tokens"));
    hub.sendCancel(WORKER, { requestId: RequestId("r-cancel"), attempt: 1, reason: "test" });
    const failedBefore = agent.counters.failed;
    await until("the attempt to stop", () => agent.counters.failed > failedBefore);
    const seen = of("r-cancel").length;
    await until(
      "a later heartbeat",
      () => (hub.view.entries.get(WORKER)!.heartbeat?.queue.runningRequests ?? 1) === 0,
    );
    expect(of("r-cancel")).toHaveLength(seen);
    expect(of("r-cancel").some((m) => m.type === "result")).toBe(false);
    const sent = of("r-cancel")
      .filter((m) => m.type === "tokens")
      .reduce((a, m) => a + (m.msg as Tokens).tokens.length, 0);
    expect(sent).toBeLessThan(400);
    // Its reservation is released: the pool is whole again (its pages at most cached, hence evictable).
    const hb = hub.view.entries.get(WORKER)!.heartbeat!;
    expect(hb.freePages + hb.evictablePages).toBeGreaterThan(PAGES - 2);
  });

  it("a newer attempt supersedes the older one on the same worker, and the old attempt is then declined as stale", async () => {
    hub.sendOffer(WORKER, offer("r-sup", 1, longPrompt, 400));
    await until("attempt 1 streaming", () => of("r-sup", 1).some((m) => m.type === "tokens"));
    hub.sendOffer(WORKER, offer("r-sup", 2, longPrompt, 20));
    await until("attempt 2's result", () => of("r-sup", 2).some((m) => m.type === "result"));
    expect((of("r-sup", 2).at(-1)!.msg as Result).outcome).toBe("completed");
    await until("attempt 1 to stop", () => rt.runtime.stats().running + rt.runtime.stats().waiting === 0);
    expect(of("r-sup", 1).some((m) => m.type === "result")).toBe(false);
    hub.sendOffer(WORKER, offer("r-sup", 1, longPrompt, 20));
    await until("the stale decline", () => of("r-sup", 1).some((m) => m.type === "decline"));
    expect(of("r-sup", 1).find((m) => m.type === "decline")!.msg).toMatchObject({ reason: "stale_attempt" });
  });

  it("reconnects with backoff when the controller restarts, keeping its epoch and counting its sequence on", async () => {
    const before = hub.view.entries.get(WORKER)!;
    await hub.close();
    await new Promise((r) => setTimeout(r, 100));
    await startHub();
    await until("the reconnect", () => hub.connectedWorkers().length === 1);
    const after = hub.view.entries.get(WORKER)!;
    expect(after.epoch).toBe(before.epoch);
    expect(after.sequence).toBeGreaterThan(before.sequence);
    expect(agent.counters.connects).toBe(2);
  });
});
