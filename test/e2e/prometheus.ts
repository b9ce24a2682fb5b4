import { type ChildProcess, execFile, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { freePort } from "../ports.ts";

/**
 * Debian's Prometheus (and promtool) for the operations suite: a real server
 * scraping our /metrics every second, queried over its HTTP API.
 */

const exec = promisify(execFile);
export const PROMETHEUS = "/usr/bin/prometheus";
export const PROMTOOL = "/usr/bin/promtool";

export function prometheusInstalled(): boolean {
  return existsSync(PROMETHEUS) && existsSync(PROMTOOL);
}

export interface ScrapeJob {
  readonly job: string;
  /** host:port serving /metrics. */
  readonly target: string;
  /** The scrape token (auth.metricsToken or an admin's API token), when the server has API tokens. */
  readonly bearer?: string;
}

export interface RunningPrometheus {
  readonly url: string;
  /** An instant query at `time` (seconds since the epoch; default now); throws on a PromQL error. */
  query(expr: string, time?: number): Promise<PromSample[]>;
  stop(): Promise<void>;
}

export interface PromSample {
  readonly metric: Record<string, string>;
  /** [seconds since the epoch, value] */
  readonly value: readonly [number, number];
}

export async function startPrometheus(jobs: readonly ScrapeJob[], readyTimeoutMs = 60_000) {
  const dir = await mkdtemp(join(tmpdir(), "continuum-prometheus-"));
  const port = await freePort();
  const config = [
    "global:",
    "  scrape_interval: 1s",
    "  scrape_timeout: 1s",
    "scrape_configs:",
    ...jobs.flatMap((j) => [
      `  - job_name: ${j.job}`,
      ...(j.bearer ? ["    authorization:", `      credentials: '${j.bearer}'`] : []),
      "    static_configs:",
      `      - targets: ['${j.target}']`,
    ]),
    "",
  ].join("\n");
  const configPath = join(dir, "prometheus.yml");
  await writeFile(configPath, config);
  await exec(PROMTOOL, ["check", "config", configPath]);
  const logs: string[] = [];
  const child: ChildProcess = spawn(
    PROMETHEUS,
    [
      `--config.file=${configPath}`,
      `--storage.tsdb.path=${join(dir, "data")}`,
      `--web.listen-address=127.0.0.1:${port}`,
      "--storage.tsdb.retention.time=1h",
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  child.stdout!.on("data", (d) => logs.push(String(d)));
  child.stderr!.on("data", (d) => logs.push(String(d)));
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      const t = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(t);
    }
    await rm(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + readyTimeoutMs;
  for (;;) {
    if (child.exitCode !== null) {
      await stop();
      throw new Error(`prometheus exited with ${child.exitCode}:\n${logs.join("")}`);
    }
    const ok = await fetch(`${url}/-/ready`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) break;
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`prometheus not ready in ${readyTimeoutMs} ms:\n${logs.join("")}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  const query = async (expr: string, time?: number): Promise<PromSample[]> => {
    const params = new URLSearchParams({
      query: expr,
      ...(time === undefined ? {} : { time: String(time) }),
    });
    const r = await fetch(`${url}/api/v1/query?${params}`);
    const body = (await r.json()) as {
      status: string;
      error?: string;
      data?: { resultType: string; result: { metric: Record<string, string>; value: [number, string] }[] };
    };
    if (body.status !== "success") throw new Error(`PromQL ${expr}: ${body.error ?? r.status}`);
    if (body.data!.resultType !== "vector") throw new Error(`PromQL ${expr}: a ${body.data!.resultType}`);
    return body.data!.result.map((s) => ({
      metric: s.metric,
      value: [s.value[0], Number(s.value[1])] as const,
    }));
  };
  return { url, query, stop } satisfies RunningPrometheus;
}

/** Runs `promtool check metrics` on one /metrics page; returns its exit code and what it printed. */
export async function promtoolCheckMetrics(text: string): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(PROMTOOL, ["check", "metrics"], { stdio: ["pipe", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d) => {
      out += String(d);
    });
    child.stderr.on("data", (d) => {
      out += String(d);
    });
    child.on("exit", (code) => resolve({ code: code ?? -1, out }));
    child.stdin.end(text);
  });
}
