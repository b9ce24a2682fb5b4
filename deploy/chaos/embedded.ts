import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { embeddedLogPath } from "../../catalog/console.ts";
import { sleep } from "../../schema/abort.ts";
import type { Config } from "../../schema/config.ts";
import { resolveConfig } from "../../schema/config-load.ts";
import { alive, type ClusterProcess, spawnRole, stopProcess, tail } from "../cluster.ts";
import { PausableRelay } from "../relay.ts";
import { type SmallFs, smallFs } from "../small-fs.ts";
import { call } from "./client.ts";
import {
  acknowledgedNodes,
  catalogVerdicts,
  fullPoolRequest,
  readCatalog,
  replicaVerdicts,
  type Verdict,
} from "./invariants.ts";
import type { FaultKind } from "./plan.ts";
import type { ChaosTarget } from "./target.ts";

/**
 * The embedded default under chaos: one `continuum serve` process (its own
 * catalog writer, embedded log and chunk files) on a data dir of its own —
 * a 64 MiB tmpfs where one can be mounted, so the disk can be filled — with
 * S3 enabled through a PausableRelay in front of a real S3 server.
 */

export interface EmbeddedTargetOptions {
  readonly dir: string;
  readonly port: number;
  /** A real S3 server; absent: no S3 (the s3_pause fault is skipped). */
  readonly s3Endpoint?: string;
  readonly bucket: string;
  readonly progress: (line: string) => void;
}

/** Pages: a 2,040-token request needs 128 of them (the pool check), leaving 32 for the rest. */
const PAGES = 160;
const READY_MS = 90_000;

export class EmbeddedTarget implements ChaosTarget {
  readonly name = "embedded";
  readonly model = "tiny";
  readonly vocab = 512;
  readonly roles = ["serve"];
  readonly ownerRole = "serve";
  readonly kinds: FaultKind[] = ["kill", "second_owner"];
  readonly skipped: Record<string, string> = {};
  private proc: ClusterProcess | undefined;
  private readonly lives: string[] = [];
  private lifeNo = 0;
  private closed = false;

  private constructor(
    private readonly o: EmbeddedTargetOptions,
    private readonly config: Config,
    private readonly configPath: string,
    private readonly logDir: string,
    private readonly fs: SmallFs | undefined,
    private readonly relay: PausableRelay | undefined,
  ) {
    if (fs) this.kinds.push("disk_full");
    if (relay) this.kinds.push("s3_pause");
  }

  get url(): string {
    return `http://127.0.0.1:${this.o.port}`;
  }

  static async start(o: EmbeddedTargetOptions): Promise<EmbeddedTarget> {
    const dataDir = join(o.dir, "data");
    const logDir = join(o.dir, "logs");
    await mkdir(dataDir, { recursive: true });
    await mkdir(logDir, { recursive: true });
    const fs = smallFs(64 << 20, dataDir);
    const relay = o.s3Endpoint ? await PausableRelay.start(new URL(o.s3Endpoint)) : undefined;
    const base = resolveConfig({}, {});
    const config: Config = {
      ...base,
      pages: { ...base.pages, physicalPages: PAGES },
      store: {
        ...base.store,
        dataDir,
        s3: relay
          ? {
              ...base.store.s3,
              enabled: true,
              endpoint: relay.endpoint,
              bucket: o.bucket,
              createBucket: true,
            }
          : base.store.s3,
      },
      controller: { ...base.controller, httpPort: o.port },
      worker: { ...base.worker, threads: 1 },
    };
    const configPath = join(o.dir, "serve.json");
    await writeFile(configPath, `${JSON.stringify(config, null, 2)}\n`);
    const t = new EmbeddedTarget(o, config, configPath, logDir, "unavailable" in fs ? undefined : fs, relay);
    if ("unavailable" in fs) t.skipped.disk_full = fs.unavailable;
    if (!relay) t.skipped.s3_pause = "no S3 server";
    try {
      await t.spawn();
    } catch (err) {
      await t.close();
      throw err;
    }
    return t;
  }

  private async spawn(): Promise<void> {
    const name = `serve-${++this.lifeNo}`;
    const p = spawnRole(name, "serve", this.configPath, this.logDir, { CONTINUUM_LOG_LEVEL: "debug" });
    this.proc = p;
    this.lives.push(p.log);
    const deadline = Date.now() + READY_MS;
    for (;;) {
      const r = await call({ url: this.url, method: "GET", path: "/health", deadlineMs: 2_000 });
      if (r.kind === "ok" && alive(p.pid)) return;
      if (!alive(p.pid)) throw new Error(`${name} exited before it served: ${tailOf(p.log)}`);
      if (Date.now() > deadline)
        throw new Error(`${name} did not serve within ${READY_MS} ms: ${tailOf(p.log)}`);
      await sleep(200);
    }
  }

  async kill(): Promise<void> {
    const p = this.proc!;
    process.kill(p.pid, "SIGKILL");
    while (alive(p.pid)) await sleep(20);
    await this.spawn();
  }

  async secondOwner(): Promise<{ refused: boolean; detail: string }> {
    const owner = this.proc!.pid;
    const p = spawnRole(`serve-second-${this.lifeNo}`, "serve", this.configPath, this.logDir, {
      PORT: "0",
    });
    this.lives.push(p.log);
    const deadline = Date.now() + 30_000;
    while (alive(p.pid) && Date.now() < deadline) await sleep(100);
    if (alive(p.pid)) {
      process.kill(p.pid, "SIGKILL");
      return { refused: false, detail: "a second serve on the data dir was still running after 30 s" };
    }
    const out = tailOf(p.log);
    const refused = out.includes(`in use by pid ${owner}`);
    return { refused, detail: refused ? `refused, naming pid ${owner}` : `not refused as expected: ${out}` };
  }

  fillDisk(): void {
    this.fs!.fill();
  }
  freeDisk(): void {
    this.fs!.free();
  }
  pauseS3(): void {
    this.relay!.pause();
  }
  resumeS3(): void {
    this.relay!.resume();
  }

  pids(): Record<string, number> {
    return this.proc ? { serve: this.proc.pid } : {};
  }

  async settle(): Promise<void> {
    if (!this.proc || !alive(this.proc.pid)) await this.spawn();
  }

  async pagesVerdicts(): Promise<Verdict[]> {
    return [{ name: "pages back to baseline", ...(await fullPoolRequest(this.url, this.model, PAGES)) }];
  }

  /** Stops the server (SIGINT), then reads its log at rest and checks its chunk files and S3 objects. */
  async stateVerdicts(): Promise<Verdict[]> {
    await this.stopServe();
    const { txs, db } = await readCatalog(this.config, { logPath: embeddedLogPath(this.config) });
    const acked = acknowledgedNodes(this.lives);
    return [
      ...catalogVerdicts(txs, db, acked),
      ...(await replicaVerdicts(
        db,
        () => join(this.config.store.dataDir, "store"),
        this.relay ? this.config.store.s3 : undefined,
        this.o.s3Endpoint,
      )),
    ];
  }

  private async stopServe(): Promise<void> {
    const p = this.proc;
    this.proc = undefined;
    if (p && alive(p.pid)) await stopProcess(p.pid, 20_000);
  }

  logs(): readonly string[] {
    return this.lives;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.stopServe();
    this.relay?.resume();
    await this.relay?.close();
    if (this.fs) {
      this.fs.free();
      this.fs.unmount();
    }
  }
}

/** The last lines of a process log, on one line. */
function tailOf(log: string): string {
  return (
    tail(log, 4)
      .replace(/\s*\n\s*/g, " | ")
      .slice(0, 600) || "(empty log)"
  );
}
