import { parseArgs } from "node:util";
import type { Config } from "../schema/config.ts";
import { ConfigError, loadConfig } from "../schema/config-load.ts";
import { parseUsage, UsageError } from "./command.ts";

/** Parses `--config FILE` plus a role's own options; loads and validates the configuration. */
export function parseRoleArgs<O extends Record<string, { type: "string" | "boolean" }>>(
  argv: readonly string[],
  options: O,
): { config: Config; values: Record<keyof O, string | boolean | undefined> } {
  const parsed = parseUsage(() =>
    parseArgs({
      args: [...argv],
      options: { config: { type: "string" }, ...options },
      strict: true,
      allowPositionals: false,
    }),
  );
  const values = parsed.values as Record<string, string | boolean | undefined>;
  try {
    return { config: loadConfig(values.config as string | undefined), values: values as never };
  } catch (err) {
    if (err instanceof ConfigError) throw new UsageError(err.message);
    throw err;
  }
}
