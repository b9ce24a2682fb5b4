import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { freePort } from "../../ports.ts";

const run = promisify(execFile);
const script = join(import.meta.dirname, "..", "..", "..", "deploy", "s3proxy.sh");

/** Fixed test credentials of deploy/s3proxy.sh. */
export const S3_ACCESS_KEY_ID = "continuum";
export const S3_SECRET_ACCESS_KEY = "continuum-secret";

export interface RunningS3Proxy {
  readonly endpoint: string;
  readonly port: number;
  readonly pid: number;
  /** Graceful stop through the script. */
  stop(): Promise<void>;
  /** kill -9, as a crash would; the script's pid file is cleaned up too. */
  kill(): Promise<void>;
}

/**
 * Starts S3Proxy on a free port with its data in `dataDir` through
 * deploy/s3proxy.sh, which fetches the jars on first use and polls readiness.
 */
export async function startS3Proxy(dataDir: string): Promise<RunningS3Proxy> {
  // A port found free may be taken by a parallel suite's server before ours
  // binds it; the script then fails (it checks who owns the port), and a
  // fresh port is tried. Bounded: 3 attempts.
  let port = 0;
  let stdout = "";
  for (let attempt = 1; ; attempt++) {
    port = await freePort();
    try {
      ({ stdout } = await run("bash", [script, "start", "--port", String(port), "--data", dataDir], {
        timeout: 600_000,
      }));
      break;
    } catch (err) {
      if (attempt >= 3) throw err;
    }
  }
  const m = /running pid=(\d+)/.exec(stdout);
  if (!m) throw new Error(`deploy/s3proxy.sh start printed no pid: ${stdout}`);
  const pid = Number(m[1]);
  const stop = async () => {
    await run("bash", [script, "stop", "--port", String(port)], { timeout: 60_000 });
  };
  return {
    endpoint: `http://127.0.0.1:${port}`,
    port,
    pid,
    stop,
    kill: async () => {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
      await stop();
    },
  };
}
