import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "../ports.ts";

export interface ServeProcess {
  readonly url: string;
  readonly port: number;
  readonly child: ChildProcess;
  readonly logs: string[];
  stop(): Promise<void>;
}

/**
 * Starts `continuum serve` as a real process on a free port with its own data
 * directory (CONTINUUM_STORE_DATA_DIR in `env` names another one, which
 * stop() leaves in place), and waits (polling /health, bounded) until it
 * answers.
 */
export async function startServe(
  env: Record<string, string> = {},
  readyTimeoutMs = 90_000,
): Promise<ServeProcess> {
  const dataDir = await mkdtemp(join(tmpdir(), "continuum-serve-"));
  const port = await freePort();
  const logs: string[] = [];
  const child = spawn(process.execPath, ["bin/continuum.mjs", "serve", "--port", String(port)], {
    env: {
      ...process.env,
      CONTINUUM_STORE_DATA_DIR: dataDir,
      CONTINUUM_PAGES_PHYSICAL_PAGES: "1024",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  child.stdout!.on("data", (d) => logs.push(String(d)));
  child.stderr!.on("data", (d) => logs.push(String(d)));
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + readyTimeoutMs;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`serve exited with ${child.exitCode}:\n${logs.join("")}`);
    try {
      const r = await fetch(`${url}/health`);
      if (r.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`serve not ready after ${readyTimeoutMs} ms:\n${logs.join("")}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  return {
    url,
    port,
    child,
    logs,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGINT");
        await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
        if (child.exitCode === null) child.kill("SIGKILL");
      }
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}

export interface ServeExit {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly output: string;
  /** From spawn to exit. */
  readonly ms: number;
}

/**
 * Runs `continuum serve` expecting it to fail at start-up: resolves with its
 * exit once it exits; if it is still running after `timeoutMs` it is killed
 * and the result says so (`code` null, signal SIGKILL).
 */
export async function serveExpectingExit(
  env: Record<string, string>,
  timeoutMs: number,
  port?: number,
): Promise<ServeExit> {
  const p = port ?? (await freePort());
  const t0 = performance.now();
  const child = spawn(process.execPath, ["bin/continuum.mjs", "serve", "--port", String(p)], {
    env: { ...process.env, CONTINUUM_PAGES_PHYSICAL_PAGES: "1024", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout!.on("data", (d) => (output += String(d)));
  child.stderr!.on("data", (d) => (output += String(d)));
  const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
  const [code, signal] = (await new Promise((r) => child.once("exit", (c, s) => r([c, s])))) as [
    number | null,
    NodeJS.Signals | null,
  ];
  clearTimeout(timer);
  return { code, signal, output, ms: performance.now() - t0 };
}

/** Runs `continuum ARGS…` to completion (bounded); its exit code and output. */
export async function continuum(
  args: readonly string[],
  env: Record<string, string> = {},
  timeoutMs = 60_000,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, ["bin/continuum.mjs", ...args], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout!.on("data", (d) => (stdout += String(d)));
  child.stderr!.on("data", (d) => (stderr += String(d)));
  const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
  const code = (await new Promise((r) => child.once("exit", r))) as number | null;
  clearTimeout(timer);
  return { code, stdout, stderr };
}
