import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WorkerHub } from "../../../controller/fleet/hub.ts";
import type { Engine, StepBatch } from "../../../native/engine.ts";
import type { Offer } from "../../../schema/control.ts";
import { RequestId, type WorkerId } from "../../../schema/ids.ts";
import { silentLogger } from "../../../schema/log.ts";
import { WorkerAgent } from "../../../worker/agent/agent.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { ConstraintCompiler } from "../../../worker/structured/constraint.ts";
import { prompt, type RuntimeFixture, startRuntime, tinyModel } from "../runtime/fixture.ts";

/**
 * The queue a heartbeat reports is prompt tokens still to PREFILL: an
 * accepted request whose plan restores most of its prompt (the router's
 * plan: cached tokens from a durable tier) queues only the rest. Counting the
 * whole prompt made a worker with one restoring request look seconds away
 * to the router (decision records of `bench cluster`: predicted queue up to
 * 17× the measured time to first token).
 */
const WORKER = "queue-w" as WorkerId;
let model: LoadedModel;
let cleanup: () => Promise<void>;
let rt: RuntimeFixture;
let hub: WorkerHub;
let agent: WorkerAgent;
let release: () => void = () => undefined;

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
  // Steps wait for the test, so the accepted request is still before its first token when the heartbeat is read.
  let gate = new Promise<void>((r) => {
    release = r;
  });
  const wrap = (inner: Engine): Engine =>
    new Proxy(inner, {
      get(target, key) {
        if (key === "step")
          return async (batch: StepBatch) => {
            await gate;
            return target.step(batch);
          };
        const v = Reflect.get(target, key, target);
        return typeof v === "function" ? v.bind(target) : v;
      },
    });
  rt = await startRuntime(model, {}, wrap);
  hub = new WorkerHub({ host: "127.0.0.1", port: 0, clusterSecret: "s", ttlMs: 60_000, log: silentLogger });
  const port = await hub.start();
  agent = new WorkerAgent(rt.runtime, {
    workerId: WORKER,
    controllerUrl: `ws://127.0.0.1:${port}`,
    clusterSecret: "s",
    fingerprint: model.fingerprint,
    maxContext: model.config.spec.maxPosition,
    pageTokens: 16,
    chunkTokens: 128,
    kvBytesPerToken: 256,
    durableTiers: ["ram"],
    stopTokenIds: [],
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
  while (hub.connectedWorkers().length === 0) await new Promise((r) => setTimeout(r, 10));
  gate = new Promise<void>((r) => {
    release = r;
  });
}, 120_000);

afterAll(async () => {
  release();
  await agent?.stop();
  await hub?.close();
  await rt?.close();
  await cleanup?.();
});

describe("the heartbeat's queue", () => {
  it("counts the prompt tokens a request still has to prefill, not those its plan restores", async () => {
    const offer: Offer = {
      requestId: RequestId("q-1"),
      attempt: 1,
      workerId: WORKER,
      modelFingerprint: model.fingerprint,
      prompt: prompt(3, 300),
      maxTokens: 2 as never,
      cacheSalt: "",
      sampling: { temperature: 0 },
      plan: { source: "ram", cachedTokens: 256 as never, predictedTtftMs: 5 },
    };
    expect(hub.sendOffer(WORKER, offer)).toBe(true);
    const deadline = Date.now() + 10_000;
    while (agent.counters.accepted === 0) {
      if (Date.now() > deadline) throw new Error("the offer was not accepted");
      await new Promise((r) => setTimeout(r, 10));
    }
    const hb = agent.heartbeat();
    expect(hb.queue.queuedRequests + hb.queue.runningRequests).toBe(1);
    expect(hb.queue.queuedTokens).toBe(300 - 256);
    // The same, per attempt: what the router joins to its own list of outstanding attempts.
    expect(hb.queue.prefilling).toEqual([{ requestId: "q-1", attempt: 1, remainingTokens: 300 - 256 }]);
    release();
    while (agent.counters.completed === 0) {
      if (Date.now() > deadline) throw new Error("the request did not complete");
      await new Promise((r) => setTimeout(r, 10));
    }
    expect(agent.heartbeat().queue.prefilling).toEqual([]);
  });
});
