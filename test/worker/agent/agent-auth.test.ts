import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WorkerHub } from "../../../controller/fleet/hub.ts";
import type { WorkerId } from "../../../schema/ids.ts";
import type { Logger } from "../../../schema/log.ts";
import { silentLogger } from "../../../schema/log.ts";
import { WorkerAgent } from "../../../worker/agent/agent.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { ConstraintCompiler } from "../../../worker/structured/constraint.ts";
import { type RuntimeFixture, startRuntime, tinyModel } from "../runtime/fixture.ts";

/**
 * The worker agent's side of per-worker tokens, with a real runtime and a
 * real hub: an agent presenting its own token joins; one presenting another
 * worker's token is refused at the upgrade (it names itself there) and the
 * hub's view stays as it was; one without a token of its own joins with the
 * shared secret.
 */

const SECRET = "shared";
const TOKENS = { "w-a": "token-a", "w-b": "token-b" };
let model: LoadedModel;
let cleanup: () => Promise<void>;
let rt: RuntimeFixture;
let hub: WorkerHub;
const agents: WorkerAgent[] = [];

async function until(what: string, ok: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

function agent(workerId: string, bearer: string, log: Logger = silentLogger): WorkerAgent {
  const a = new WorkerAgent(rt.runtime, {
    workerId: workerId as WorkerId,
    controllerUrl: `ws://127.0.0.1:${hub.port}`,
    clusterSecret: bearer,
    fingerprint: model.fingerprint,
    maxContext: model.config.spec.maxPosition,
    pageTokens: 16,
    chunkTokens: 128,
    kvBytesPerToken: 256,
    durableTiers: [],
    stopTokenIds: model.eosTokenIds,
    constraints: new ConstraintCompiler(model.tokenizer.tokenBytes()),
    heartbeatIntervalMs: 100,
    reconnectBaseMs: 50,
    reconnectMaxMs: 200,
    fenceMemory: 16,
    maxQueuedBytes: 1 << 20,
    log,
  });
  agents.push(a);
  a.start();
  return a;
}

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
  rt = await startRuntime(model, { physicalPages: 32 });
  hub = new WorkerHub({
    host: "127.0.0.1",
    port: 0,
    clusterSecret: SECRET,
    workerTokens: TOKENS,
    ttlMs: 60_000,
    log: silentLogger,
  });
  await hub.start();
}, 120_000);

afterAll(async () => {
  for (const a of agents) await a.stop();
  await hub?.close();
  await rt?.close();
  await cleanup?.();
});

describe("worker agents and per-worker tokens", () => {
  it("an agent with its own token joins and heartbeats", async () => {
    const a = agent("w-a", TOKENS["w-a"]);
    await a.connected;
    await until("w-a's heartbeats", () => (hub.view.entries.get("w-a" as WorkerId)?.sequence ?? 0) >= 2);
    expect(hub.connectedWorkers()).toEqual(["w-a"]);
  });

  it("an agent presenting another worker's token is refused at the upgrade; nothing changes", async () => {
    const refusals: unknown[] = [];
    const log: Logger = {
      log: (_level, event, fields) => {
        if (event === "agent.refused") refusals.push(fields);
      },
    } as Logger;
    const before = hub.counters.refusedUpgrades;
    const b = agent("w-b", TOKENS["w-a"], log);
    await until("two refusals (it retries)", () => refusals.length >= 2);
    await b.stop();
    expect(refusals[0]).toMatchObject({ status: 401 });
    expect(hub.counters.refusedUpgrades - before).toBeGreaterThanOrEqual(2);
    expect(hub.connectedWorkers()).toEqual(["w-a"]);
    expect(hub.view.entries.has("w-b" as WorkerId)).toBe(false);
  });

  it("an agent without a token of its own joins with the shared secret", async () => {
    const c = agent("w-c", SECRET);
    await c.connected;
    await until("w-c", () => hub.connectedWorkers().includes("w-c" as WorkerId));
    expect(hub.connectedWorkers()).toEqual(["w-a", "w-c"]);
  });
});
