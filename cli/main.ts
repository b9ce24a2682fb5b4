import { readdir } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { type Command, UsageError } from "./command.ts";

const commandsDir = join(dirname(fileURLToPath(import.meta.url)), "commands");

/** Names of every subcommand, from the files in cli/commands. */
export async function commandNames(): Promise<string[]> {
  const files = await readdir(commandsDir);
  return files
    .filter((f) => f.endsWith(".ts"))
    .map((f) => basename(f, ".ts"))
    .sort();
}

export async function loadCommand(name: string): Promise<Command | undefined> {
  if (!(await commandNames()).includes(name)) return undefined;
  const mod = (await import(join(commandsDir, `${name}.ts`))) as { default: Command };
  return mod.default;
}

async function help(): Promise<string> {
  const lines = [
    "continuum — distributed, paged LLM inference",
    "",
    "Usage: continuum COMMAND [options]",
    "",
  ];
  for (const name of await commandNames()) {
    const cmd = await loadCommand(name);
    if (cmd) lines.push(`  ${name.padEnd(12)} ${cmd.summary}`);
  }
  lines.push("", "Run `continuum COMMAND --help` for a command's options.");
  return lines.join("\n");
}

export async function main(argv: readonly string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    console.log(await help());
    return name === undefined ? 2 : 0;
  }
  const cmd = await loadCommand(name);
  if (!cmd) {
    console.error(`continuum: unknown command '${name}'\n\n${await help()}`);
    return 2;
  }
  if (rest.includes("--help") || rest.includes("-h")) {
    console.log(cmd.usage);
    return 0;
  }
  try {
    return await cmd.run(rest);
  } catch (err) {
    if (err instanceof UsageError) {
      console.error(`continuum ${name}: ${err.message}\n\n${cmd.usage}`);
      return 2;
    }
    throw err;
  }
}
