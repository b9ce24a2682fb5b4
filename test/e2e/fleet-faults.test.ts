import { execFile } from "node:child_process";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import OpenAI from "openai";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { runQuery } from "../../catalog/console.ts";
import { KafkaLog } from "../../catalog/kafka/log.ts";
import { Replica } from "../../catalog/replica.ts";
import { planChain } from "../../controller/candidates.ts";
import {
  alive,
  type ClusterProcess,
  type ClusterState,
  clusterDown,
  clusterStatus,
  clusterUp,
  logEvents,
  parseMetrics,
  spawnRole,
  stopProcess,
  tail,
  waitForLog,
} from "../../deploy/cluster.ts";
import { ProposalMsg, TxMsg } from "../../schema/catalog.ts";
import type { Config } from "../../schema/config.ts";
import { resolveConfig } from "../../schema/config-load.ts";
import { contentId } from "../../schema/identity.ts";
import type { ModelFingerprint } from "../../schema/ids.ts";
import { decodeMessage, encodeMessage } from "../../schema/wire.ts";
import { S3Tier } from "../../worker/store/s3.ts";
import { collect, leaseProposal } from "../catalog/log-helpers.ts";
import { freePort, freePortPair } from "../ports.ts";
import { tokens } from "./fleet-process.ts";

/**
 * Faults on a whole fleet brought up by `continuum cluster up`'s own code
 * (deploy/cluster.ts): its Kafka broker and S3 server, two catalog writers,
 * the controller and two workers, all separate processes. Each case kills or
 * restarts a real process and ends by comparing the catalog against S3:
 * every ready S3 replica's object exists and its bytes hash to its content id.
 *
 * Sizes (tiny model: context 2048, pages of 16 tokens, chunks of 128): 140
 * pages per worker hold one 1400 + 640 token request.
 */

const exec = promisify(execFile);
const ROOT = new URL("../../", import.meta.url).pathname;
let dir: string;
let state: ClusterState;
/** The live process list (a restarted controller replaces its entry). */
let procs: ClusterProcess[];
let config: Config;
let fingerprint: ModelFingerprint;
let client: OpenAI;
const progress: string[] = [];

function proc(name: string): ClusterProcess {
  return procs.find((p) => p.name === name)!;
}

/** The catalog nodes with a ready S3 replica. */
async function s3ReadyNodes(): Promise<Set<string>> {
  const rows = (await catalogQuery(
    '[:find ?n :where [?r :replica/tier "s3"] [?r :replica/state "ready"] [?r :replica/chunk ?c] [?c :chunk/node ?n]]',
  )) as [string][];
  return new Set(rows.map(([n]) => n));
}

/** How many of these catalog nodes have a ready S3 replica. */
async function s3ReadyOf(nodes: readonly string[]): Promise<number> {
  const ready = await s3ReadyNodes();
  return nodes.filter((n) => ready.has(n)).length;
}

function controller(): ClusterProcess {
  return proc("controller");
}

async function catalogQuery(query: string): Promise<unknown> {
  const r = await fetch(`${state.api}/v1/catalog/query`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ query }),
  });
  expect(r.status).toBe(200);
  return ((await r.json()) as { result: unknown }).result;
}

async function until<T>(what: string, f: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await f();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

async function metrics(): Promise<Record<string, number>> {
  return parseMetrics(await (await fetch(`${state.api}/metrics`)).text());
}

async function completedOn(requestId: string): Promise<string> {
  const line = await waitForLog(
    controller(),
    (l) => l.event === "assignment.completed" && l.requestId === requestId,
    `assignment.completed ${requestId}`,
    60_000,
  );
  return line.workerId as string;
}

/**
 * The catalog against S3: every ready S3 replica's object exists in the
 * bucket and its bytes and metadata hash to the chunk's content id.
 * Returns how many were checked.
 */
async function catalogMatchesS3(): Promise<number> {
  const rows = (await catalogQuery(
    '[:find ?c :where [?r :replica/tier "s3"] [?r :replica/state "ready"] [?r :replica/chunk ?e] [?e :chunk/content ?c]]',
  )) as [string][];
  const s = config.store.s3;
  const s3 = await S3Tier.open({
    endpoint: state.s3.endpoint,
    bucket: s.bucket,
    region: s.region,
    accessKeyId: s.accessKeyId,
    secretAccessKey: s.secretAccessKey,
    maxObjectBytes: config.store.dir.maxObjectBytes,
    multipartThresholdBytes: s.multipartThresholdBytes,
    partBytes: s.partBytes,
    partConcurrency: s.partConcurrency,
    maxAttempts: s.maxAttempts,
    retryBaseMs: s.retryBaseMs,
    requestTimeoutMs: s.requestTimeoutMs,
    createBucket: false,
  });
  try {
    for (const [cid] of rows) {
      const chunk = await s3.get(cid);
      expect(chunk, `S3 object ${cid}`).toBeDefined();
      expect(contentId(chunk!.bytes, chunk!.meta as unknown as Record<string, unknown>)).toBe(cid);
    }
  } finally {
    await s3.close();
  }
  return rows.length;
}

/** Lines of each process log printed when a case fails (CI keeps no files, so the output is the post-mortem). */
const FAILURE_LOG_LINES = 60;
/** Characters kept of one printed log line. */
const FAILURE_LINE_CHARS = 400;

/** Prints the tail of every process log of the cluster (and its progress lines) to stderr. */
async function printLogs(why: string): Promise<void> {
  const logs = join(dir, "logs");
  const out = [`== fleet-faults: ${why}; progress:`, ...progress.slice(-20)];
  for (const f of (await readdir(logs).catch(() => [] as string[])).sort()) {
    out.push(`== ${f} (last ${FAILURE_LOG_LINES} lines)`);
    for (const l of tail(join(logs, f), FAILURE_LOG_LINES).split("\n"))
      out.push(l.slice(0, FAILURE_LINE_CHARS));
  }
  process.stderr.write(`${out.join("\n")}\n`);
}

beforeEach(({ onTestFailed }) => {
  onTestFailed(({ task }) => printLogs(`"${task.name}" failed`));
});

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "continuum-fault-"));
  // The roles inherit this environment; the tests read their info-level events.
  // Debug events too (checkpoint decisions among them: a few hundred lines a run), for printLogs;
  // CONTINUUM_FAULT_LOG_LEVEL=info leaves them out.
  process.env.CONTINUUM_LOG_LEVEL = process.env.CONTINUUM_FAULT_LOG_LEVEL ?? "debug";
  const base = resolveConfig({}, {});
  const peerBase = await freePortPair();
  config = {
    ...base,
    pages: { ...base.pages, physicalPages: 140, chunkTokens: 128 },
    controller: {
      ...base.controller,
      httpPort: await freePort(),
      workerPort: await freePort(),
      heartbeatTtlMs: 5_000,
      residentFreshMs: 5_000,
      offerTimeoutMs: 1_500,
      progressTimeoutMs: 30_000,
    },
    // No peer transfer: S3 is the only tier the workers share, so a request for the
    // holder's prefix is cheapest where it is resident by the S3 fetch, which is
    // more than the two workers' calibrations differ by under load. With peers on,
    // a non-holder fetching the same chunks from the holder's RAM could look cheaper.
    worker: {
      ...base.worker,
      peerPortBase: peerBase,
      peerTransfer: false,
      // The tiny model recomputes a 128-token chunk (~5 ms) about as fast as S3Proxy
      // answers one GET of it, so with the tiers' costs probed at warm start the router
      // and the worker may (rightly) recompute the dead worker's prefix. These cases are
      // about its S3 copy restoring bit-exact: the workers keep a configured S3 cost, a
      // third of the default, under which 10 chunks from S3 (10 ms) are clearly cheaper
      // than recomputing them, and still dearer than a prefix already resident.
      probeCosts: false,
      restorePriorMsPerByte: { ...base.worker.restorePriorMsPerByte, s3: 3e-5 },
      threads: 1,
      heartbeatIntervalMs: 1_000,
    },
  };
  try {
    state = await clusterUp({
      dir,
      workers: 2,
      config,
      kafkaPort: await freePortPair(),
      s3Port: await freePort(),
      readyTimeoutMs: 150_000,
      progress: (l) => progress.push(l),
    });
  } catch (err) {
    await printLogs(`cluster up failed: ${(err as Error).message}`);
    throw err;
  }
  procs = [...state.processes];
  const ready = logEvents(state.processes.find((p) => p.role === "controller")!.log).find(
    (l) => l.event === "controller.ready",
  );
  fingerprint = ready!.fingerprint as ModelFingerprint;
  client = new OpenAI({ baseURL: `${state.api}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
}, 300_000);

afterAll(async () => {
  if (state) await clusterDown({ ...state, processes: procs }, () => undefined);
  // CONTINUUM_KEEP_FAULT_LOGS=1 keeps the cluster's logs and data for a post-mortem.
  if (dir && !process.env.CONTINUUM_KEEP_FAULT_LOGS) await rm(dir, { recursive: true, force: true });
}, 120_000);

describe("fleet faults (cluster up: real Kafka, real S3, real processes)", () => {
  it("cluster up reports every process alive, the services running and both workers connected", async () => {
    const s = await clusterStatus(state);
    expect(s.kafka).toBe(true);
    expect(s.s3).toBe(true);
    expect(s.controllerHealthy).toBe(true);
    expect(s.processes.map((p) => [p.name, p.alive])).toEqual([
      ["writer-a", true],
      ["writer-b", true],
      ["controller", true],
      ["worker-0", true],
      ["worker-1", true],
    ]);
    expect(s.workers).toEqual({ "worker-0": "connected", "worker-1": "connected" });
    expect(s.metrics.continuum_pages_capacity).toBe(280);
    // Per worker, from its heartbeats through the controller: pages, hits by tier, its catalog replica.
    expect(s.fleet.map((w) => [w.workerId, w.live, w.status?.totalPages])).toEqual([
      ["worker-0", true, 140],
      ["worker-1", true, 140],
    ]);
    for (const w of s.fleet) {
      expect(w.freePages).toBe(140);
      expect(w.status!.residentPages).toBe(0);
      expect(w.status!.restoredChunks).toEqual({ ram: 0, ssd: 0, peer: 0, s3: 0 });
      expect(w.status!.catalogOffset).toBeGreaterThan(0);
    }
  });

  it("kill -9 of a worker mid-decode: the stream fails naming the loss, the worker is dropped, and its S3 chunks restore bit-exact on the survivor", async () => {
    const prefix = tokens(1400, 7);
    const prompt = [...prefix, 11, 12, 13];
    // Reference: the prompt computed once (greedy), then checkpointed by its worker.
    const ref = await client.completions.create({ model: "tiny", prompt, max_tokens: 8, temperature: 0 });
    const holder = await completedOn(ref.id);
    const survivor = holder === "worker-0" ? "worker-1" : "worker-0";
    // 1403 prompt tokens + 8 generated hold 10 full chunks of 128; each lands in S3 (write-behind).
    const inS3 = await until("the holder's chunks ready in S3", async () => {
      const n = Number(
        await catalogQuery(
          `[:find (count ?r) . :where [?r :replica/tier "s3"] [?r :replica/state "ready"] [?r :replica/worker ?w] [?w :worker/id "${holder}"]]`,
        ),
      );
      return n >= 10 ? n : undefined;
    });
    expect(inS3).toBeGreaterThanOrEqual(10);

    // The router must see the prefix resident on the holder before the next
    // request: wait for a heartbeat that carries its cached pages (until then
    // both workers look alike and the tie goes by worker id).
    await until("the holder's heartbeat showing its resident prefix", async () => {
      const w = (await clusterStatus(state)).fleet.find((f) => f.workerId === holder);
      return (w?.status?.residentPages ?? 0) >= 80 ? true : undefined;
    });
    // Mid-decode: the same prefix (resident on the holder), 640 tokens to generate.
    const stream = await client.completions.create({
      model: "tiny",
      prompt: [...prefix, 21, 22],
      max_tokens: 640,
      temperature: 0,
      stream: true,
    });
    let id = "";
    let victim = "";
    let received = 0;
    let finish: string | null = null;
    let error: Error | null = null;
    try {
      for await (const chunk of stream) {
        if (id === "") {
          id = chunk.id;
          const offered = await waitForLog(
            controller(),
            (l) => l.event === "assignment.offered" && l.requestId === id,
            "assignment.offered",
            30_000,
          );
          victim = offered.workerId as string;
          process.kill(proc(victim).pid, "SIGKILL");
        }
        received++;
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
    } catch (err) {
      error = err as Error;
    }
    expect(victim).toBe(holder);
    expect(finish).toBeNull();
    expect(received).toBeLessThan(640);
    expect(error?.message).toMatch(/lost_mid_stream/);
    await waitForLog(
      controller(),
      (l) => l.event === "hub.worker_lost" && l.workerId === victim,
      "hub.worker_lost",
      30_000,
    );
    const s = await clusterStatus({ ...state, processes: procs });
    expect(s.processes.find((p) => p.name === victim)!.alive).toBe(false);
    expect(s.workers[victim]).toMatch(/^lost/);

    // The survivor serves the reference prompt from the dead worker's S3 chunks: same tokens, bit-exact.
    const copied = `[:find (count ?r) . :where [?h :worker/id "${holder}"] [?hr :replica/worker ?h] [?hr :replica/tier "s3"] [?hr :replica/chunk ?c] [?s :worker/id "${survivor}"] [?r :replica/worker ?s] [?r :replica/chunk ?c] [?r :replica/state "ready"]]`;
    expect(Number(await catalogQuery(copied))).toBe(0);
    const again = await client.completions.create({ model: "tiny", prompt, max_tokens: 8, temperature: 0 });
    expect(await completedOn(again.id)).toBe(survivor);
    expect(again.choices[0]!.text).toBe(ref.choices[0]!.text);
    const routed = await waitForLog(
      controller(),
      (l) => l.event === "assignment.routed" && l.requestId === again.id,
      "assignment.routed",
      30_000,
    );
    // A durable restore from S3 (the only copy left), not a recompute.
    expect(routed.source).toBe("s3");
    expect(routed.cachedTokens as number).toBeGreaterThanOrEqual(1280);
    // The chunks restored from S3 are kept locally by the survivor, as catalog replicas of its own.
    const kept = await until("the survivor's local copies of the S3 chunks", async () => {
      const n = Number(await catalogQuery(copied));
      return n >= 10 ? n : undefined;
    });
    expect(kept).toBeGreaterThanOrEqual(10);
    // `cluster status` shows the survivor's restore by tier (its next heartbeat carries it).
    const restored = await until("the survivor's status showing its S3 restore", async () => {
      const w = (await clusterStatus({ ...state, processes: procs })).fleet.find(
        (f) => f.workerId === survivor,
      );
      return w?.status && w.status.restoredChunks.s3 >= 10 ? w.status : undefined;
    });
    expect(restored.restoredBytes.s3).toBeGreaterThan(0);
    expect(restored.residentPages).toBeGreaterThan(0);

    expect(await catalogMatchesS3()).toBeGreaterThanOrEqual(10);
  }, 180_000);

  it("kill -9 of the active writer: the standby takes over, every acknowledged proposal is in catalog.tx exactly once, replicas converge", async () => {
    const writers = [proc("writer-a"), proc("writer-b")];
    const active = writers.find((w) =>
      logEvents(w.log)
        .slice(w.logFrom)
        .some((l) => l.event === "writer.active"),
    )!;
    const standby = writers.find((w) => w !== active)!;
    expect(active).toBeDefined();
    const mark = logEvents(standby.log).length;
    const log = await KafkaLog.open({
      brokers: [state.kafka.brokers],
      clientId: "fault-test",
      topics: config.catalog.topics,
    });
    try {
      const acked = new Set<string>();
      const run = Date.now().toString(36);
      const wave = async (from: number, n: number) =>
        Promise.all(
          Array.from({ length: n }, async (_, j) => {
            const pid = `fault-${run}-${from + j}`;
            await log.propose(encodeMessage(ProposalMsg, leaseProposal(pid, `fault-${run}-${from + j}`)));
            acked.add(pid);
          }),
        );
      await wave(0, 100);
      process.kill(active.pid, "SIGKILL");
      // Proposals acknowledged by Kafka while no writer is active, and a request served meanwhile.
      const [, served] = await Promise.all([
        wave(100, 100),
        client.completions.create({ model: "tiny", prompt: "during failover", max_tokens: 2 }),
      ]);
      expect(served.choices).toHaveLength(1);
      await waitForLog(standby, (l) => l.event === "writer.active", "writer.active", 90_000, mark);

      const end = await until("every acknowledged proposal committed", async () => {
        const e = await log.endOffset();
        const txs = (await collect(log, 0, e)).map((r) => decodeMessage(TxMsg, r.bytes));
        const ids = new Set(txs.map((t) => t.proposalId));
        return [...acked].every((a) => ids.has(a)) ? e : undefined;
      });
      const txs = (await collect(log, 0, end)).map((r) => decodeMessage(TxMsg, r.bytes));
      expect(txs.map((t) => t.txNo)).toEqual(Array.from({ length: txs.length }, (_, i) => i + 1));
      const ids = txs.map((t) => t.proposalId);
      expect(new Set(ids).size).toBe(ids.length);
      for (const a of acked) expect(ids.filter((i) => i === a)).toHaveLength(1);

      // Convergence: the controller's replica and a fresh one read to the end agree.
      await until("controller catalog lag 0", async () =>
        (await metrics()).continuum_catalog_lag === 0 ? true : undefined,
      );
      const fresh = await Replica.start({ log, warn: () => undefined });
      try {
        await fresh.waitFor(end, 30_000);
        for (let i = 0; i < 200; i++)
          expect(fresh.catalog.eidOf("lease/key", `fault-${run}-${i}`), `lease ${i}`).toBeDefined();
        for (const q of [
          "[:find (count ?l) . :where [?l :lease/key _]]",
          "[:find (count ?c) . :where [?c :chunk/node _]]",
          "[:find (count ?r) . :where [?r :replica/state _]]",
        ])
          expect(Number(await catalogQuery(q)), q).toBe(Number(runQuery(fresh.datalog(), q)));
      } finally {
        await fresh.stop();
      }
    } finally {
      await log.close();
    }
    expect(await catalogMatchesS3()).toBeGreaterThanOrEqual(10);
  }, 180_000);

  it("restart of the controller: the live worker reconnects and new requests are served", async () => {
    const old = controller();
    expect(await stopProcess(old.pid, 15_000)).toBe("stopped");
    const mark = logEvents(old.log).length;
    const fresh = spawnRole("controller", "controller", state.configPath, join(dir, "logs"), {});
    procs = procs.map((p) => (p.name === "controller" ? fresh : p));
    await waitForLog(fresh, (l) => l.event === "controller.ready", "controller.ready", 90_000, mark);
    const live = procs.filter((p) => p.role === "worker" && logEvents(p.log).length > 0);
    const alive = live.filter((p) => {
      try {
        process.kill(p.pid, 0);
        return true;
      } catch {
        return false;
      }
    });
    expect(alive).toHaveLength(1);
    for (const w of alive)
      await waitForLog(
        fresh,
        (l) => l.event === "hub.worker_connected" && l.workerId === w.name,
        `hub.worker_connected ${w.name}`,
        60_000,
        mark,
      );
    const r = await client.completions.create({ model: "tiny", prompt: "after restart", max_tokens: 3 });
    expect(r.choices).toHaveLength(1);
    expect(await completedOn(r.id)).toBe(alive[0]!.name);
    expect(await catalogMatchesS3()).toBeGreaterThanOrEqual(10);
  }, 180_000);

  it("restart of the broker: writer, controller and worker reconnect; nothing committed is lost, new proposals land, requests are served", async () => {
    const log = await KafkaLog.open({
      brokers: [state.kafka.brokers],
      clientId: "fault-broker",
      topics: config.catalog.topics,
    });
    const run = `broker-${Date.now().toString(36)}`;
    let before: string[];
    try {
      await log.propose(encodeMessage(ProposalMsg, leaseProposal(`${run}-a`, `${run}-a`)));
      await until("the proposal before the restart committed", async () =>
        Number(await catalogQuery(`[:find (count ?l) . :where [?l :lease/key "${run}-a"]]`)) === 1
          ? true
          : undefined,
      );
      const end = await log.endOffset();
      before = (await collect(log, 0, end)).map((r) => decodeMessage(TxMsg, r.bytes).proposalId);
    } finally {
      await log.close();
    }
    const s3Ready = '[:find (count ?r) . :where [?r :replica/tier "s3"] [?r :replica/state "ready"]]';
    const readyBefore = Number(await catalogQuery(s3Ready));

    await exec("bash", ["deploy/kafka.sh", "stop", "--dir", state.kafka.dir], { cwd: ROOT, timeout: 90_000 });
    await exec(
      "bash",
      ["deploy/kafka.sh", "start", "--port", String(state.kafka.port), "--dir", state.kafka.dir],
      {
        cwd: ROOT,
        timeout: 180_000,
      },
    );

    const after = await KafkaLog.open({
      brokers: [state.kafka.brokers],
      clientId: "fault-broker-2",
      topics: config.catalog.topics,
    });
    try {
      // The writer still commits: a proposal made after the restart reaches the controller's replica.
      await after.propose(encodeMessage(ProposalMsg, leaseProposal(`${run}-b`, `${run}-b`)));
      await until(
        "the proposal after the restart committed and applied by the controller",
        async () =>
          Number(await catalogQuery(`[:find (count ?l) . :where [?l :lease/key "${run}-b"]]`)) === 1
            ? true
            : undefined,
        120_000,
      );
      const end = await after.endOffset();
      const ids = (await collect(after, 0, end)).map((r) => decodeMessage(TxMsg, r.bytes).proposalId);
      expect(ids.slice(0, before.length)).toEqual(before);
      expect(ids.filter((i) => i === `${run}-b`)).toHaveLength(1);
    } finally {
      await after.close();
    }
    // Nothing exited over the outage: the controller and the writer that took over in the previous case.
    expect(alive(controller().pid)).toBe(true);
    expect(procs.filter((p) => p.role === "writer" && alive(p.pid))).toHaveLength(1);
    // The worker serves again after the outage (its agent, engine and catalog link survived it).
    const r = await client.completions.create({
      model: "tiny",
      prompt: tokens(600, 31),
      max_tokens: 2,
      temperature: 0,
    });
    expect(r.choices).toHaveLength(1);
    expect(await catalogMatchesS3()).toBeGreaterThanOrEqual(readyBefore);
  }, 300_000);

  it("stopped S3: requests still complete, nothing that did not reach S3 is marked ready there, and writes resume when it returns", async () => {
    const s3Ready = '[:find (count ?r) . :where [?r :replica/tier "s3"] [?r :replica/state "ready"]]';
    const readyBefore = Number(await catalogQuery(s3Ready));
    await exec("bash", ["deploy/s3proxy.sh", "stop", "--port", String(state.s3.port)], {
      cwd: ROOT,
      timeout: 60_000,
    });
    // A prefix computed while S3 is down (its checkpoint cannot become durable in S3), then a reuse of it.
    const prompt = tokens(600, 41);
    for (let i = 0; i < 2; i++) {
      const r = await client.completions.create({ model: "tiny", prompt, max_tokens: 2, temperature: 0 });
      expect(r.choices).toHaveLength(1);
    }
    // Nothing of the outage's prefix is ready in S3: its upload never succeeded.
    const outageNodes = planChain(fingerprint, prompt, config.pages.chunkTokens).map((b) => b.nodeId);
    expect(await s3ReadyOf(outageNodes)).toBe(0);
    await exec(
      "bash",
      ["deploy/s3proxy.sh", "start", "--port", String(state.s3.port), "--data", state.s3.data],
      {
        cwd: ROOT,
        timeout: 120_000,
      },
    );
    // Writes resume. A worker captures a new prefix when its admission expects
    // the capture to pay, and else, after at most 8 declines in a row, as a
    // probe that re-measures the cost (worker/checkpoint/admission.ts). Its
    // captures run one at a time, so a probe may wait behind another capture's
    // upload retries. So new prefixes keep coming, one at a time, until one is
    // whole in S3 (each of its 4 chunks of 128 uploaded to the returned S3 and
    // published as ready there), for at most RESUME_MS.
    const RESUME_MS = 180_000;
    const fresh: string[][] = [];
    const wholeInS3 = async () => {
      const ready = await s3ReadyNodes();
      const whole = fresh.filter((nodes) => nodes.every((n) => ready.has(n))).length;
      return whole > 0 ? whole * 4 : undefined;
    };
    const deadline = Date.now() + RESUME_MS;
    let resumed: number | undefined;
    for (let i = 0; resumed === undefined; i++) {
      if (Date.now() > deadline)
        throw new Error(`${i} prefixes computed since S3 returned, none whole in S3 after ${RESUME_MS} ms`);
      const p = tokens(600, 100 + i);
      const r = await client.completions.create({ model: "tiny", prompt: p, max_tokens: 2, temperature: 0 });
      expect(r.choices).toHaveLength(1);
      const nodes = planChain(fingerprint, p, config.pages.chunkTokens).map((b) => b.nodeId);
      expect(nodes).toHaveLength(4);
      fresh.push(nodes);
      await new Promise((r) => setTimeout(r, 250));
      resumed = await wholeInS3();
    }
    // Every S3 replica the catalog calls ready, including any proposed during the outage, is in S3 and verifies.
    expect(await catalogMatchesS3()).toBeGreaterThanOrEqual(readyBefore + resumed);
  }, 300_000);
});
