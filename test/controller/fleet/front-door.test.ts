import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { WebSocket } from "ws";
import { runQuery } from "../../../catalog/console.ts";
import { EmbeddedLog } from "../../../catalog/log-embedded.ts";
import { Replica } from "../../../catalog/replica.ts";
import { type ApiFrontDoor, openFrontDoor } from "../../../cli/api-server.ts";
import { defaultAssignmentLimits } from "../../../controller/assignments.ts";
import { DecisionRecorder } from "../../../controller/fleet/decisions.ts";
import { WorkerHub } from "../../../controller/fleet/hub.ts";
import { FleetService } from "../../../controller/fleet/service.ts";
import { defaultRouterPolicy } from "../../../controller/router.ts";
import { ProposalMsg } from "../../../schema/catalog.ts";
import { resolveConfig } from "../../../schema/config-load.ts";
import { silentLogger } from "../../../schema/log.ts";
import { encodeMessage } from "../../../schema/wire.ts";
import { startWriter } from "../../catalog/log-helpers.ts";
import { postJson, rawRequest } from "../api/harness.ts";
import { FP } from "../fixtures.ts";
import { codec, FakeWorker, until } from "./fake-worker.ts";

/**
 * The fleet controller's front door as `continuum controller` composes it
 * (cli/api-server.ts over a FleetService, a WorkerHub and a catalog replica
 * of a real embedded log with its writer), with raw WebSocket clients as
 * workers: the client's X-Request-Id reaches the routing decision recorded
 * in the catalog, overload answers carry Retry-After and OpenAI's types, and
 * the catalog endpoint is the bounded one.
 */

const SECRET = "front-door-secret";
let log: EmbeddedLog;
let stopWriter: () => Promise<void>;
let replica: Replica;
let hub: WorkerHub;
let recorder: DecisionRecorder;
let service: FleetService;
let frontDoor: ApiFrontDoor;
let base: string;
const sockets: WebSocket[] = [];

beforeAll(async () => {
  log = await EmbeddedLog.open();
  ({ stop: stopWriter } = startWriter(log));
  replica = await Replica.start({ log });
  await log.propose(
    encodeMessage(ProposalMsg, {
      id: "setup",
      clientId: "test",
      ops: [
        { op: "model.registered", fingerprint: FP, name: "m", layout: "kv-test/v1", chunkTokens: 256 },
        { op: "worker.registered", worker: "w1", model: FP, address: "127.0.0.1:1" },
      ],
    }),
  );
  hub = new WorkerHub({
    host: "127.0.0.1",
    port: 0,
    clusterSecret: SECRET,
    ttlMs: 60_000,
    log: silentLogger,
  });
  await hub.start();
  recorder = new DecisionRecorder(log, { clientId: "controller", flushMs: 20, log: silentLogger });
  service = new FleetService(hub, { db: () => replica.catalog, lag: () => 0 }, recorder, {
    model: { id: "m", fingerprint: FP, maxContext: 8192, codec },
    chunkTokens: 256,
    limits: { ...defaultAssignmentLimits, offerTimeoutMs: 30_000 },
    policy: { ...defaultRouterPolicy, heartbeatTtlMs: 60_000 },
    maxActive: 1,
    tickMs: 10,
    log: silentLogger,
  });
  const config = resolveConfig(
    { controller: { host: "127.0.0.1", httpPort: 0, catalogQuery: { timeoutMs: 1_000 } } },
    {},
  );
  frontDoor = openFrontDoor({ config, service, models: [], catalog: replica, log: silentLogger });
  base = `http://127.0.0.1:${await frontDoor.server.start()}`;
}, 60_000);

afterAll(async () => {
  for (const s of sockets.splice(0)) s.terminate();
  await frontDoor?.close();
  service?.close();
  await recorder?.close();
  await hub?.close();
  await replica?.stop();
  await stopWriter?.();
  await log?.close();
});

const body = { model: "m", prompt: [1, 2, 3, 4, 5, 6, 7, 8], max_tokens: 2 };

describe("the fleet's front door", () => {
  it("answers 503 with Retry-After while no worker is connected", async () => {
    const r = await postJson(base, "/v1/completions", body);
    expect(r.status).toBe(503);
    expect(Number(r.headers["retry-after"])).toBeGreaterThanOrEqual(1);
    expect(r.json.error?.type).toBe("server_error");
  });

  it("carries the client's X-Request-Id into the decision it records in the catalog", async () => {
    const w = await FakeWorker.connect(hub, "w1", SECRET, sockets);
    const answer = postJson(base, "/v1/completions", body, { "x-request-id": "trace-77" });
    await until("the offer", () => w.offers.length > 0);
    const offer = w.offers.at(-1)!;
    expect(offer.requestId).toContain("trace-77");
    // maxActive is 1: a second request while this one runs is a 429 with OpenAI's type.
    const busy = await postJson(base, "/v1/completions", body);
    expect(busy.status).toBe(429);
    expect(busy.json.error?.type).toBe("rate_limit_exceeded");
    expect(Number(busy.headers["retry-after"])).toBeGreaterThanOrEqual(1);
    w.accept(offer);
    w.complete(offer, [3, 4]);
    const r = await answer;
    expect(r.status).toBe(200);
    expect(r.headers["x-request-id"]).toBe("trace-77");
    const recorded = () =>
      runQuery(replica.datalog(), "[:find [?r ...] :where [?d :decision/request ?r]]") as string[];
    await until("the decision in the catalog", () => recorded().some((id) => id.includes("trace-77")));
    expect(recorded().filter((id) => id.includes("trace-77"))).toEqual([offer.requestId]);
  });

  it("answers 503 with Retry-After, not 500, when the worker dies after its first tokens", async () => {
    for (const s of sockets.splice(0)) s.terminate();
    await until("the earlier worker gone", () => hub.connectedWorkers().length === 0);
    const w = await FakeWorker.connect(hub, "w2", SECRET, sockets);
    const answer = postJson(base, "/v1/completions", { ...body, max_tokens: 4 });
    await until("the offer", () => w.offers.length > 0);
    const offer = w.offers.at(-1)!;
    w.accept(offer);
    w.tokens(offer, [3]);
    // Tokens were delivered, so the request cannot move to another worker: it fails, as the fleet's fault.
    await new Promise((r) => setTimeout(r, 50));
    w.ws.terminate();
    const r = await answer;
    expect(r.status).toBe(503);
    expect(Number(r.headers["retry-after"])).toBeGreaterThanOrEqual(1);
    expect(r.json.error?.type).toBe("server_error");
    expect(r.json.error?.message).toMatch(/lost_mid_stream/);
  });

  it("cancels a runaway catalog query at its budget while /health answers", async () => {
    const q = postJson(base, "/v1/catalog/query", {
      query: "[:find ?x ?z :in $ % :where (r ?x ?z)]",
      rules: "[[(r ?x ?z) (r ?x ?y) (r ?y ?z)]]",
    });
    const health = await rawRequest(base, { path: "/health" });
    expect(health.status).toBe(200);
    const r = await q;
    expect(r.status).toBe(400);
    expect(r.json.error?.code).toBe("query_time_budget");
    const ok = await postJson(base, "/v1/catalog/query", {
      query: "[:find ?a . :where [?w :worker/address ?a]]",
    });
    expect(ok.json.result).toBe("127.0.0.1:1");
  }, 60_000);
});
