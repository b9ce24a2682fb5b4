import { parseArgs } from "node:util";
import {
  defaultSimOptions,
  type Fault,
  Faults,
  InvariantViolation,
  RoutingPolicies,
  type RoutingPolicy,
  simulate,
} from "../../controller/sim/simulate.ts";
import { type Command, UsageError } from "../command.ts";

function intArg(name: string, raw: string | undefined, fallback: number, min: number, max: number): number {
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (!/^-?\d+$/.test(raw) || !Number.isSafeInteger(n) || n < min || n > max) {
    throw new UsageError(`--${name} must be an integer in ${min}..${max}, got '${raw}'`);
  }
  return n;
}

function parseFaults(raw: string | undefined): Set<Fault> {
  const out = new Set<Fault>();
  if (raw === undefined || raw === "" || raw === "none") return out;
  if (raw === "all") return new Set(Faults);
  for (const f of raw.split(",").map((s) => s.trim())) {
    if (!(Faults as readonly string[]).includes(f)) {
      throw new UsageError(`unknown fault '${f}'; known: ${Faults.join(", ")}, all`);
    }
    out.add(f as Fault);
  }
  return out;
}

const command: Command = {
  summary: "deterministic failure simulation of the router and fenced assignments",
  usage: [
    "Usage: continuum sim [--seed N] [--workers W] [--requests R] [--faults LIST] [--policy P] [--json]",
    "",
    "  --seed N        PRNG seed (default 1); the same seed gives the same trace hash",
    "  --workers W     simulated workers (default 4)",
    "  --requests R    requests in the workload (default 200)",
    `  --faults LIST   comma-separated: ${Faults.join(",")} (or all, none)`,
    `  --policy P      ${RoutingPolicies.join(" | ")} (default ttft: this router)`,
    "  --json          print the summary as one JSON line",
    "",
    "Invariants are checked after every step; a violation exits 1 naming the seed and step.",
  ].join("\n"),
  async run(argv) {
    const { values, positionals } = parseArgs({
      args: [...argv],
      options: {
        seed: { type: "string" },
        workers: { type: "string" },
        requests: { type: "string" },
        faults: { type: "string" },
        policy: { type: "string" },
        json: { type: "boolean" },
      },
      allowPositionals: true,
      strict: true,
    });
    if (positionals.length > 0) throw new UsageError(`unexpected arguments: ${positionals.join(" ")}`);
    const seed = intArg("seed", values.seed, 1, 0, Number.MAX_SAFE_INTEGER);
    const workers = intArg("workers", values.workers, 4, 1, 1024);
    const requests = intArg("requests", values.requests, 200, 0, 1_000_000);
    const policy = values.policy ?? "ttft";
    if (!(RoutingPolicies as readonly string[]).includes(policy)) {
      throw new UsageError(`unknown policy '${policy}'; known: ${RoutingPolicies.join(", ")}`);
    }
    const options = {
      ...defaultSimOptions(seed, workers, requests),
      faults: parseFaults(values.faults),
      policy: policy as RoutingPolicy,
    };
    let summary: ReturnType<typeof simulate>;
    try {
      summary = simulate(options);
    } catch (err) {
      if (err instanceof InvariantViolation) {
        console.error(`continuum sim: ${err.message}`);
        return 1;
      }
      throw err;
    }
    if (values.json) {
      console.log(JSON.stringify(summary));
      return 0;
    }
    const s = summary;
    const failed = Object.entries(s.failed)
      .map(([k, v]) => `${k} ${v}`)
      .join(", ");
    console.log(`seed ${s.seed}  policy ${s.policy}  faults ${s.faults.join(",") || "none"}`);
    console.log(`trace sha256 ${s.traceHash}  (${s.steps} steps, ${s.endMs} ms simulated)`);
    console.log(
      `requests ${s.requests}: completed ${s.completed}, failed ${s.requests - s.completed}${failed ? ` (${failed})` : ""}`,
    );
    console.log(`ttft mean ${s.meanTtftMs.toFixed(1)} ms, p99 ${s.p99TtftMs.toFixed(1)} ms`);
    console.log(
      `load per worker ${Object.entries(s.load)
        .map(([w, n]) => `${w}:${n}`)
        .join(" ")}  (max/mean ${s.maxOverMeanLoad.toFixed(2)})`,
    );
    console.log(
      `attempts ${s.attempts}, late messages ignored ${s.lateIgnored}, duplicates ${s.duplicates}; ` +
        `messages sent ${s.messages.sent}, lost ${s.messages.lost}, duplicated ${s.messages.duplicated}; ` +
        `crashes ${s.crashes}, restarts ${s.restarts}, partitions ${s.partitions}`,
    );
    return 0;
  },
};
export default command;
