import { execFile, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, existsSync, openSync, readFileSync } from "node:fs";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { connect } from "node:net";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import type { FleetWorkerView } from "../controller/api/service.ts";
import { sleep } from "../schema/abort.ts";
import type { Config } from "../schema/config.ts";
import { NODE_HEAP_FLAGS } from "./node-flags.ts";

/**
 * A local fleet on 127.0.0.1 as separate, detached processes: the Kafka
 * broker and the S3 server (through their deploy scripts), two catalog
 * writers (one active, one standby), the controller and N workers. Every
 * process runs `continuum <role> --config <dir>/fleet.json` with its log in
 * <dir>/logs/<name>.log; the state file <dir>/state.json records pids, ports
 * and paths so `status` and `down` work from another shell.
 *
 * Layout under dir (default <store.dataDir>/cluster):
 *   fleet.json   the generated fleet config (the user's config, resolved
 *                with CONTINUUM_* overrides, plus the cluster's endpoints)
 *   state.json   ClusterState
 *   logs/        one log file per process
 *   data/        the shared store.dataDir (the model; workers/<id>/store per worker)
 *   kafka/ s3/   the services' data
 */

const exec = promisify(execFile);
const ROOT = resolve(fileURLToPath(new URL("..", import.meta.url)));
const BIN = join(ROOT, "bin", "continuum.mjs");
const KAFKA_SH = join(ROOT, "deploy", "kafka.sh");
const S3_SH = join(ROOT, "deploy", "s3proxy.sh");

export type Role = "writer" | "controller" | "worker" | "serve";

export interface ClusterProcess {
  readonly name: string;
  readonly role: Role;
  readonly pid: number;
  readonly log: string;
  /** Structured lines already in the log when this process started (an earlier run's): its own begin here. */
  readonly logFrom: number;
  /** Extra environment of this process (the worker index). */
  readonly env: Readonly<Record<string, string>>;
}

export interface ClusterState {
  readonly dir: string;
  readonly startedAt: string;
  readonly configPath: string;
  readonly kafka: { readonly port: number; readonly dir: string; readonly brokers: string };
  readonly s3: { readonly port: number; readonly data: string; readonly endpoint: string };
  /** The broker and S3 server were running already (UpOptions.services): `down` leaves them running. */
  readonly externalServices?: boolean;
  readonly api: string;
  readonly workerSocket: string;
  /** In start order; `down` stops them in reverse. */
  readonly processes: readonly ClusterProcess[];
}

export interface UpOptions {
  readonly dir: string;
  readonly workers: number;
  /** The user's resolved config (file + CONTINUUM_* overrides). */
  readonly config: Config;
  readonly kafkaPort: number;
  readonly s3Port: number;
  /** Bound on each readiness wait. */
  readonly readyTimeoutMs: number;
  readonly progress: (line: string) => void;
  /**
   * A broker and S3 server already running (on this machine), used instead of
   * starting them: several fleets in turn on one pair (bench cluster), each
   * with its own catalog topics and bucket from the config.
   */
  readonly services?: RunningServices;
  /** Extra environment of every role's process (e.g. CONTINUUM_LOG_LEVEL). */
  readonly env?: Readonly<Record<string, string>>;
}

export interface RunningServices {
  /** host:port, a broker on 127.0.0.1 */
  readonly brokers: string;
  /** http://127.0.0.1:port */
  readonly s3Endpoint: string;
}

/**
 * The Kafka broker and the S3 server through their deploy scripts, as
 * `cluster up` starts them; stop() stops both (S3 first). `niceness` (0–19)
 * starts both at that lower CPU priority, every thread included: where they
 * share a small host with the fleet they stand in for remote services, and
 * should not take cores from the workers they serve.
 */
export async function startServices(o: {
  dir: string;
  kafkaPort: number;
  s3Port: number;
  niceness?: number;
  progress: (line: string) => void;
}): Promise<RunningServices & { stop(): Promise<void> }> {
  const nice = o.niceness ?? 0;
  if (!Number.isInteger(nice) || nice < 0 || nice > 19)
    throw new RangeError(`niceness must be an integer in [0, 19], got ${nice}`);
  const kafkaDir = join(o.dir, "kafka");
  const s3Data = join(o.dir, "s3");
  const brokers = `127.0.0.1:${o.kafkaPort}`;
  const s3Endpoint = `http://127.0.0.1:${o.s3Port}`;
  const stop = async () => {
    await script(S3_SH, ["stop", "--port", String(o.s3Port)], 60_000).catch(() => undefined);
    await script(KAFKA_SH, ["stop", "--dir", kafkaDir], 60_000).catch(() => undefined);
  };
  try {
    o.progress(`kafka: starting on ${brokers} (data ${kafkaDir})`);
    await script(KAFKA_SH, ["start", "--port", String(o.kafkaPort), "--dir", kafkaDir], 600_000, nice);
    o.progress(`s3: starting on ${s3Endpoint} (data ${s3Data})`);
    await script(S3_SH, ["start", "--port", String(o.s3Port), "--data", s3Data], 600_000, nice);
  } catch (err) {
    await stop();
    throw err;
  }
  return { brokers, s3Endpoint, stop };
}

/** Whether something accepts TCP connections on 127.0.0.1:port (bounded: 5 s). */
function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect({ host: "127.0.0.1", port, timeout: 5_000 });
    const done = (up: boolean) => {
      sock.destroy();
      resolve(up);
    };
    sock.once("connect", () => done(true));
    sock.once("error", () => done(false));
    sock.once("timeout", () => done(false));
  });
}

function portOf(hostPort: string): number {
  return Number(hostPort.slice(hostPort.lastIndexOf(":") + 1));
}

export const MAX_WORKERS = 16;

/**
 * The fleet config every process reads: the user's config with the catalog on
 * the cluster's broker, the store's S3 tier on the cluster's server, one data
 * dir for the cluster and a cluster secret (generated unless one is set).
 * Pure: values in, value out.
 */
export function fleetConfig(
  config: Config,
  o: { dir: string; brokers: string; s3Endpoint: string; secret: string },
): Config {
  const c = config.controller;
  return {
    ...config,
    catalog: { ...config.catalog, log: "kafka", brokers: [o.brokers] },
    store: {
      ...config.store,
      dataDir: join(o.dir, "data"),
      // Per-worker chunk files: workerCacheConfig derives <dataDir>/workers/<id>/store.
      dir: { ...config.store.dir, path: "" },
      s3: { ...config.store.s3, enabled: true, endpoint: o.s3Endpoint, createBucket: true },
    },
    auth: { ...config.auth, clusterSecret: config.auth.clusterSecret || o.secret },
    worker: { ...config.worker, controllerUrl: `ws://${c.host}:${c.workerPort}` },
  };
}

export function statePath(dir: string): string {
  return join(dir, "state.json");
}

export async function readState(dir: string): Promise<ClusterState | undefined> {
  const p = statePath(dir);
  if (!existsSync(p)) return undefined;
  return JSON.parse(await readFile(p, "utf8")) as ClusterState;
}

export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Starts one role detached (its own process group), stdout and stderr appended to its log. */
export function spawnRole(
  name: string,
  role: Role,
  configPath: string,
  logDir: string,
  env: Record<string, string>,
): ClusterProcess {
  const log = join(logDir, `${name}.log`);
  const logFrom = logEvents(log).length;
  const fd = openSync(log, "a");
  try {
    const child = spawn(process.execPath, [...NODE_HEAP_FLAGS, BIN, role, "--config", configPath], {
      cwd: ROOT,
      detached: true,
      stdio: ["ignore", fd, fd],
      env: { ...process.env, ...env },
    });
    if (child.pid === undefined) throw new Error(`could not start ${name}`);
    child.unref();
    return { name, role, pid: child.pid, log, logFrom, env };
  } finally {
    closeSync(fd);
  }
}

/** The structured log lines of a process's log file (non-JSON lines skipped). */
export function logEvents(path: string): Record<string, unknown>[] {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch {
    return [];
  }
  const out: Record<string, unknown>[] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith("{")) continue;
    try {
      out.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      // a partial last line
    }
  }
  return out;
}

/**
 * Polls a process's log (every 200 ms, bounded) until `ok` holds of some line
 * from line `from` on (default: the first line this process wrote).
 */
export async function waitForLog(
  p: ClusterProcess,
  ok: (line: Record<string, unknown>) => boolean,
  what: string,
  timeoutMs: number,
  from = p.logFrom,
  /** Other processes the line depends on: one that exits ends the wait at once. */
  needs: readonly ClusterProcess[] = [],
): Promise<Record<string, unknown>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const hit = logEvents(p.log).slice(from).find(ok);
    if (hit) return hit;
    for (const q of [p, ...needs])
      if (!alive(q.pid)) throw new Error(`${q.name} exited before ${what}; see ${q.log}:\n${tail(q.log)}`);
    if (Date.now() > deadline)
      throw new Error(`${p.name}: no ${what} within ${timeoutMs} ms; see ${p.log}:\n${tail(p.log)}`);
    await sleep(200);
  }
}

/** The last `n` lines of a log file ("" when it cannot be read). */
export function tail(path: string, n = 15): string {
  try {
    return readFileSync(path, "utf8").split("\n").slice(-n).join("\n");
  } catch {
    return "";
  }
}

/** Runs a deploy script; with `nice` > 0 under nice(1), so the daemons it starts inherit the priority. */
async function script(path: string, args: string[], timeoutMs: number, nice = 0): Promise<string> {
  const argv = nice > 0 ? ["-n", String(nice), "bash", path, ...args] : [path, ...args];
  const { stdout } = await exec(nice > 0 ? "nice" : "bash", argv, { timeout: timeoutMs, cwd: ROOT });
  return stdout;
}

/**
 * Brings the cluster up; on any failure stops what it started (and removes
 * the state file) before rethrowing, so a failed `up` leaves nothing running.
 */
export async function clusterUp(o: UpOptions): Promise<ClusterState> {
  if (!Number.isInteger(o.workers) || o.workers < 1 || o.workers > MAX_WORKERS)
    throw new Error(`--workers must be an integer in [1, ${MAX_WORKERS}], got ${o.workers}`);
  const existing = await readState(o.dir);
  if (existing?.processes.some((p) => alive(p.pid)))
    throw new Error(`a cluster is already running from ${o.dir} (\`continuum cluster down\` first)`);
  const logs = join(o.dir, "logs");
  await mkdir(logs, { recursive: true });
  const kafkaDir = join(o.dir, "kafka");
  const s3Data = join(o.dir, "s3");
  const ext = o.services;
  const brokers = ext?.brokers ?? `127.0.0.1:${o.kafkaPort}`;
  const s3Endpoint = ext?.s3Endpoint ?? `http://127.0.0.1:${o.s3Port}`;
  const config = fleetConfig(o.config, {
    dir: o.dir,
    brokers,
    s3Endpoint,
    secret: randomBytes(16).toString("hex"),
  });
  const configPath = join(o.dir, "fleet.json");
  await writeFile(configPath, `${JSON.stringify(config, null, 2)}\n`);
  const c = config.controller;
  const processes: ClusterProcess[] = [];
  const state = (): ClusterState => ({
    dir: o.dir,
    startedAt: new Date().toISOString(),
    configPath,
    kafka: { port: ext ? portOf(brokers) : o.kafkaPort, dir: kafkaDir, brokers },
    s3: { port: ext ? portOf(s3Endpoint) : o.s3Port, data: s3Data, endpoint: s3Endpoint },
    ...(ext ? { externalServices: true } : {}),
    api: `http://${c.host}:${c.httpPort}`,
    workerSocket: `ws://${c.host}:${c.workerPort}`,
    processes: [...processes],
  });
  const save = () => writeFile(statePath(o.dir), `${JSON.stringify(state(), null, 2)}\n`);
  try {
    await save();
    if (ext) {
      o.progress(`kafka ${brokers} and s3 ${s3Endpoint}: already running, used as they are`);
    } else {
      o.progress(`kafka: starting on ${brokers} (data ${kafkaDir})`);
      await script(KAFKA_SH, ["start", "--port", String(o.kafkaPort), "--dir", kafkaDir], 600_000);
      o.progress(`s3: starting on ${s3Endpoint} (data ${s3Data})`);
      await script(S3_SH, ["start", "--port", String(o.s3Port), "--data", s3Data], 600_000);
    }
    const add = (name: string, role: Role, env: Record<string, string> = {}) => {
      const p = spawnRole(name, role, configPath, logs, { ...o.env, ...env });
      processes.push(p);
      return p;
    };
    const writers = [add("writer-a", "writer"), add("writer-b", "writer")];
    await save();
    o.progress("writers: starting writer-a and writer-b (one active, one standby)");
    await Promise.all(
      writers.map((w) =>
        waitForLog(
          w,
          (l) => l.event === "writer.active" || l.event === "writer.standby",
          "writer.active or writer.standby",
          o.readyTimeoutMs,
        ),
      ),
    );
    o.progress("controller: starting (the first start generates the model)");
    const controller = add("controller", "controller");
    await save();
    await waitForLog(controller, (l) => l.event === "controller.ready", "controller.ready", o.readyTimeoutMs);
    o.progress(`controller: ready at http://${c.host}:${c.httpPort}`);
    const workers: ClusterProcess[] = [];
    for (let i = 0; i < o.workers; i++)
      workers.push(add(`worker-${i}`, "worker", { CONTINUUM_WORKER_INDEX: String(i) }));
    await save();
    for (const w of workers) {
      await waitForLog(
        controller,
        (l) => l.event === "hub.worker_connected" && l.workerId === w.name,
        `hub.worker_connected for ${w.name}`,
        o.readyTimeoutMs,
        controller.logFrom,
        [w],
      );
      o.progress(`${w.name}: connected`);
    }
    await save();
    return state();
  } catch (err) {
    o.progress(`up failed: ${(err as Error).message.split("\n")[0]}; stopping what started`);
    await clusterDown(state(), o.progress);
    throw err;
  }
}

/** SIGTERM, a bounded wait, then SIGKILL. */
export async function stopProcess(pid: number, graceMs: number): Promise<"stopped" | "killed" | "gone"> {
  if (!alive(pid)) return "gone";
  try {
    process.kill(pid, "SIGTERM");
  } catch {
    return "gone";
  }
  const deadline = Date.now() + graceMs;
  while (Date.now() < deadline) {
    if (!alive(pid)) return "stopped";
    await sleep(100);
  }
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    return "stopped";
  }
  return "killed";
}

/** Stops every process in reverse start order, then S3 and Kafka through their scripts; removes the state file. */
export async function clusterDown(state: ClusterState, progress: (line: string) => void): Promise<void> {
  for (const p of [...state.processes].reverse()) {
    const how = await stopProcess(p.pid, 15_000);
    progress(`${p.name}: ${how}`);
  }
  if (state.externalServices) {
    progress("kafka and s3: left running (they were running before this cluster)");
    await rm(statePath(state.dir), { force: true });
    return;
  }
  try {
    await script(S3_SH, ["stop", "--port", String(state.s3.port)], 60_000);
    progress("s3: stopped");
  } catch (err) {
    progress(`s3: stop failed: ${(err as Error).message.split("\n")[0]}`);
  }
  try {
    await script(KAFKA_SH, ["stop", "--dir", state.kafka.dir], 60_000);
    progress("kafka: stopped");
  } catch (err) {
    progress(`kafka: stop failed: ${(err as Error).message.split("\n")[0]}`);
  }
  await rm(statePath(state.dir), { force: true });
}

export interface ClusterStatus {
  readonly processes: readonly { name: string; pid: number; alive: boolean; log: string }[];
  readonly kafka: boolean;
  readonly s3: boolean;
  readonly controllerHealthy: boolean;
  /** Per worker id, from the controller's log: connected, or the last loss reason. */
  readonly workers: Readonly<Record<string, string>>;
  /** The controller's gauges (/metrics): pages free and total over connected workers, catalog lag, cache tokens by source. */
  readonly metrics: Readonly<Record<string, number>>;
  /** Per worker, the controller's view from its newest heartbeat (GET /workers): pages, cache hits, its catalog replica. */
  readonly fleet: readonly FleetWorkerView[];
}

/** Reads a Prometheus text page into name{labels} → value. */
export function parseMetrics(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const i = line.lastIndexOf(" ");
    const v = Number(line.slice(i + 1));
    if (Number.isFinite(v)) out[line.slice(0, i)] = v;
  }
  return out;
}

/** Worker connection state from the controller's hub events: the last event per worker wins. */
export function workersFromLog(lines: readonly Record<string, unknown>[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const l of lines) {
    const id = l.workerId;
    if (typeof id !== "string") continue;
    if (l.event === "hub.worker_connected") out[id] = "connected";
    else if (l.event === "hub.worker_lost") out[id] = `lost (${String(l.reason)})`;
    else if (l.event === "hub.heartbeat_expired") out[id] = "heartbeat expired";
  }
  return out;
}

/**
 * The credentials for the controller's operator endpoints (/metrics, /workers)
 * from the fleet's config: the scrape token, else an admin tenant's API token.
 */
async function operatorHeaders(configPath: string): Promise<Record<string, string>> {
  const auth = await readFile(configPath, "utf8").then(
    (text) => (JSON.parse(text) as Partial<Config>).auth,
    () => undefined,
  );
  const admin = Object.entries(auth?.tokens ?? {}).find(([, tenant]) => auth?.adminTenants?.includes(tenant));
  const token = auth?.metricsToken || admin?.[0];
  return token ? { authorization: `Bearer ${token}` } : {};
}

export async function clusterStatus(state: ClusterState): Promise<ClusterStatus> {
  const ok = (p: Promise<unknown>) =>
    p.then(
      () => true,
      () => false,
    );
  // Services this cluster did not start are only checked for a listening port.
  const [kafka, s3] = state.externalServices
    ? await Promise.all([listening(state.kafka.port), listening(state.s3.port)])
    : await Promise.all([
        ok(
          script(KAFKA_SH, ["status", "--port", String(state.kafka.port), "--dir", state.kafka.dir], 30_000),
        ),
        ok(script(S3_SH, ["status", "--port", String(state.s3.port)], 30_000)),
      ]);
  let controllerHealthy = false;
  let metrics: Record<string, number> = {};
  let fleet: FleetWorkerView[] = [];
  try {
    const h = await fetch(`${state.api}/health`, { signal: AbortSignal.timeout(5_000) });
    controllerHealthy = h.status === 200;
    const headers = await operatorHeaders(state.configPath);
    const m = await fetch(`${state.api}/metrics`, { headers, signal: AbortSignal.timeout(5_000) });
    const all = parseMetrics(await m.text());
    metrics = Object.fromEntries(
      Object.entries(all).filter(([k]) =>
        /^continuum_(pages_|catalog_lag|catalog_offset|cache_tokens|queue_depth)/.test(k),
      ),
    );
    const w = await fetch(`${state.api}/workers`, { headers, signal: AbortSignal.timeout(5_000) });
    if (w.status === 200) fleet = ((await w.json()) as { workers: FleetWorkerView[] }).workers;
  } catch {
    controllerHealthy = false;
  }
  const controller = state.processes.find((p) => p.role === "controller");
  return {
    processes: state.processes.map((p) => ({ name: p.name, pid: p.pid, alive: alive(p.pid), log: p.log })),
    kafka,
    s3,
    controllerHealthy,
    workers: controller ? workersFromLog(logEvents(controller.log).slice(controller.logFrom)) : {},
    metrics,
    fleet,
  };
}

/**
 * One line per worker for `cluster status`: liveness, pages (free, resident of
 * total), cache hits (prompt tokens from resident pages, chunks restored by
 * tier), chunks published, and its catalog replica's offset and lag. Pure.
 */
export function workerLines(fleet: readonly FleetWorkerView[]): string[] {
  return fleet.map((w) => {
    const head = `${w.workerId.padEnd(10)} ${w.live ? (w.ready === false ? "warming" : "live") : "DOWN"}`;
    const s = w.status;
    if (s === null) return `${head}  pages free ${w.freePages ?? "?"} (no status reported)`;
    const c = s.restoredChunks;
    return [
      head,
      `pages free ${w.freePages ?? "?"} resident ${s.residentPages}/${s.totalPages}`,
      `hits: resident ${s.residentHitTokens} tok, restored chunks ram ${c.ram} ssd ${c.ssd} peer ${c.peer} s3 ${c.s3}`,
      `computed ${s.computedTokens} tok, published ${s.publishedChunks} chunks`,
      `catalog offset ${s.catalogOffset} lag ${s.catalogLag}`,
    ].join("  ");
  });
}
