import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { WebSocket } from "ws";
import { WORKER_ID_HEADER, WorkerHub } from "../../../controller/fleet/hub.ts";
import { type Heartbeat, HeartbeatMessage } from "../../../schema/control.ts";
import type { WorkerId } from "../../../schema/ids.ts";
import { silentLogger } from "../../../schema/log.ts";
import { encodeMessage } from "../../../schema/wire.ts";
import { heartbeat, wid } from "../fixtures.ts";

/**
 * Per-worker tokens on the heartbeat socket, over real sockets: a worker's own
 * token admits only that worker; the shared secret admits only workers with
 * no token of their own; anything else is refused and changes nothing.
 */

const SECRET = "shared-secret";
const TOKENS = { w1: "token-of-w1", w2: "token-of-w2" };
let hub: WorkerHub;
let lost: WorkerId[];
const clients: WebSocket[] = [];

async function until(what: string, ok: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Opens a socket; rejects with "refused: STATUS" when the upgrade is refused. */
async function connect(token: string | null, named?: string): Promise<WebSocket> {
  const headers: Record<string, string> = {};
  if (token !== null) headers.authorization = `Bearer ${token}`;
  if (named !== undefined) headers[WORKER_ID_HEADER] = named;
  const ws = new WebSocket(`ws://127.0.0.1:${hub.port}`, { headers });
  clients.push(ws);
  await new Promise<void>((resolve, reject) => {
    ws.once("open", () => resolve());
    ws.once("unexpected-response", (_q, res) => reject(new Error(`refused: ${res.statusCode}`)));
  });
  return ws;
}

function closeCode(ws: WebSocket): Promise<number> {
  return new Promise((resolve) => ws.once("close", (code) => resolve(code)));
}

const hb = (id: string, sequence: number, over: Partial<Heartbeat> = {}) =>
  encodeMessage(HeartbeatMessage, heartbeat(id, { sequence, ...over }));

/** w1 connected with its own token and heartbeating (sequence 1, 5 free pages). */
async function w1Connected(): Promise<WebSocket> {
  const ws = await connect(TOKENS.w1, "w1");
  ws.send(hb("w1", 1, { freePages: 5 as never }));
  await until("w1's heartbeat", () => hub.connectedWorkers().includes(wid("w1")));
  return ws;
}

beforeEach(async () => {
  lost = [];
  hub = new WorkerHub({
    host: "127.0.0.1",
    port: 0,
    clusterSecret: SECRET,
    workerTokens: TOKENS,
    ttlMs: 60_000,
    log: silentLogger,
  });
  hub.setListener({ onAssignment: () => undefined, onWorkerLost: (id) => lost.push(id) });
  await hub.start();
});

afterEach(async () => {
  for (const c of clients.splice(0)) if (c.readyState !== WebSocket.CONNECTING) c.terminate();
  await hub.close();
});

describe("per-worker tokens on the worker socket", () => {
  it("a worker's own token admits it", async () => {
    const ws = await w1Connected();
    expect(hub.view.entries.get(wid("w1"))!.heartbeat?.freePages).toBe(5);
    expect(ws.readyState).toBe(WebSocket.OPEN);
    expect(hub.counters.refusedUpgrades).toBe(0);
  });

  it("refuses another worker's token at the upgrade when the worker names itself; nothing changes", async () => {
    await w1Connected();
    const before = hub.view;
    await expect(connect(TOKENS.w1, "w2")).rejects.toThrow("refused: 401");
    await expect(connect(TOKENS.w2, "w1")).rejects.toThrow("refused: 401");
    expect(hub.counters.refusedUpgrades).toBe(2);
    expect(hub.counters.connections).toBe(1);
    expect(hub.view).toBe(before);
    expect(hub.connectedWorkers()).toEqual(["w1"]);
    expect(lost).toEqual([]);
  });

  it("closes a connection whose heartbeat speaks for a worker its token is not; the real worker keeps its connection and view", async () => {
    const real = await w1Connected();
    const before = hub.view;
    // w2's token, no name on the upgrade, then a heartbeat claiming to be w1 (a newer one, which would replace w1's).
    const impostor = await connect(TOKENS.w2);
    const closed = closeCode(impostor);
    impostor.send(hb("w1", 99, { freePages: 1_000 as never }));
    expect(await closed).toBe(1008);
    expect(hub.view).toBe(before);
    expect(hub.view.entries.get(wid("w1"))!.heartbeat?.freePages).toBe(5);
    expect(hub.connectedWorkers()).toEqual(["w1"]);
    expect(real.readyState).toBe(WebSocket.OPEN);
    expect(lost).toEqual([]);
    expect(hub.counters.closedForBadFrames).toBe(1);
  });

  it("refuses an unknown token and a missing one", async () => {
    await expect(connect("no-such-token", "w3")).rejects.toThrow("refused: 401");
    await expect(connect("no-such-token")).rejects.toThrow("refused: 401");
    await expect(connect(null, "w1")).rejects.toThrow("refused: 401");
    expect(hub.counters).toMatchObject({ refusedUpgrades: 3, connections: 0 });
    expect(hub.view.entries.size).toBe(0);
  });

  it("the shared secret admits a worker without a token of its own, and no worker that has one", async () => {
    const w3 = await connect(SECRET, "w3");
    w3.send(hb("w3", 1));
    await until("w3", () => hub.connectedWorkers().includes(wid("w3")));
    await w1Connected();
    const before = hub.view;
    await expect(connect(SECRET, "w1")).rejects.toThrow("refused: 401");
    const unnamed = await connect(SECRET);
    const closed = closeCode(unnamed);
    unnamed.send(hb("w1", 50));
    expect(await closed).toBe(1008);
    expect(hub.view).toBe(before);
    expect(hub.connectedWorkers()).toEqual(["w1", "w3"]);
    expect(lost).toEqual([]);
  });

  it("refuses a malformed worker name on the upgrade", async () => {
    await expect(connect(TOKENS.w1, "has space")).rejects.toThrow("refused: 400");
    expect(hub.counters.connections).toBe(0);
  });

  it("rejects token tables it could not enforce, naming the problem", () => {
    const make = (workerTokens: Record<string, string>) =>
      new WorkerHub({
        host: "127.0.0.1",
        port: 0,
        clusterSecret: SECRET,
        workerTokens,
        ttlMs: 1,
        log: silentLogger,
      });
    expect(() => make({ a: "same", b: "same" })).toThrow("a and b have the same token");
    expect(() => make({ a: "" })).toThrow("controller.workerTokens.a: the token is empty");
    expect(() => make({ a: SECRET })).toThrow(
      "controller.workerTokens.a: the token equals auth.clusterSecret",
    );
    expect(() => make({ "bad id": "t" })).toThrow("worker id must be");
  });
});

describe("per-worker tokens without a shared secret", () => {
  it("only listed workers, each with its own token, may connect", async () => {
    await hub.close();
    hub = new WorkerHub({
      host: "127.0.0.1",
      port: 0,
      clusterSecret: "",
      workerTokens: TOKENS,
      ttlMs: 60_000,
      log: silentLogger,
    });
    await hub.start();
    await expect(connect(null, "w3")).rejects.toThrow("refused: 401");
    await expect(connect("", "w3")).rejects.toThrow("refused: 401");
    const w2 = await connect(TOKENS.w2, "w2");
    w2.send(hb("w2", 1));
    await until("w2", () => hub.connectedWorkers().includes(wid("w2")));
  });
});
