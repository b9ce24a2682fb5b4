import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { appendFile, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { workerStatus } from "../../cli/fleet.ts";
import { fleetConfig, parseMetrics, waitForLog, workerLines, workersFromLog } from "../../deploy/cluster.ts";
import { resolveConfig } from "../../schema/config-load.ts";

/**
 * `continuum cluster`'s pure parts (the generated fleet config, the status
 * readers) and its refusals of bad input, which must start nothing. The
 * running cluster itself is exercised by fleet-faults.test.ts.
 */

const exec = promisify(execFile);
const ROOT = new URL("../../", import.meta.url).pathname;
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "continuum-cluster-cli-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function cli(args: string[]): Promise<{ code: number; out: string }> {
  try {
    const { stdout, stderr } = await exec(process.execPath, ["bin/continuum.mjs", "cluster", ...args], {
      cwd: ROOT,
      timeout: 60_000,
    });
    return { code: 0, out: stdout + stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, out: e.stdout + e.stderr };
  }
}

describe("continuum cluster", () => {
  it("generates a fleet config on the cluster's broker and S3, keeping the user's settings and secret", () => {
    const user = resolveConfig({ pages: { physicalPages: 96 }, auth: { clusterSecret: "mine" } }, {});
    const c = fleetConfig(user, {
      dir: "/x/cluster",
      brokers: "127.0.0.1:19092",
      s3Endpoint: "http://127.0.0.1:19000",
      secret: "generated",
    });
    expect(c.catalog.log).toBe("kafka");
    expect(c.catalog.brokers).toEqual(["127.0.0.1:19092"]);
    expect(c.store.s3).toMatchObject({
      enabled: true,
      endpoint: "http://127.0.0.1:19000",
      createBucket: true,
    });
    expect(c.store.dataDir).toBe("/x/cluster/data");
    expect(c.store.dir.path).toBe("");
    expect(c.pages.physicalPages).toBe(96);
    expect(c.auth.clusterSecret).toBe("mine");
    expect(c.worker.controllerUrl).toBe(`ws://127.0.0.1:${user.controller.workerPort}`);
    const generated = fleetConfig(resolveConfig({}, {}), {
      dir: "/x",
      brokers: "b:1",
      s3Endpoint: "http://s",
      secret: "generated",
    });
    expect(generated.auth.clusterSecret).toBe("generated");
  });

  it("reads workers from the controller's hub events (the last event per worker wins) and gauges from /metrics", () => {
    expect(
      workersFromLog([
        { event: "hub.worker_connected", workerId: "worker-0" },
        { event: "hub.worker_connected", workerId: "worker-1" },
        { event: "hub.worker_lost", workerId: "worker-1", reason: "socket closed" },
        { event: "hub.worker_lost", workerId: "worker-0", reason: "socket closed" },
        { event: "hub.worker_connected", workerId: "worker-0" },
        { event: "assignment.completed", workerId: "worker-1" },
      ]),
    ).toEqual({ "worker-0": "connected", "worker-1": "lost (socket closed)" });
    expect(
      parseMetrics(
        '# HELP continuum_pages_free Free KV pages.\ncontinuum_pages_free 280\ncontinuum_cache_tokens{source="s3"} 1280\nbad line x\n',
      ),
    ).toEqual({ continuum_pages_free: 280, 'continuum_cache_tokens{source="s3"}': 1280 });
  });

  it("builds a worker's status from its parts' counters and prints one line per worker", () => {
    const status = workerStatus({
      runtime: { pagesTotal: 140, pagesFree: 40, cachedPromptTokens: 2000, computedPromptTokens: 700 },
      restore: {
        chunks: { ram: 1, ssd: 0, peer: 2, s3: 3 },
        bytes: { ram: 10, ssd: 0, peer: 20, s3: 30 },
        tokens: { ram: 128, ssd: 0, peer: 256, s3: 300 },
      },
      checkpoint: { chunksPublished: 5 },
      catalogOffset: 90,
      logEnd: 100,
      chunkTokens: 128,
      kvBytesPerToken: 256,
    });
    expect(status).toMatchObject({
      totalPages: 140,
      residentPages: 100,
      residentHitTokens: 2000 - 684,
      computedTokens: 700,
      publishedChunks: 5,
      publishedBytes: 5 * 128 * 256,
      catalogOffset: 90,
      catalogLag: 10,
    });
    const view = {
      live: true,
      ready: true,
      heartbeatAgeMs: 10,
      evictablePages: 0,
      queuedRequests: 0,
      runningRequests: 0,
    };
    expect(
      workerLines([
        { ...view, workerId: "worker-0", freePages: 40, status },
        { ...view, workerId: "worker-1", live: false, ready: null, freePages: null, status: null },
        { ...view, workerId: "worker-2", ready: false, freePages: 7, status: null },
      ]),
    ).toEqual([
      "worker-0   live  pages free 40 resident 100/140  hits: resident 1316 tok, restored chunks ram 1 ssd 0 peer 2 s3 3  computed 700 tok, published 5 chunks  catalog offset 90 lag 10",
      "worker-1   DOWN  pages free ? (no status reported)",
      "worker-2   warming  pages free 7 (no status reported)",
    ]);
  });

  it("waits only on a process's own log lines, not an earlier run's in the same file", async () => {
    const log = join(dir, "controller.log");
    await writeFile(log, `${JSON.stringify({ event: "controller.ready", run: 1 })}\nnot json\n`);
    const p = { name: "controller", role: "controller" as const, pid: process.pid, log, logFrom: 1, env: {} };
    await expect(
      waitForLog(p, (l) => l.event === "controller.ready", "controller.ready", 300),
    ).rejects.toThrow(/no controller.ready within 300 ms/);
    await appendFile(log, `${JSON.stringify({ event: "controller.ready", run: 2 })}\n`);
    const line = await waitForLog(p, (l) => l.event === "controller.ready", "controller.ready", 5_000);
    expect(line.run).toBe(2);
  });

  it("refuses bad input clearly and starts nothing", async () => {
    const zero = await cli(["up", "--workers", "0", "--dir", dir]);
    expect(zero.code).toBe(2);
    expect(zero.out).toMatch(/--workers must be an integer in \[1, 16\], got '0'/);
    const port = await cli(["up", "--kafka-port", "http", "--dir", dir]);
    expect(port.code).toBe(2);
    expect(port.out).toMatch(/--kafka-port must be a port, got 'http'/);
    const sub = await cli(["sideways", "--dir", dir]);
    expect(sub.code).toBe(2);
    expect(sub.out).toMatch(/unknown cluster command 'sideways'/);
    expect(existsSync(join(dir, "state.json"))).toBe(false);
    expect(existsSync(join(dir, "logs"))).toBe(false);
    const status = await cli(["status", "--dir", dir]);
    expect(status.code).toBe(1);
    expect(status.out).toMatch(/no cluster state/);
    const down = await cli(["down", "--dir", dir]);
    expect(down.code).toBe(0);
    expect(down.out).toMatch(/nothing to stop/);
  });
});
