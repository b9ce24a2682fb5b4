import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { WebSocket } from "ws";
import { type AssignmentMessage, WorkerHub } from "../../../controller/fleet/hub.ts";
import {
  AcceptMessage,
  CancelMessage,
  controllerToWorker,
  type Heartbeat,
  HeartbeatMessage,
} from "../../../schema/control.ts";
import type { WorkerId } from "../../../schema/ids.ts";
import { silentLogger } from "../../../schema/log.ts";
import { encodeMessage } from "../../../schema/wire.ts";
import { heartbeat, rid, wid } from "../fixtures.ts";

/** The hub over real sockets, with raw ws clients playing workers and a manual clock for TTLs. */

const SECRET = "hub-test-secret";
let clock = 0;
let hub: WorkerHub;
let lost: { workerId: WorkerId; reason: string }[];
let messages: AssignmentMessage[];
const clients: WebSocket[] = [];

async function until(what: string, ok: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

async function connect(secret = SECRET): Promise<WebSocket> {
  const ws = new WebSocket(`ws://127.0.0.1:${hub.port}`, { headers: { authorization: `Bearer ${secret}` } });
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

beforeEach(async () => {
  clock = 0;
  lost = [];
  messages = [];
  hub = new WorkerHub({
    host: "127.0.0.1",
    port: 0,
    clusterSecret: SECRET,
    ttlMs: 1_000,
    maxFrameBytes: 64 * 1024,
    log: silentLogger,
    now: () => clock,
  });
  hub.setListener({
    onAssignment: (m) => messages.push(m),
    onWorkerLost: (workerId, reason) => lost.push({ workerId, reason }),
  });
  await hub.start();
});

afterEach(async () => {
  for (const c of clients.splice(0)) if (c.readyState !== WebSocket.CONNECTING) c.terminate();
  await hub.close();
});

describe("the heartbeat hub", () => {
  it("keeps the newest heartbeat version per worker and drops older ones", async () => {
    const ws = await connect();
    ws.send(hb("w1", 5));
    ws.send(hb("w1", 3));
    ws.send(hb("w1", 6, { freePages: 7 as never }));
    await until(
      "three heartbeats",
      () => hub.counters.heartbeatsAccepted + hub.counters.heartbeatsStale === 3,
    );
    expect(hub.counters).toMatchObject({ heartbeatsAccepted: 2, heartbeatsStale: 1 });
    const e = hub.view.entries.get(wid("w1"))!;
    expect([e.sequence, e.heartbeat?.freePages]).toEqual([6, 7]);
    // A new epoch (a restarted worker) supersedes any sequence of the old one.
    ws.send(hb("w1", 1, { epoch: 2 }));
    await until("the new epoch", () => hub.view.entries.get(wid("w1"))!.epoch === 2);
    expect(hub.connectedWorkers()).toEqual(["w1"]);
  });

  it("expires a silent worker after the TTL: its observation goes, its connection closes, it is reported lost", async () => {
    const ws = await connect();
    const closed = closeCode(ws);
    ws.send(hb("w1", 1));
    await until("the heartbeat", () => hub.counters.heartbeatsAccepted === 1);
    clock = 1_000;
    expect(hub.expireNow()).toEqual([]);
    clock = 1_001;
    expect(hub.expireNow()).toEqual(["w1"]);
    expect(await closed).toBe(1013);
    expect(hub.view.entries.get(wid("w1"))!.heartbeat).toBeNull();
    expect(lost).toEqual([{ workerId: "w1", reason: "heartbeat expired" }]);
    expect(hub.sendCancel(wid("w1"), { requestId: rid("r"), attempt: 1, reason: "x" })).toBe(false);
  });

  it("drops a worker's observation at once when its connection closes", async () => {
    const ws = await connect();
    ws.send(hb("w1", 1));
    await until("the heartbeat", () => hub.connectedWorkers().length === 1);
    ws.close();
    await until("the loss", () => lost.length === 1);
    expect(hub.view.entries.get(wid("w1"))!.heartbeat).toBeNull();
    expect(hub.connectedWorkers()).toEqual([]);
  });

  it("routes assignment messages of a bound connection and closes one that speaks for another worker", async () => {
    const ws = await connect();
    ws.send(hb("w1", 1));
    const accept = (workerId: string) =>
      encodeMessage(AcceptMessage, {
        requestId: rid("r1"),
        attempt: 1,
        workerId: wid(workerId),
        epoch: 1,
        reservedPages: 2 as never,
      });
    ws.send(accept("w1"));
    await until("the accept", () => messages.length === 1);
    expect(messages[0]).toMatchObject({ type: "accept", msg: { requestId: "r1", workerId: "w1" } });
    const closed = closeCode(ws);
    ws.send(accept("w2"));
    expect(await closed).toBe(1008);
    expect(messages).toHaveLength(1);
    expect(hub.counters.closedForBadFrames).toBe(1);
  });

  it("refuses assignment messages before the first heartbeat", async () => {
    const ws = await connect();
    const closed = closeCode(ws);
    ws.send(
      encodeMessage(AcceptMessage, {
        requestId: rid("r1"),
        attempt: 1,
        workerId: wid("w1"),
        epoch: 1,
        reservedPages: 0 as never,
      }),
    );
    expect(await closed).toBe(1008);
    expect(messages).toEqual([]);
    expect(hub.view.entries.size).toBe(0);
  });

  it("closes bad frames (garbage, text, a message the controller sends, oversized) without changing the view", async () => {
    const ws = await connect();
    ws.send(hb("w1", 1));
    await until("the heartbeat", () => hub.counters.heartbeatsAccepted === 1);
    const before = hub.view;
    const cases: [string, (c: WebSocket) => void, number][] = [
      ["garbage", (c) => c.send(Buffer.from([0xc1, 0x00, 0x01])), 1007],
      ["text", (c) => c.send("hello"), 1007],
      [
        "wrong direction",
        (c) => c.send(encodeMessage(CancelMessage, { requestId: rid("r"), attempt: 1, reason: "" })),
        1007,
      ],
      ["oversized", (c) => c.send(Buffer.alloc(128 * 1024)), 1009],
    ];
    for (const [what, send, code] of cases) {
      const c = await connect();
      const closed = closeCode(c);
      send(c);
      expect(await closed, what).toBe(code);
    }
    expect(hub.view).toBe(before);
    expect(hub.connectedWorkers()).toEqual(["w1"]);
    expect(lost).toEqual([]);
  });

  it("refuses an upgrade without the cluster secret", async () => {
    await expect(connect("wrong")).rejects.toThrow("refused: 401");
    expect(hub.counters.refusedUpgrades).toBe(1);
    expect(hub.counters.connections).toBe(0);
  });

  it("a second connection of the same worker replaces the first, whose work is reported lost", async () => {
    const a = await connect();
    a.send(hb("w1", 1));
    await until("the first", () => hub.connectedWorkers().length === 1);
    const closedA = closeCode(a);
    const b = await connect();
    b.send(hb("w1", 2));
    expect(await closedA).toBe(1008);
    expect(lost.map((l) => l.workerId)).toEqual(["w1"]);
    expect(hub.connectedWorkers()).toEqual(["w1"]);
    expect(hub.view.entries.get(wid("w1"))!.heartbeat?.sequence).toBe(2);
    const got = new Promise<Buffer>((resolve) => b.once("message", (d) => resolve(d as Buffer)));
    expect(hub.sendCancel(wid("w1"), { requestId: rid("r9"), attempt: 3, reason: "why" })).toBe(true);
    expect(controllerToWorker.decode(await got)).toMatchObject({
      kind: "control.cancel",
      message: { requestId: "r9", attempt: 3 },
    });
  });
});
