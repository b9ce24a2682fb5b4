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
 * directory, and waits (polling /health, bounded) until it answers.
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
