import { randomUUID } from "node:crypto";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import type { FleetWorkerView } from "../../controller/api/service.ts";
import { sleep } from "../../schema/abort.ts";
import type { Config } from "../../schema/config.ts";
import { resolveConfig } from "../../schema/config-load.ts";
import {
  alive,
  type ClusterProcess,
  type ClusterState,
  clusterDown,
  clusterUp,
  logEvents,
  spawnRole,
  tail,
  waitForLog,
} from "../cluster.ts";
import { PausableRelay } from "../relay.ts";
import { type SmallFs, smallFs } from "../small-fs.ts";
import { call } from "./client.ts";
import {
  acknowledgedNodes,
  catalogVerdicts,
  fullPoolRequest,
  missingPublications,
  readCatalog,
  replicaVerdicts,
  type Verdict,
} from "./invariants.ts";
import type { FaultKind } from "./plan.ts";
import type { ChaosTarget } from "./target.ts";

/**
 * The local fleet under chaos: `cluster up`'s own code (two writers, the
 * controller, two workers, each its own process) on a running Kafka broker
 * and S3 server, with its own topics and bucket; S3 through a PausableRelay;
 * the fleet's data dir (the model, every worker's chunk files) on a 64 MiB
 * tmpfs where one can be mounted. Sizes as the fleet fault suite's: pages of
 * 16 tokens, chunks of 128, 140 pages per worker.
 */

export interface FleetTargetOptions {
  readonly dir: string;
  /** host:port of a running broker. */
  readonly brokers: string;
  /** A running S3 server. */
  readonly s3Endpoint: string;
  readonly ports: { readonly http: number; readonly workerSocket: number; readonly peerBase: number };
  readonly progress: (line: string) => void;
}

const WORKERS = 2;
const PAGES = 140;
const READY_MS = 120_000;
/** How long the state check waits for the writer to commit every acknowledged proposal. */
const CATCH_UP_MS = 30_000;

export class FleetTarget implements ChaosTarget {
  readonly name = "fleet";
  readonly model = "tiny";
  readonly vocab = 512;
  readonly roles = [
    "writer-a",
    "writer-b",
    "controller",
    ...Array.from({ length: WORKERS }, (_, i) => `worker-${i}`),
  ];
  readonly ownerRole = "worker-0";
  readonly kinds: FaultKind[] = ["kill", "second_owner", "s3_pause"];
  readonly skipped: Record<string, string> = {};
  private procs: ClusterProcess[];
  private closed = false;
  private seconds = 0;

  private constructor(
    private readonly o: FleetTargetOptions,
    private state: ClusterState,
    private readonly config: Config,
    private readonly relay: PausableRelay,
    private readonly fs: SmallFs | undefined,
  ) {
    this.procs = [...state.processes];
    if (fs) this.kinds.push("disk_full");
  }

  get url(): string {
    return this.state.api;
  }

  static async start(o: FleetTargetOptions): Promise<FleetTarget> {
    const data = join(o.dir, "data");
    await mkdir(data, { recursive: true });
    const fs = smallFs(64 << 20, data);
    const relay = await PausableRelay.start(new URL(o.s3Endpoint));
    const base = resolveConfig({}, {});
    const id = randomUUID().slice(0, 8);
    const config: Config = {
      ...base,
      pages: { ...base.pages, physicalPages: PAGES, chunkTokens: 128 },
      catalog: {
        ...base.catalog,
        topics: {
          proposals: `chaos.${id}.proposals`,
          tx: `chaos.${id}.tx`,
          rejections: `chaos.${id}.rejections`,
        },
      },
      store: { ...base.store, s3: { ...base.store.s3, bucket: `chaos-${id}` } },
      controller: {
        ...base.controller,
        httpPort: o.ports.http,
        workerPort: o.ports.workerSocket,
        heartbeatTtlMs: 5_000,
        residentFreshMs: 5_000,
        offerTimeoutMs: 1_500,
        progressTimeoutMs: 30_000,
      },
      worker: { ...base.worker, peerPortBase: o.ports.peerBase, threads: 1, heartbeatIntervalMs: 1_000 },
    };
    let state: ClusterState;
    try {
      state = await clusterUp({
        dir: o.dir,
        workers: WORKERS,
        config,
        kafkaPort: 0,
        s3Port: 0,
        readyTimeoutMs: READY_MS,
        progress: o.progress,
        services: { brokers: o.brokers, s3Endpoint: relay.endpoint },
        // Debug lines carry each acknowledged publication (checkpoint.published), for the catalog check.
        env: { CONTINUUM_LOG_LEVEL: "debug" },
      });
    } catch (err) {
      await relay.close();
      if (!("unavailable" in fs)) fs.unmount();
      throw err;
    }
    const t = new FleetTarget(o, state, config, relay, "unavailable" in fs ? undefined : fs);
    if ("unavailable" in fs) t.skipped.disk_full = fs.unavailable;
    return t;
  }

  private proc(role: string): ClusterProcess {
    return this.procs.find((p) => p.name === role)!;
  }

  private logs_(): string {
    return join(this.o.dir, "logs");
  }

  /** Starts `role` again under its name and waits until it is ready again. */
  private async restart(role: string): Promise<void> {
    const old = this.proc(role);
    const controller = this.proc("controller");
    const mark = logEvents(controller.log).length;
    const fresh = spawnRole(old.name, old.role, this.state.configPath, this.logs_(), old.env);
    this.procs = this.procs.map((p) => (p.name === role ? fresh : p));
    if (old.role === "writer")
      await waitForLog(
        fresh,
        (l) => l.event === "writer.active" || l.event === "writer.standby",
        "writer up",
        READY_MS,
      );
    else if (old.role === "controller")
      await waitForLog(fresh, (l) => l.event === "controller.ready", "controller.ready", READY_MS);
    else
      await waitForLog(
        controller,
        (l) => l.event === "hub.worker_connected" && l.workerId === role,
        `hub.worker_connected ${role}`,
        READY_MS,
        mark,
        [fresh],
      );
  }

  async kill(role: string): Promise<void> {
    const p = this.proc(role);
    process.kill(p.pid, "SIGKILL");
    while (alive(p.pid)) await sleep(20);
    await this.restart(role);
  }

  async secondOwner(role: string): Promise<{ refused: boolean; detail: string }> {
    const owner = this.proc(role);
    const second = spawnRole(
      `${role}-second-${++this.seconds}`,
      owner.role,
      this.state.configPath,
      this.logs_(),
      owner.env,
    );
    const deadline = Date.now() + 60_000;
    while (alive(second.pid) && Date.now() < deadline) await sleep(100);
    if (alive(second.pid)) {
      process.kill(second.pid, "SIGKILL");
      return { refused: false, detail: `a second ${role} was still running after 60 s` };
    }
    const out = tail(second.log, 6);
    const refused = out.includes(`in use by pid ${owner.pid}`);
    return {
      refused,
      detail: refused ? `refused, naming pid ${owner.pid}` : `not refused as expected: ${out.slice(0, 600)}`,
    };
  }

  fillDisk(): void {
    this.fs!.fill();
  }
  freeDisk(): void {
    this.fs!.free();
  }
  pauseS3(): void {
    this.relay.pause();
  }
  resumeS3(): void {
    this.relay.resume();
  }

  pids(): Record<string, number> {
    return Object.fromEntries(this.procs.map((p) => [p.name, p.pid]));
  }

  /** Waits (bounded) until the controller holds a live heartbeat of each of `ids`. */
  private async workersLive(ids: readonly string[]): Promise<void> {
    const deadline = Date.now() + READY_MS;
    for (;;) {
      const r = await call({ url: this.url, method: "GET", path: "/workers", deadlineMs: 5_000 });
      if (r.kind === "ok") {
        const ws = (JSON.parse(r.body) as { workers: FleetWorkerView[] }).workers;
        if (ids.every((id) => ws.some((w) => w.workerId === id && w.live))) return;
      }
      if (Date.now() > deadline)
        throw new Error(`workers ${ids.join(", ")} not all live within ${READY_MS} ms`);
      await sleep(250);
    }
  }

  async settle(): Promise<void> {
    for (const p of this.procs) if (!alive(p.pid)) await this.restart(p.name);
    await this.workersLive(this.roles.filter((r) => r.startsWith("worker-")));
  }

  async pagesVerdicts(): Promise<Verdict[]> {
    const big = await fullPoolRequest(this.url, this.model, PAGES);
    // Idle, every page of a worker is free or held only by its prefix cache (the agent's evictable pages).
    const deadline = Date.now() + 20_000;
    let detail = "";
    let balanced = false;
    while (!balanced && Date.now() < deadline) {
      const r = await call({ url: this.url, method: "GET", path: "/workers", deadlineMs: 5_000 });
      if (r.kind === "ok") {
        const ws = (JSON.parse(r.body) as { workers: FleetWorkerView[] }).workers;
        detail = ws
          .map(
            (w) =>
              `${w.workerId} free ${w.freePages} + evictable ${w.evictablePages} of ${w.status?.totalPages}`,
          )
          .join(", ");
        balanced = ws.every(
          (w) =>
            w.runningRequests === 0 && (w.freePages ?? 0) + (w.evictablePages ?? 0) === w.status?.totalPages,
        );
      }
      if (!balanced) await sleep(500);
    }
    return [
      {
        name: "pages back to baseline",
        ok: big.ok && balanced,
        detail: `${big.detail}; idle: ${detail}`,
      },
    ];
  }

  async stateVerdicts(): Promise<Verdict[]> {
    const workerLogs = this.procs.filter((p) => p.role === "worker").map((p) => p.log);
    const acked = acknowledgedNodes(workerLogs);
    // propose() acknowledges once a proposal is in catalog.proposals; its tx follows when the
    // active writer decides it, seconds later after a takeover (the probes and the full-pool
    // request just published more). So the check waits for the writer, within CATCH_UP_MS.
    const read = () => readCatalog(this.config, { brokers: [this.o.brokers], logPath: "" });
    const deadline = Date.now() + CATCH_UP_MS;
    let { txs, db } = await read();
    while (missingPublications(db, acked).length > 0 && Date.now() < deadline) {
      await sleep(1_000);
      ({ txs, db } = await read());
    }
    return [
      ...catalogVerdicts(txs, db, acked),
      ...(await replicaVerdicts(
        db,
        (w) => join(this.o.dir, "data", "workers", w, "store"),
        this.config.store.s3,
        this.o.s3Endpoint,
      )),
    ];
  }

  logs(): readonly string[] {
    return this.procs.map((p) => p.log);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.relay.resume();
    await clusterDown({ ...this.state, processes: this.procs }, () => undefined);
    await this.relay.close();
    if (this.fs) {
      this.fs.free();
      this.fs.unmount();
    }
  }
}
