import { readdir } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { type Bench, type BenchJson, benchEnv } from "../../bench/contract.ts";
import { type Command, UsageError } from "../command.ts";

const benchDir = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "bench");
const notBenches = new Set(["contract"]);

async function benchNames(): Promise<string[]> {
  const files = await readdir(benchDir);
  return files
    .filter((f) => f.endsWith(".ts"))
    .map((f) => basename(f, ".ts"))
    .filter((n) => !notBenches.has(n) && !n.startsWith("_"))
    .sort();
}

/**
 * Runs one benchmark and prints its report: progress lines and figures on
 * stdout, or under `json` progress on stderr and the BenchJson as the last
 * stdout line.
 */
export async function runBench(
  name: string,
  bench: Bench,
  opts: { quick: boolean; json: boolean },
): Promise<void> {
  const { quick, json } = opts;
  const log = json ? (l: string) => process.stderr.write(`${l}\n`) : (l: string) => console.log(l);
  const report = await bench.run({ quick, log });
  const out: BenchJson = {
    bench: name,
    quick,
    figures: report.figures,
    ratios: report.ratios,
    env: { ...benchEnv(), ...report.env },
  };
  if (json) {
    console.log(JSON.stringify(out));
  } else {
    for (const [k, v] of Object.entries(out.figures)) console.log(`${k.padEnd(40)} ${v}`);
    for (const [k, v] of Object.entries(out.ratios)) console.log(`${k.padEnd(40)} ${v}`);
  }
}

const command: Command = {
  summary: "run a benchmark: continuum bench NAME [--quick] [--json]",
  usage: [
    "Usage: continuum bench NAME [--quick] [--json]",
    "",
    "  --quick   a shorter run (under 60 s on a 2-core machine)",
    "  --json    print one JSON object as the last line of stdout:",
    '            {"bench", "quick", "figures", "ratios", "env"}',
    "",
    "Benchmarks report figures and side-by-side ratios; they never fail on timing.",
    "Run `continuum bench --list` for the names.",
  ].join("\n"),
  async run(argv) {
    const { values, positionals } = parseArgs({
      args: [...argv],
      options: { quick: { type: "boolean" }, json: { type: "boolean" }, list: { type: "boolean" } },
      allowPositionals: true,
      strict: true,
    });
    const names = await benchNames();
    if (values.list) {
      for (const n of names) {
        const mod = (await import(join(benchDir, `${n}.ts`))) as { default: Bench };
        console.log(`${n.padEnd(10)} ${mod.default.summary}`);
      }
      return 0;
    }
    const [name, ...extra] = positionals;
    if (name === undefined) throw new UsageError("missing benchmark NAME");
    if (extra.length > 0) throw new UsageError(`unexpected arguments: ${extra.join(" ")}`);
    if (!names.includes(name)) {
      throw new UsageError(`unknown benchmark '${name}'; known: ${names.join(", ") || "(none)"}`);
    }
    const mod = (await import(join(benchDir, `${name}.ts`))) as { default: Bench };
    await runBench(name, mod.default, { quick: values.quick ?? false, json: values.json ?? false });
    return 0;
  },
};
export default command;
