import type { Command } from "./command.ts";
import { UsageError } from "./command.ts";
import { runBench } from "./commands/bench.ts";

/**
 * The `continuum` command for one file: the subcommands a worker on a
 * machine without the repository needs, reachable without the commands
 * directory that cli/main.ts lists at run time, so esbuild can bundle it
 * (native/gpu-serve-check.sh). Each command is imported when it runs, so
 * `model init` runs before the native addon exists.
 *
 *   node continuum.mjs serve|model|worker ...      as `continuum serve|model|worker ...`
 *   node continuum.mjs bench gpu [--quick] [--json]
 */
const commands: Record<string, () => Promise<Command>> = {
  serve: async () => (await import("./commands/serve.ts")).default,
  model: async () => (await import("./commands/model.ts")).default,
  worker: async () => (await import("./commands/worker.ts")).default,
};

async function main(argv: readonly string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === "bench") {
    const [which, ...flags] = rest;
    if (which !== "gpu") throw new UsageError(`this build has only the gpu benchmark, got '${which ?? ""}'`);
    const unknown = flags.filter((f) => f !== "--quick" && f !== "--json");
    if (unknown.length > 0) throw new UsageError(`unexpected arguments: ${unknown.join(" ")}`);
    const bench = (await import("../bench/gpu.ts")).default;
    await runBench("gpu", bench, { quick: flags.includes("--quick"), json: flags.includes("--json") });
    return 0;
  }
  const load = name === undefined ? undefined : commands[name];
  if (load === undefined) {
    console.error(`continuum (bundled): commands are ${[...Object.keys(commands), "bench gpu"].join(", ")}`);
    return 2;
  }
  const cmd = await load();
  if (rest.includes("--help") || rest.includes("-h")) {
    console.log(cmd.usage);
    return 0;
  }
  return cmd.run(rest);
}

try {
  process.exitCode = await main(process.argv.slice(2));
} catch (err) {
  if (!(err instanceof UsageError)) throw err;
  console.error(`continuum: ${err.message}`);
  process.exitCode = 2;
}
