import { randomInt } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { EmbeddedTarget } from "../../deploy/chaos/embedded.ts";
import { FleetTarget } from "../../deploy/chaos/fleet.ts";
import { FAULT_KINDS } from "../../deploy/chaos/plan.ts";
import { type ChaosReport, formatReport, runChaos } from "../../deploy/chaos/run.ts";
import type { ChaosTarget } from "../../deploy/chaos/target.ts";
import { type RunningServices, startServices } from "../../deploy/cluster.ts";
import { type Command, UsageError } from "../command.ts";

const usage = [
  "Usage: continuum soak [--minutes N] [--target embedded|fleet|both] [--seed S] [--port P] [--json] [--keep]",
  "",
  "A longer chaos run for an operator: the same run as the CI chaos suite",
  "(test/e2e/chaos.test.ts, deploy/chaos/), for N minutes of faults per target (default 5).",
  "A steady workload (good completions over shared long prefixes, malformed requests",
  "among them, one slow client, 32 idle connections) runs while a seeded plan applies",
  "one fault every ~7.5 s: kill -9 of each role (serve; writers, controller, workers)",
  "and its restart, a second process on a data dir, the data dir's disk filled then",
  "freed (a 64 MiB tmpfs: needs root, else skipped and said so), S3 paused then resumed.",
  "Then it checks the invariants and prints the figures: requests and their outcomes,",
  "kills per role, faults per kind, and each invariant's verdict. Exit 0 when all hold.",
  "",
  "  --target   embedded (one `continuum serve`), fleet (`cluster up`: 2 writers, the",
  "             controller, 2 workers) or both (default)",
  "  --seed S   the plan's seed (default random; printed first, so a run can be repeated)",
  "  --port P   first port used: P (serve or controller HTTP), P+1 (worker socket),",
  "             P+2.. (worker peers), P+10 / P+12 (Kafka, S3 when started here); default 18080",
  "  --json     also print the report as one JSON line per target",
  "  --keep     keep the run's directory (logs, data) and print where it is",
  "",
  "Kafka and S3: CONTINUUM_KAFKA_BROKERS / CONTINUUM_S3_ENDPOINT when set, else started",
  "here (deploy/kafka.sh, deploy/s3proxy.sh) and stopped at the end.",
].join("\n");

/** One fault per this long: a kill's restart and a held fault fit in a slot. */
const SLOT_MS = 7_500;

const command: Command = {
  summary: "chaos soak: N minutes of faults under load, then the invariants and figures",
  usage,
  async run(argv) {
    let values: Record<string, string | boolean | undefined>;
    try {
      values = parseArgs({
        args: [...argv],
        options: {
          minutes: { type: "string" },
          target: { type: "string" },
          seed: { type: "string" },
          port: { type: "string" },
          json: { type: "boolean" },
          keep: { type: "boolean" },
        },
        strict: true,
        allowPositionals: false,
      }).values;
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
    const minutes = Number(values.minutes ?? "5");
    if (!(minutes > 0 && minutes <= 24 * 60))
      throw new UsageError(`--minutes must be in (0, 1440], got ${values.minutes}`);
    const which = (values.target as string | undefined) ?? "both";
    if (!["embedded", "fleet", "both"].includes(which))
      throw new UsageError(`--target must be embedded, fleet or both, got '${which}'`);
    const seed = values.seed === undefined ? randomInt(1, 2 ** 31) : Number(values.seed);
    if (!Number.isSafeInteger(seed)) throw new UsageError(`--seed must be an integer, got '${values.seed}'`);
    const port = Number(values.port ?? "18080");
    if (!Number.isInteger(port) || port < 1024 || port > 65_000)
      throw new UsageError(`--port must be in 1024..65000, got '${values.port}'`);
    const progress = (l: string) => process.stderr.write(`soak: ${l}\n`);
    progress(`seed ${seed} (--seed ${seed} repeats this plan)`);
    const dir = await mkdtemp(join(tmpdir(), "continuum-soak-"));
    const durationMs = Math.round(minutes * 60_000);
    const faults = (t: ChaosTarget) =>
      Math.max(FAULT_KINDS.length - 1 + t.roles.length, Math.round(durationMs / SLOT_MS));
    let services: (RunningServices & { stop?: () => Promise<void> }) | undefined;
    const reports: ChaosReport[] = [];
    try {
      const envBrokers = process.env.CONTINUUM_KAFKA_BROKERS;
      const envS3 = process.env.CONTINUUM_S3_ENDPOINT;
      services =
        envBrokers && envS3
          ? { brokers: envBrokers.split(",")[0]!, s3Endpoint: envS3 }
          : await startServices({ dir, kafkaPort: port + 10, s3Port: port + 12, progress });
      const runOne = async (t: ChaosTarget) => {
        try {
          const r = await runChaos(t, { seed, durationMs, faults: faults(t), clients: 3, progress });
          reports.push(r);
          process.stdout.write(`${formatReport(r)}\n`);
          if (values.json) process.stdout.write(`${JSON.stringify(r)}\n`);
        } finally {
          await t.close();
        }
      };
      if (which !== "fleet")
        await runOne(
          await EmbeddedTarget.start({
            dir: join(dir, "embedded"),
            port,
            s3Endpoint: services.s3Endpoint,
            bucket: `soak-${seed}`,
            progress,
          }),
        );
      if (which !== "embedded")
        await runOne(
          await FleetTarget.start({
            dir: join(dir, "fleet"),
            brokers: services.brokers,
            s3Endpoint: services.s3Endpoint,
            ports: { http: port, workerSocket: port + 1, peerBase: port + 2 },
            progress,
          }),
        );
    } finally {
      await services?.stop?.();
      if (values.keep) progress(`kept ${dir}`);
      else await rm(dir, { recursive: true, force: true });
    }
    return reports.every((r) => r.ok) ? 0 : 1;
  },
};
export default command;
