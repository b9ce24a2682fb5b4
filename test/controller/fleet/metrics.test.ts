import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { WebSocket } from "ws";
import { metrics } from "../../../bench/_serve-load.ts";
import { ApiServer } from "../../../controller/api/server.ts";
import { defaultAssignmentLimits } from "../../../controller/assignments.ts";
import { WorkerHub } from "../../../controller/fleet/hub.ts";
import { registerFleetMetrics } from "../../../controller/fleet/metrics.ts";
import { FleetService } from "../../../controller/fleet/service.ts";
import { defaultRouterPolicy } from "../../../controller/router.ts";
import type { Offer, WorkerStatus } from "../../../schema/control.ts";
import { silentLogger } from "../../../schema/log.ts";
import { FP } from "../fixtures.ts";
import { codec, FakeWorker, until } from "./fake-worker.ts";

/**
 * The fleet controller's /metrics over real sockets: the hub, the fleet
 * service and the HTTP front door as the controller process wires them, with
 * raw WebSocket clients playing workers that decline, go silent, crash or
 * answer late. Each scenario scrapes /metrics over HTTP and checks that the
 * counter of what happened moved. Time is the hub's injected clock, so
 * timeouts and expiry do not depend on machine speed.
 */

const SECRET = "metrics-secret";
const TTL_MS = 1_000;
const OFFER_TIMEOUT_MS = 500;
let clock = 0;
let hub: WorkerHub;
let service: FleetService;
let api: ApiServer;
let base: string;
const sockets: WebSocket[] = [];

/** A worker on this file's hub. */
const connect = (id: string) => FakeWorker.connect(hub, id, SECRET, sockets);

const scrape = () => metrics({ url: base });

function complete(maxTokens: number): Promise<Response> {
  return fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", prompt: [1, 2, 3, 4, 5, 6, 7, 8], max_tokens: maxTokens }),
  });
}

/** The one worker of `workers` whose offers grew past `seen`, and its newest offer. */
async function nextOffer(workers: FakeWorker[], seen: number): Promise<{ w: FakeWorker; o: Offer }> {
  const total = () => workers.reduce((a, w) => a + w.offers.length, 0);
  await until(`offer ${seen + 1}`, () => total() > seen);
  const w = workers.find((x) => x.offers.some((o) => o.attempt === seen + 1))!;
  return { w, o: w.offers.find((o) => o.attempt === seen + 1)! };
}

beforeEach(async () => {
  clock = 0;
  hub = new WorkerHub({
    host: "127.0.0.1",
    port: 0,
    clusterSecret: SECRET,
    ttlMs: TTL_MS,
    log: silentLogger,
    now: () => clock,
  });
  await hub.start();
  service = new FleetService(hub, null, null, {
    model: { id: "m", fingerprint: FP, maxContext: 8192, codec },
    chunkTokens: 256,
    limits: { ...defaultAssignmentLimits, offerTimeoutMs: OFFER_TIMEOUT_MS },
    policy: { ...defaultRouterPolicy, heartbeatTtlMs: TTL_MS },
    maxActive: 16,
    tickMs: 10,
    log: silentLogger,
  });
  api = new ApiServer(service, { host: "127.0.0.1", port: 0 });
  registerFleetMetrics(api.metrics, { hub, service, heartbeatTtlMs: TTL_MS, catalogOffset: () => 42 });
  base = `http://127.0.0.1:${await api.start()}`;
});

afterEach(async () => {
  for (const s of sockets.splice(0)) if (s.readyState !== WebSocket.CONNECTING) s.terminate();
  await api.close();
  service.close();
  await hub.close();
});

describe("the fleet controller's /metrics", () => {
  it("starts at zero with every assignment event and worker state listed", async () => {
    const m = await scrape();
    for (const event of ["offered", "declined", "timed_out", "worker_lost", "late_ignored", "completed"])
      expect(m.get(`continuum_assignment_events_total{event="${event}"}`), event).toBe(0);
    expect(m.get('continuum_workers{state="live"}')).toBe(0);
    expect(m.get("continuum_heartbeats_expired_total")).toBe(0);
    expect(m.get("continuum_catalog_offset")).toBe(42);
  });

  it("counts a decline, the offer that follows it, a late accept of the declined attempt, and heartbeats", async () => {
    const workers = [await connect("w1"), await connect("w2")];
    const answered = complete(2);
    const first = await nextOffer(workers, 0);
    first.w.decline(first.o);
    const second = await nextOffer(workers, 1);
    expect(second.w).not.toBe(first.w);
    second.w.accept(second.o);
    // The decliner changes its mind: an accept of attempt 1 while attempt 2 runs is late.
    first.w.accept(first.o);
    await until("the late accept", () => service.counters.lateIgnored === 1);
    second.w.complete(second.o, [3, 4]);
    expect((await answered).status).toBe(200);
    const m = await scrape();
    expect(m.get('continuum_assignment_events_total{event="offered"}')).toBe(2);
    expect(m.get('continuum_assignment_events_total{event="declined"}')).toBe(1);
    expect(m.get('continuum_assignment_events_total{event="late_ignored"}')).toBe(1);
    expect(m.get('continuum_assignment_events_total{event="completed"}')).toBe(1);
    expect(m.get('continuum_heartbeats_total{outcome="accepted"}')).toBe(2);
    expect(m.get('continuum_worker_connections_total{outcome="accepted"}')).toBe(2);
    expect(m.get('continuum_workers{state="live"}')).toBe(2);
    expect(m.get('continuum_workers{state="connected"}')).toBe(2);
  });

  it("counts an offer timeout and a crash fallback, then a heartbeat expiry", async () => {
    const workers = [await connect("w1"), await connect("w2"), await connect("w3")];
    const answered = complete(1);
    // Attempt 1: silence past the offer timeout (the service's tick reads the hub's clock).
    await nextOffer(workers, 0);
    clock += OFFER_TIMEOUT_MS + 1;
    // Attempt 2: accepted, then the worker's socket dies (a crash).
    const second = await nextOffer(workers, 1);
    // The accept and then the close arrive on one socket, in that order.
    second.w.accept(second.o);
    second.w.ws.terminate();
    // Attempt 3 completes.
    const third = await nextOffer(workers, 2);
    third.w.accept(third.o);
    third.w.complete(third.o, [7]);
    expect((await answered).status).toBe(200);
    let m = await scrape();
    expect(m.get('continuum_assignment_events_total{event="timed_out"}')).toBe(1);
    expect(m.get('continuum_assignment_events_total{event="worker_lost"}')).toBe(1);
    expect(m.get('continuum_assignment_events_total{event="offered"}')).toBe(3);
    expect(m.get('continuum_workers{state="connected"}')).toBe(2);
    // The two left stop heartbeating: past the TTL they expire.
    clock += TTL_MS + 1;
    expect(hub.expireNow()).toHaveLength(2);
    m = await scrape();
    expect(m.get("continuum_heartbeats_expired_total")).toBe(2);
    expect(m.get('continuum_workers{state="live"}')).toBe(0);
  });

  it("sums the cache hits by tier that workers report in their heartbeats, and drops a worker's when it leaves", async () => {
    const status = (ssd: number, peer: number, resident: number): WorkerStatus =>
      ({
        totalPages: 100,
        residentPages: 10,
        residentHitTokens: resident,
        computedTokens: 50,
        restoredChunks: { ram: 0, ssd, peer, s3: 0 },
        restoredBytes: { ram: 0, ssd: ssd * 1000, peer: peer * 1000, s3: 0 },
        publishedChunks: 0,
        publishedBytes: 0,
        catalogOffset: 0,
        catalogLag: 0,
      }) as WorkerStatus;
    const a = await connect("w1");
    const b = await connect("w2");
    a.heartbeat(status(2, 0, 16));
    b.heartbeat(status(1, 3, 32));
    await until("both statuses", () => hub.counters.heartbeatsAccepted === 4);
    let m = await scrape();
    expect(m.get('continuum_fleet_restored_chunks{tier="ssd"}')).toBe(3);
    expect(m.get('continuum_fleet_restored_chunks{tier="peer"}')).toBe(3);
    expect(m.get('continuum_fleet_restored_chunks{tier="s3"}')).toBe(0);
    expect(m.get('continuum_fleet_restored_bytes{tier="peer"}')).toBe(3000);
    expect(m.get('continuum_fleet_prompt_tokens{source="resident"}')).toBe(48);
    expect(m.get('continuum_fleet_prompt_tokens{source="computed"}')).toBe(100);
    b.ws.close();
    await until("w2 gone", () => hub.connectedWorkers().length === 1);
    m = await scrape();
    expect(m.get('continuum_fleet_restored_chunks{tier="ssd"}')).toBe(2);
    expect(m.get('continuum_fleet_restored_chunks{tier="peer"}')).toBe(0);
  });

  it("counts a refused worker upgrade", async () => {
    const ws = new WebSocket(`ws://127.0.0.1:${hub.port}`, { headers: { authorization: "Bearer wrong" } });
    sockets.push(ws);
    await new Promise<void>((resolve) => ws.once("unexpected-response", () => resolve()));
    const m = await scrape();
    expect(m.get('continuum_worker_connections_total{outcome="refused"}')).toBe(1);
    expect(m.get('continuum_worker_connections_total{outcome="accepted"}')).toBe(0);
  });
});
