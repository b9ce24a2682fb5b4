import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WebSocket } from "ws";
import { KafkaLog } from "../../catalog/kafka/log.ts";
import type { FleetWorkerView } from "../../controller/api/service.ts";
import { planChain } from "../../controller/candidates.ts";
import { workerLines } from "../../deploy/cluster.ts";
import { type CatalogOp, ProposalMsg } from "../../schema/catalog.ts";
import { HeartbeatMessage } from "../../schema/control.ts";
import { chainRoot, prefixChain } from "../../schema/identity.ts";
import type { ModelFingerprint } from "../../schema/ids.ts";
import { encodeMessage } from "../../schema/wire.ts";
import { KV_LAYOUT } from "../../worker/model/fingerprint.ts";
import { freePort, freePortPair } from "../ports.ts";
import { startBroker } from "../setup/kafka.ts";
import { RoleProcess, tokens } from "./fleet-process.ts";

/**
 * The fleet as real processes on 127.0.0.1: a catalog writer, a controller
 * and two workers, sharing a catalog through a real Kafka broker (unique
 * topics per run). Requests go through the official openai client.
 *
 * Sizes (tiny model: context 2048, pages of 16 tokens, chunks of 128):
 * each worker has 140 pages, so one request of 1400 + 640 tokens (128 pages,
 * 87 of them a shared resident prefix) fits, and a second concurrent one on
 * the same worker does not.
 */

const SECRET = `fleet-${randomBytes(8).toString("hex")}`;
const PAGES = 140;

let brokers: string;
let stopBroker: (() => Promise<void>) | undefined;
let dataDir: string;
let writer: RoleProcess;
let controller: RoleProcess;
const workers = new Map<string, RoleProcess>();
let client: OpenAI;
let fingerprint: ModelFingerprint;
let env: Record<string, string>;
let workerPort: number;
let httpUrl: string;

function otherWorker(id: string): string {
  return [...workers.keys()].find((w) => w !== id)!;
}

/** Which worker completed a request (and in which attempt), from the controller's log. */
async function completedOn(requestId: string): Promise<{ workerId: string; attempt: number }> {
  const line = await controller.waitFor("assignment.completed", { requestId }, 30_000);
  return { workerId: line.workerId as string, attempt: line.attempt as number };
}

async function catalogQuery(query: string): Promise<unknown[]> {
  const r = await fetch(`${httpUrl}/v1/catalog/query`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ query }),
  });
  expect(r.status).toBe(200);
  return ((await r.json()) as { result: unknown[] }).result;
}

/** The controller's view of the fleet (GET /workers: what `cluster status` prints). */
async function fetchWorkers(): Promise<FleetWorkerView[]> {
  return ((await (await fetch(`${httpUrl}/workers`)).json()) as { workers: FleetWorkerView[] }).workers;
}

/** Prompt tokens each worker has computed, as its last heartbeat told the controller. */
async function computedByWorker(): Promise<Map<string, number>> {
  return new Map((await fetchWorkers()).map((w) => [w.workerId, w.status?.computedTokens ?? 0]));
}

/** Polls a catalog query until `ok` holds (bounded). */
async function catalogUntil(query: string, ok: (rows: unknown[]) => boolean, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const rows = await catalogQuery(query);
    if (ok(rows)) return rows;
    if (Date.now() > deadline) throw new Error(`catalog never answered as expected: ${JSON.stringify(rows)}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

function startWorker(index: number): RoleProcess {
  const p = new RoleProcess(`worker-${index}`, ["worker"], { ...env, CONTINUUM_WORKER_INDEX: String(index) });
  workers.set(`worker-${index}`, p);
  return p;
}

beforeAll(async () => {
  if (process.env.CONTINUUM_KAFKA_BROKERS) {
    brokers = process.env.CONTINUUM_KAFKA_BROKERS;
  } else {
    // Run alone (`vitest run test/fleet`), the global setup starts no broker for this path.
    const dir = await mkdtemp(join(tmpdir(), "continuum-fleet-kafka-"));
    const b = await startBroker(await freePortPair(), dir);
    brokers = b.brokers;
    stopBroker = async () => {
      await b.stop();
      await rm(dir, { recursive: true, force: true });
    };
  }
  dataDir = await mkdtemp(join(tmpdir(), "continuum-fleet-"));
  const run = randomBytes(4).toString("hex");
  const httpPort = await freePort();
  workerPort = await freePort();
  httpUrl = `http://127.0.0.1:${httpPort}`;
  env = {
    PORT: String(httpPort),
    CONTINUUM_CATALOG_LOG: "kafka",
    CONTINUUM_CATALOG_BROKERS: brokers,
    CONTINUUM_CATALOG_TOPICS_PROPOSALS: `fleet-${run}.proposals`,
    CONTINUUM_CATALOG_TOPICS_TX: `fleet-${run}.tx`,
    CONTINUUM_CATALOG_TOPICS_REJECTIONS: `fleet-${run}.rejections`,
    CONTINUUM_STORE_DATA_DIR: dataDir,
    CONTINUUM_AUTH_CLUSTER_SECRET: SECRET,
    CONTINUUM_CONTROLLER_WORKER_PORT: String(workerPort),
    CONTINUUM_WORKER_CONTROLLER_URL: `ws://127.0.0.1:${workerPort}`,
    CONTINUUM_PAGES_PHYSICAL_PAGES: String(PAGES),
    CONTINUUM_PAGES_CHUNK_TOKENS: "128",
    CONTINUUM_WORKER_THREADS: "1",
    CONTINUUM_WORKER_HEARTBEAT_INTERVAL_MS: "1000",
    CONTINUUM_CONTROLLER_HEARTBEAT_TTL_MS: "5000",
    CONTINUUM_CONTROLLER_RESIDENT_FRESH_MS: "5000",
    CONTINUUM_CONTROLLER_OFFER_TIMEOUT_MS: "1500",
    CONTINUUM_CONTROLLER_PROGRESS_TIMEOUT_MS: "30000",
    CONTINUUM_LOG_LEVEL: "info",
  };
  writer = new RoleProcess("writer", ["writer"], env);
  // The controller generates the model under the shared data dir before the workers load it.
  controller = new RoleProcess("controller", ["controller"], env);
  const ready = await controller.waitFor("controller.ready", {}, 90_000);
  fingerprint = ready.fingerprint as ModelFingerprint;
  startWorker(0);
  startWorker(1);
  await controller.waitFor("hub.worker_connected", { workerId: "worker-0" }, 90_000);
  await controller.waitFor("hub.worker_connected", { workerId: "worker-1" }, 90_000);
  await writer.waitFor("writer.active", {}, 60_000);
  client = new OpenAI({ baseURL: `${httpUrl}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
}, 180_000);

afterAll(async () => {
  for (const w of workers.values()) {
    if (!w.exited) process.kill(w.pid, "SIGCONT");
    await w.stop();
  }
  await controller?.stop();
  await writer?.stop();
  await stopBroker?.();
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

describe("a controller and two worker processes", () => {
  it("routes a request with a long prefix to the worker holding it resident, over another worker's shorter durable prefix, and records the decision", async () => {
    const prefix = tokens(1800, 1);
    const a = await client.completions.create({
      model: "tiny",
      prompt: [...prefix, 11, 12, 13],
      max_tokens: 4,
      temperature: 0,
    });
    const holder = (await completedOn(a.id)).workerId;
    const other = otherWorker(holder);

    // A durable copy of the first 1024 tokens on the other worker's SSD, as catalog facts.
    // The holder checkpoints the prefix it computed, so those chunks are (or
    // soon will be) published with their real content: the same publication is
    // a no-op, and a different content id would be rejected.
    const b = [...prefix, 21, 22, 23, 24];
    const nodes = prefixChain(b.slice(0, -1), 128).slice(0, 8);
    const ops: CatalogOp[] = [];
    for (const n of nodes) {
      const node = planChain(fingerprint, b, 128)[n.start / 128]!.nodeId;
      const [[content, bytes]] = (await catalogUntil(
        `[:find ?c ?b :where [?e :chunk/node "${node}"] [?e :chunk/content ?c] [?e :chunk/bytes ?b]]`,
        (r) => r.length === 1,
        60_000,
      )) as [[string, number]];
      ops.push({
        op: "chunk.published",
        node,
        prefix: n.hash,
        parent: n.start === 0 ? chainRoot() : n.parent,
        model: fingerprint,
        start: n.start,
        tokens: n.count,
        content,
        bytes,
        layout: KV_LAYOUT,
        created: Date.now(),
      });
      ops.push({
        op: "replica.ready",
        node: planChain(fingerprint, b, 128)[n.start / 128]!.nodeId,
        worker: other,
        tier: "ssd",
        verifiedAt: Date.now(),
      });
    }
    const log = await KafkaLog.open({
      brokers: [brokers],
      clientId: "fleet-test",
      topics: {
        proposals: env.CONTINUUM_CATALOG_TOPICS_PROPOSALS!,
        tx: env.CONTINUUM_CATALOG_TOPICS_TX!,
        rejections: env.CONTINUUM_CATALOG_TOPICS_REJECTIONS!,
      },
    });
    try {
      await log.propose(
        encodeMessage(ProposalMsg, { id: `fleet-test/${Date.now()}`, clientId: "fleet-test", ops }),
      );
    } finally {
      await log.close();
    }
    await catalogUntil(
      `[:find (count ?r) . :where [?r :replica/tier "ssd"] [?r :replica/worker ?w] [?w :worker/id "${other}"]]`,
      (rows) => Number(rows) === 8,
    );

    const second = await client.completions.create({
      model: "tiny",
      prompt: b,
      max_tokens: 4,
      temperature: 0,
    });
    expect(await completedOn(second.id)).toEqual({ workerId: holder, attempt: 1 });
    const routed = await controller.waitFor("assignment.routed", { requestId: second.id });
    expect(routed.source).toBe("resident");
    expect(routed.cachedTokens).toBe(1792);

    // The decision record: candidates (with the other worker's durable one), choice, prediction, measurement.
    const rows = (await catalogUntil(
      `[:find ?c ?s ?w ?p ?m :where [?d :decision/request "${second.id}"] [?d :decision/candidates ?c] [?d :decision/source ?s] [?d :decision/worker ?we] [?we :worker/id ?w] [?d :decision/predicted-ttft-ms ?p] [?d :decision/measured-ttft-ms ?m]]`,
      (r) => r.length === 1,
    )) as [string, string, string, number, number][];
    const [candidates, source, worker, predicted, measured] = rows[0]!;
    expect(source).toBe("resident");
    expect(worker).toBe(holder);
    expect(predicted).toBeGreaterThan(0);
    expect(measured).toBeGreaterThan(0);
    const ranked = (
      JSON.parse(candidates) as { ranked: { workerId: string; source: string; cachedTokens: number }[] }
    ).ranked;
    expect(ranked[0]).toMatchObject({ workerId: holder, source: "resident", cachedTokens: 1792 });
    expect(ranked).toContainEqual(
      expect.objectContaining({ workerId: other, source: "ssd", cachedTokens: 1024 }),
    );
  });

  it("GET /workers (what `cluster status` prints) shows per worker pages free and resident, cache hits by tier and its catalog replica's offset and lag", async () => {
    // After the case above: the holder computed a 1800-token prefix, reused 1792 of it from resident pages and checkpointed it.
    const end = Number(await catalogQuery("[:find (count ?e) . :where [?e :chunk/node _]]"));
    expect(end).toBeGreaterThanOrEqual(14);
    // Heartbeats every second; each worker's replica applies the log and polls its end every 2 s.
    let fleet: FleetWorkerView[] = [];
    const deadline = Date.now() + 30_000;
    for (;;) {
      fleet = await fetchWorkers();
      const settled = fleet.every(
        (w) => w.status !== null && w.status.catalogLag === 0 && w.status.catalogOffset > 0,
      );
      if ((settled && fleet.length === 2) || Date.now() > deadline) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    expect(fleet.map((w) => [w.workerId, w.live])).toEqual([
      ["worker-0", true],
      ["worker-1", true],
    ]);
    const holder = fleet.find((w) => (w.status?.residentHitTokens ?? 0) >= 1792)!;
    expect(holder, JSON.stringify(fleet)).toBeDefined();
    const s = holder.status!;
    expect(s.totalPages).toBe(PAGES);
    expect(s.residentPages).toBeGreaterThan(0);
    expect(s.residentPages + holder.freePages!).toBeLessThanOrEqual(PAGES);
    expect(s.computedTokens).toBeGreaterThanOrEqual(1800);
    expect(s.publishedChunks).toBeGreaterThanOrEqual(14);
    // tiny: 2 layers × 2 kv heads × (16 + 16) dims × 2 bytes = 256 bytes of attention state per token.
    expect(s.publishedBytes).toBe(s.publishedChunks * 128 * 256);
    for (const w of fleet) {
      expect(w.status!.catalogLag).toBe(0);
      expect(w.status!.catalogOffset).toBeGreaterThan(0);
      expect(w.status!.restoredChunks).toEqual({ ram: 0, ssd: 0, peer: 0, s3: 0 });
    }
    // The text `continuum cluster status` prints from it.
    const lines = workerLines(fleet);
    expect(lines).toHaveLength(2);
    expect(lines.find((l) => l.startsWith(holder.workerId))).toMatch(
      new RegExp(
        `live  pages free ${holder.freePages} resident ${s.residentPages}/${PAGES}  hits: resident ${s.residentHitTokens} tok, restored chunks ram 0 ssd 0 peer 0 s3 0 .* catalog offset ${s.catalogOffset} lag 0`,
      ),
    );
  });

  it("serves the official openai client: completions, chat, streaming and n > 1", async () => {
    const c = await client.completions.create({
      model: "tiny",
      prompt: "The river ran",
      max_tokens: 6,
      temperature: 0,
    });
    const again = await client.completions.create({
      model: "tiny",
      prompt: "The river ran",
      max_tokens: 6,
      temperature: 0,
    });
    expect(c.choices).toHaveLength(1);
    expect(c.usage!.completion_tokens).toBeGreaterThan(0);
    expect(again.choices[0]!.text).toBe(c.choices[0]!.text);

    const messages = [{ role: "user" as const, content: "Tell me about the sea." }];
    const whole = await client.chat.completions.create({
      model: "tiny",
      messages,
      max_tokens: 8,
      temperature: 0,
    });
    const stream = await client.chat.completions.create({
      model: "tiny",
      messages,
      max_tokens: 8,
      temperature: 0,
      stream: true,
    });
    let streamed = "";
    let finish: string | null = null;
    for await (const chunk of stream) {
      streamed += chunk.choices[0]?.delta.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(streamed).toBe(whole.choices[0]!.message.content);
    expect(finish).toBe(whole.choices[0]!.finish_reason);

    const many = await client.completions.create({
      model: "tiny",
      prompt: "Once upon a time",
      max_tokens: 5,
      n: 3,
      temperature: 1,
      seed: 3,
    });
    expect(many.choices.map((x) => x.index).sort()).toEqual([0, 1, 2]);
  });

  let longPrompt: number[] = [];
  it("lets the worker's own admission override a stale heartbeat view: the worker declines, the controller moves on", async () => {
    // A prompt whose greedy continuation runs its full 640 tokens (no end-of-sequence),
    // so the first request holds its pages while the second is offered.
    let holder = "";
    for (let seed = 100; seed < 110 && holder === ""; seed++) {
      const q = tokens(1400, seed);
      const r = await client.completions.create({
        model: "tiny",
        prompt: q,
        max_tokens: 640,
        temperature: 0,
      });
      if (r.choices[0]!.finish_reason === "length") {
        longPrompt = q;
        holder = (await completedOn(r.id)).workerId;
      }
    }
    expect(holder).not.toBe("");
    // Both go to the holder (its resident prefix); the view still shows the pages free,
    // but the holder's admission has reserved them for whichever it accepted first.
    const [r1, r2] = await Promise.all([
      client.completions.create({ model: "tiny", prompt: longPrompt, max_tokens: 640, temperature: 0 }),
      client.completions.create({ model: "tiny", prompt: longPrompt, max_tokens: 640, temperature: 0 }),
    ]);
    expect(r1.choices[0]!.text).toBe(r2.choices[0]!.text);
    const declines = [r1.id, r2.id].flatMap((id) =>
      controller.events("assignment.declined", { requestId: id }),
    );
    expect(declines).toHaveLength(1);
    expect(declines[0]).toMatchObject({ workerId: holder, attempt: 1, reason: "pages_short" });
    const declinedId = declines[0]!.requestId as string;
    expect(await completedOn(declinedId)).toEqual({ workerId: otherWorker(holder), attempt: 2 });
    const keptId = declinedId === r1.id ? r2.id : r1.id;
    expect(await completedOn(keptId)).toEqual({ workerId: holder, attempt: 1 });
  });

  it("falls back when an offer times out, and fences the late accept of the old attempt", async () => {
    const prefix = tokens(600, 7);
    const computedBefore = await computedByWorker();
    const warm = await client.completions.create({ model: "tiny", prompt: [...prefix, 1], max_tokens: 1 });
    const stuckId = (await completedOn(warm.id)).workerId;
    const stuck = workers.get(stuckId)!;
    // The premise: the controller has heard, in a heartbeat sent after the warm prefill, that
    // the prefix is resident on stuckId, so it offers the next request there first. Under load a
    // heartbeat can lag the completion; stopping the worker before it arrives would leave the
    // controller blind to the prefix and free to pick either worker.
    const deadline = Date.now() + 20_000;
    while (((await computedByWorker()).get(stuckId) ?? 0) <= (computedBefore.get(stuckId) ?? 0)) {
      if (Date.now() > deadline) throw new Error(`no heartbeat from ${stuckId} after the warm request`);
      await new Promise((r) => setTimeout(r, 50));
    }
    process.kill(stuck.pid, "SIGSTOP");
    let r: OpenAI.Completion;
    try {
      r = await client.completions.create({ model: "tiny", prompt: [...prefix, 2, 3], max_tokens: 4 });
    } finally {
      process.kill(stuck.pid, "SIGCONT");
    }
    expect(await completedOn(r.id)).toEqual({ workerId: otherWorker(stuckId), attempt: 2 });
    expect(controller.events("assignment.timeout", { requestId: r.id })).toEqual([
      expect.objectContaining({ attempt: 1, workerId: stuckId, phase: "offered" }),
    ]);
    // Resumed, the stuck worker accepts attempt 1; the controller ignores it and cancels it.
    await controller.waitFor("assignment.late_ignored", { requestId: r.id, workerId: stuckId, attempt: 1 });
    await stuck.waitFor("agent.cancelled", { requestId: r.id, attempt: 1 });
  });

  it("closes unauthenticated connections and malformed or oversized frames, changing nothing", async () => {
    const url = `ws://127.0.0.1:${workerPort}`;
    const refused = (headers: Record<string, string>) =>
      new Promise<number>((resolve, reject) => {
        const ws = new WebSocket(url, { headers });
        ws.on("unexpected-response", (_req, res) => resolve(res.statusCode ?? 0));
        ws.on("open", () => reject(new Error("an unauthenticated connection was accepted")));
        ws.on("error", () => undefined);
      });
    expect(await refused({})).toBe(401);
    expect(await refused({ authorization: "Bearer wrong" })).toBe(401);

    const closedWith = (send: (ws: WebSocket) => void) =>
      new Promise<number>((resolve, reject) => {
        const ws = new WebSocket(url, { headers: { authorization: `Bearer ${SECRET}` } });
        ws.on("open", () => send(ws));
        ws.on("close", (code) => resolve(code));
        ws.on("error", () => undefined);
        ws.on("unexpected-response", () => reject(new Error("authenticated upgrade refused")));
      });
    expect(await closedWith((ws) => ws.send(Buffer.from("not msgpack at all \xc1")))).toBe(1007);
    expect(await closedWith((ws) => ws.send("a text frame"))).toBe(1007);
    expect(await closedWith((ws) => ws.send(Buffer.alloc(2 << 20)))).toBe(1009);
    // A well-formed envelope whose heartbeat breaks its schema (negative epoch).
    const bad = encodeMessage(HeartbeatMessage, { workerId: "rogue", epoch: -1 } as never);
    expect(await closedWith((ws) => ws.send(bad))).toBe(1007);
    expect(controller.events("hub.worker_connected", { workerId: "rogue" })).toEqual([]);

    // The fleet still serves, on both workers.
    const r = await client.completions.create({ model: "tiny", prompt: "still here", max_tokens: 2 });
    expect(r.choices).toHaveLength(1);
    expect(controller.events("hub.worker_lost")).toEqual([]);
  });

  it("fails a request clearly when its worker is killed mid-stream; the dead worker's heartbeats expire", async () => {
    expect(longPrompt.length).toBe(1400);
    const stream = await client.completions.create({
      model: "tiny",
      prompt: longPrompt,
      max_tokens: 640,
      temperature: 0,
      stream: true,
    });
    let id = "";
    let received = 0;
    let finish: string | null = null;
    let error: Error | null = null;
    try {
      for await (const chunk of stream) {
        if (id === "") {
          id = chunk.id;
          const offered = await controller.waitFor("assignment.offered", { requestId: id });
          await workers.get(offered.workerId as string)!.kill9();
        }
        received++;
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
    } catch (err) {
      error = err as Error;
    }
    expect(id).not.toBe("");
    // The stream is cut short: no choice finishes, and the front door's stream error names the loss.
    expect(finish).toBeNull();
    expect(error?.message).toMatch(/lost_mid_stream/);
    const failed = await controller.waitFor("assignment.failed", { requestId: id });
    const dead = failed.workerId as string;
    expect(failed.reason).toBe("lost_mid_stream");
    expect(received).toBeLessThan(640);
    await controller.waitFor("hub.worker_lost", { workerId: dead });

    // The next request goes to the survivor; the dead worker is offline in the router's eyes.
    const r = await client.completions.create({
      model: "tiny",
      prompt: longPrompt,
      max_tokens: 2,
      temperature: 0,
    });
    expect(await completedOn(r.id)).toEqual({ workerId: otherWorker(dead), attempt: 1 });
    const routed = await controller.waitFor("assignment.routed", { requestId: r.id });
    expect(routed.dropped).toContain(`${dead}:recompute:offline`);
  });

  it("re-routes a request whose worker dies before its first token; a restarted worker rejoins", async () => {
    const dead = [...workers.entries()].find(([, w]) => w.exited)![0];
    const joinedFrom = controller.mark();
    const restarted = startWorker(Number(dead.slice("worker-".length)));
    await controller.waitFor("hub.worker_connected", { workerId: dead }, 90_000, joinedFrom);
    expect(controller.events("hub.worker_connected", { workerId: dead })).toHaveLength(2);
    expect(restarted.exited).toBe(false);

    const prefix = tokens(700, 11);
    const warm = await client.completions.create({ model: "tiny", prompt: [...prefix, 1], max_tokens: 1 });
    const victimId = (await completedOn(warm.id)).workerId;
    const victim = workers.get(victimId)!;
    // Stopped, the victim can produce no token; killed once offered, it drops the connection mid-attempt.
    process.kill(victim.pid, "SIGSTOP");
    const before = controller.mark();
    const pending = client.completions.create({ model: "tiny", prompt: [...prefix, 2], max_tokens: 3 });
    const offered = await controller.waitFor(
      "assignment.offered",
      { workerId: victimId, attempt: 1, sent: true },
      30_000,
      before,
    );
    await victim.kill9();
    const r = await pending;
    expect(r.id).toBe(offered.requestId);
    expect(await completedOn(r.id)).toEqual({ workerId: otherWorker(victimId), attempt: 2 });
    await controller.waitFor("hub.worker_lost", { workerId: victimId }, 30_000, before);
  });

  it("stops on Ctrl-C, releasing its sockets: worker, controller and writer exit 0", async () => {
    const survivor = [...workers.values()].find((w) => !w.exited)!;
    const survivorId = [...workers.entries()].find(([, w]) => w === survivor)![0];
    const from = controller.mark();
    expect(await survivor.stop()).toBe(0);
    const lostLine = await controller.waitFor("hub.worker_lost", { workerId: survivorId }, 30_000, from);
    expect(lostLine.reason).toMatch(/1001/);
    expect(await controller.stop()).toBe(0);
    expect(await writer.stop()).toBe(0);
    // Both of the controller's ports are free again.
    for (const port of [workerPort, Number(new URL(httpUrl).port)]) {
      await new Promise<void>((resolve, reject) => {
        const s = createServer();
        s.once("error", reject);
        s.listen(port, "127.0.0.1", () => s.close(() => resolve()));
      });
    }
  });
});
