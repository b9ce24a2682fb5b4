import { resolve } from "node:path";
import { parseArgs } from "node:util";
import {
  clusterDown,
  clusterStatus,
  clusterUp,
  MAX_WORKERS,
  readState,
  workerLines,
} from "../../deploy/cluster.ts";
import { ConfigError, loadConfig } from "../../schema/config-load.ts";
import { type Command, UsageError } from "../command.ts";

const usage = [
  "Usage: continuum cluster up     [--workers N] [--config FILE] [--dir DIR] [--kafka-port P] [--s3-port P]",
  "       continuum cluster status [--dir DIR] [--json]",
  "       continuum cluster down   [--dir DIR]",
  "",
  "A local fleet on 127.0.0.1, every part its own detached process: the Kafka broker",
  "(deploy/kafka.sh, KRaft), the S3 server (deploy/s3proxy.sh), two catalog writers",
  "(active + standby), the controller and N workers (default 2, at most 16).",
  "",
  "  up      starts them in order, waiting (bounded) for each to be ready, and prints",
  "          where the API is. The fleet config (FILE with CONTINUUM_* overrides, plus",
  "          the cluster's broker, S3 endpoint and a generated cluster secret) is written",
  "          to DIR/fleet.json; pids and ports to DIR/state.json; logs to DIR/logs/<name>.log.",
  "          Ports: controller.httpPort / controller.workerPort / worker.peerPortBase + index",
  "          from the config; Kafka on --kafka-port (default 19092, +1 for its controller),",
  "          S3 on --s3-port (default 19000).",
  "  status  each process alive or not, the services, the controller's health, workers",
  "          connected (from the controller's hub); per worker (its heartbeats, through the",
  "          controller's GET /workers): pages free and resident, cache hits by tier (prompt",
  "          tokens from resident pages, chunks restored from ram/ssd/peer/s3), chunks",
  "          published, and its catalog replica's offset and lag; the controller's own",
  "          replica offset and lag, and cache tokens by source. Exit 0 when everything is",
  "          up, 1 otherwise.",
  "  down    stops the processes in reverse order (SIGTERM, 15 s, then SIGKILL), then S3",
  "          and Kafka through their scripts.",
  "",
  "DIR defaults to <store.dataDir>/cluster (.continuum/cluster).",
].join("\n");

const options = {
  workers: { type: "string" },
  config: { type: "string" },
  dir: { type: "string" },
  "kafka-port": { type: "string" },
  "s3-port": { type: "string" },
  json: { type: "boolean" },
} as const;

function port(name: string, v: string | undefined, dflt: number): number {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > 65534)
    throw new UsageError(`--${name} must be a port, got '${v}'`);
  return n;
}

const out = (line: string) => process.stdout.write(`${line}\n`);

const command: Command = {
  summary: "bring a local multi-process fleet up, show its status, or bring it down",
  usage,
  async run(argv) {
    const [sub, ...rest] = argv;
    let values: Record<string, string | boolean | undefined>;
    try {
      values = parseArgs({ args: rest, options, strict: true, allowPositionals: false }).values;
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
    let config: ReturnType<typeof loadConfig>;
    try {
      config = loadConfig(values.config as string | undefined);
    } catch (err) {
      if (err instanceof ConfigError) throw new UsageError(err.message);
      throw err;
    }
    const dir = resolve((values.dir as string | undefined) ?? `${config.store.dataDir}/cluster`);
    switch (sub) {
      case "up": {
        const w = (values.workers as string | undefined) ?? "2";
        const workers = Number(w);
        if (!Number.isInteger(workers) || workers < 1 || workers > MAX_WORKERS)
          throw new UsageError(`--workers must be an integer in [1, ${MAX_WORKERS}], got '${w}'`);
        const state = await clusterUp({
          dir,
          workers,
          config,
          kafkaPort: port("kafka-port", values["kafka-port"] as string | undefined, 19092),
          s3Port: port("s3-port", values["s3-port"] as string | undefined, 19000),
          readyTimeoutMs: 180_000,
          progress: (l) => out(`cluster: ${l}`),
        });
        out(`cluster: up. API ${state.api}/v1 (OpenAI-compatible), workers on ${state.workerSocket}`);
        out(`cluster: config ${state.configPath}, logs ${dir}/logs, state ${dir}/state.json`);
        out("cluster: `continuum cluster status` to inspect, `continuum cluster down` to stop");
        return 0;
      }
      case "status": {
        const state = await readState(dir);
        if (!state) {
          out(`cluster: no cluster state in ${dir} (not up)`);
          return 1;
        }
        const s = await clusterStatus(state);
        if (values.json) {
          out(JSON.stringify({ api: state.api, ...s }));
        } else {
          out(`kafka ${state.kafka.brokers}: ${s.kafka ? "running" : "DOWN"}`);
          out(`s3 ${state.s3.endpoint}: ${s.s3 ? "running" : "DOWN"}`);
          for (const p of s.processes)
            out(
              `${p.name.padEnd(12)} pid ${String(p.pid).padEnd(8)} ${p.alive ? "alive" : "DEAD "}  ${p.log}`,
            );
          out(`controller ${state.api}: ${s.controllerHealthy ? "healthy" : "not answering"}`);
          for (const [id, st] of Object.entries(s.workers)) out(`  ${id}: ${st}`);
          for (const line of workerLines(s.fleet)) out(`  ${line}`);
          for (const [k, v] of Object.entries(s.metrics)) out(`  ${k} ${v}`);
        }
        const up = s.kafka && s.s3 && s.controllerHealthy && s.processes.every((p) => p.alive);
        return up ? 0 : 1;
      }
      case "down": {
        const state = await readState(dir);
        if (!state) {
          out(`cluster: no cluster state in ${dir} (nothing to stop)`);
          return 0;
        }
        await clusterDown(state, (l) => out(`cluster: ${l}`));
        out("cluster: down");
        return 0;
      }
      default:
        throw new UsageError(
          sub === undefined ? "cluster needs up, status or down" : `unknown cluster command '${sub}'`,
        );
    }
  },
};
export default command;
