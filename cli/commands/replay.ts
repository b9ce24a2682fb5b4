import { parseArgs } from "node:util";
import { readDecisions } from "../../controller/replay/records.ts";
import { type ReplayReport, replay } from "../../controller/replay/replay.ts";
import type { TtftWeights } from "../../controller/router.ts";
import { brokerList, withReplica } from "../catalog-source.ts";
import { type Command, parseUsage, UsageError } from "../command.ts";

const TERMS: readonly (keyof TtftWeights)[] = ["queue", "fetch", "upload", "prefill", "firstToken"];

/** `--weight prefill=1.3` (repeatable) → weights; an unknown term or a bad number is a usage error. */
export function parseWeights(args: readonly string[]): Partial<TtftWeights> | undefined {
  if (args.length === 0) return undefined;
  const out: Partial<Record<keyof TtftWeights, number>> = {};
  for (const a of args) {
    const m = /^([A-Za-z]+)=(.+)$/.exec(a);
    if (!m) throw new UsageError(`--weight takes TERM=NUMBER, got '${a}'`);
    const term = m[1] as keyof TtftWeights;
    if (!TERMS.includes(term))
      throw new UsageError(`--weight: unknown term '${m[1]}'; known: ${TERMS.join(", ")}`);
    const x = Number(m[2]);
    if (!Number.isFinite(x) || x < 0 || x > 100)
      throw new UsageError(`--weight ${term}: expected a number in 0..100, got '${m[2]}'`);
    out[term] = x;
  }
  return out;
}

const r1 = (x: number | null) => (x === null ? null : Math.round(x * 10) / 10);

function printReport(r: ReplayReport): void {
  console.log(`${r.requests} recorded requests on ${r.workers} workers`);
  console.log(
    `recorded (measured):  mean TTFT ${r1(r.recorded.meanTtftMs)} ms, p99 ${r1(r.recorded.p99TtftMs)} ms`,
  );
  console.log(
    `simulated true costs: the heartbeats' × ${r.corrections.prefill.toFixed(2)} (prefill, first token), × ${r.corrections.fetch.toFixed(2)} (restores)`,
  );
  console.log("predicted under the recorded workload:");
  for (const [name, v] of Object.entries(r.variants)) {
    const w = TERMS.map((t) => `${t}=${v.weights[t]}`).join(" ");
    console.log(
      `  ${name.padEnd(12)} mean ${String(r1(v.meanTtftMs)).padStart(9)} ms  p99 ${String(r1(v.p99TtftMs)).padStart(9)} ms  completed ${v.completed}${v.failed ? `, failed ${v.failed}` : ""}  [${v.policy}; ${w}]`,
    );
  }
  const e = r.error;
  console.log(
    `live router's prediction error over ${e.measured} measured requests: p90 |predicted − measured| / measured ${r1(e.relativeErrorP90 === null ? null : e.relativeErrorP90 * 100)} %, within 25 %: ${r1(e.withinQuarter === null ? null : e.withinQuarter * 100)} %`,
  );
  for (const [term, t] of Object.entries(e.terms))
    console.log(
      `  ${term.padEnd(8)} n ${t.n}  predicted ${r1(t.predictedMeanMs)} ms  measured ${r1(t.measuredMeanMs)} ms  bias ${r1(t.biasMs)} ms  p90 |error| ${r1(t.p90AbsErrorMs)} ms  measured/predicted ${t.measuredOverPredicted === null ? "-" : t.measuredOverPredicted.toFixed(2)}`,
    );
}

const command: Command = {
  summary: "replay recorded routing decisions through the simulator under other policies and weights",
  usage: [
    "Usage: continuum replay [--brokers HOST:PORT,... | --log FILE] [--config FILE] [--model FP]",
    "                        [--seed N] [--weight TERM=X]... [--json]",
    "",
    "Reads every routing decision recorded in a catalog (decision.recorded with its candidates,",
    "the router's inputs and the measured outcome) and reports:",
    "  - predicted mean and p99 TTFT of the recorded workload through the simulator, per policy:",
    "    live (the recorded router and weights), round_robin, prefix (most cached tokens),",
    "    and weighted (the live router with the --weight changes), same world and seed;",
    "  - the live router's prediction error: overall, and by term (queue, fetch, prefill).",
    "",
    "  --brokers        read the catalog from Kafka (topics: catalog.topics of the config)",
    "  --log FILE       read an embedded catalog log (default <dataDir>/catalog/embedded.log)",
    "  --model FP       only decisions for this model fingerprint",
    "  --seed N         the simulator's seed (default 1): same records and seed, same figures",
    `  --weight TERM=X  a weight of the weighted variant (repeatable); TERM: ${TERMS.join(", ")}`,
    "  --json           one JSON object on stdout",
  ].join("\n"),
  async run(argv) {
    const { values } = parseUsage(() => parse(argv));
    const seedText = values.seed ?? "1";
    const seed = Number(seedText);
    if (!/^\d+$/.test(seedText) || !Number.isSafeInteger(seed))
      throw new UsageError(`--seed must be a non-negative integer, got '${seedText}'`);
    const weights = parseWeights(values.weight ?? []);
    const catalog = { brokers: brokerList(values.brokers), log: values.log, config: values.config };
    return withReplica("replay", catalog, async (replica, source) => {
      const read = readDecisions(replica.catalog, values.model);
      const report = replay(read.decisions, { seed, ...(weights ? { weights } : {}) });
      if (report === null) {
        console.error(
          `continuum replay: no decision with recorded inputs in ${source.where}` +
            (read.withoutInputs > 0 ? ` (${read.withoutInputs} older records carry none)` : ""),
        );
        return 1;
      }
      if (values.json) console.log(JSON.stringify({ ...report, withoutInputs: read.withoutInputs }));
      else {
        printReport(report);
        if (read.withoutInputs > 0)
          console.log(`(${read.withoutInputs} older records without inputs skipped)`);
      }
      return 0;
    });
  },
};

function parse(argv: readonly string[]) {
  return parseArgs({
    args: [...argv],
    options: {
      brokers: { type: "string" },
      log: { type: "string" },
      config: { type: "string" },
      model: { type: "string" },
      seed: { type: "string" },
      weight: { type: "string", multiple: true },
      json: { type: "boolean" },
    },
    strict: true,
  });
}

export default command;
