import { readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import { type Config, defaultConfig } from "./config.ts";
import { type Rule, rules } from "./config-rules.ts";

/** Configuration loading: defaults, then a file, then the environment, each leaf checked by its rule. */

export class ConfigError extends Error {
  override readonly name = "ConfigError";
  constructor(readonly problems: readonly string[]) {
    super(`invalid configuration:\n  ${problems.join("\n  ")}`);
  }
}

function envName(path: string): string {
  return `CONTINUUM_${path
    .replace(/\./g, "_")
    .replace(/([a-z0-9])([A-Z])/g, "$1_$2")
    .toUpperCase()}`;
}

/** Converts one raw value (file or environment) by its rule; returns an error text or the value. */
function coerce(
  path: string,
  rule: Rule,
  raw: unknown,
  fromEnv: boolean,
): { ok: unknown } | { error: string } {
  switch (rule.kind) {
    case "int": {
      const n = fromEnv && typeof raw === "string" && raw.trim() !== "" ? Number(raw) : raw;
      if (typeof n !== "number" || !Number.isInteger(n))
        return { error: `${path}: expected an integer, got ${JSON.stringify(raw)}` };
      if (n < rule.min || n > rule.max) return { error: `${path}: ${n} is outside ${rule.min}..${rule.max}` };
      return { ok: n };
    }
    case "number": {
      const n = fromEnv && typeof raw === "string" && raw.trim() !== "" ? Number(raw) : raw;
      if (typeof n !== "number" || !Number.isFinite(n))
        return { error: `${path}: expected a number, got ${JSON.stringify(raw)}` };
      if (n < rule.min || n > rule.max) return { error: `${path}: ${n} is outside ${rule.min}..${rule.max}` };
      return { ok: n };
    }
    case "string":
      if (typeof raw !== "string") return { error: `${path}: expected a string, got ${JSON.stringify(raw)}` };
      if (!rule.allowEmpty && raw === "") return { error: `${path}: must not be empty` };
      if (rule.pattern && !rule.pattern.re.test(raw))
        return { error: `${path}: expected ${rule.pattern.means}, got ${JSON.stringify(raw)}` };
      return { ok: raw };
    case "enum":
      if (typeof raw !== "string" || !rule.values.includes(raw)) {
        return { error: `${path}: expected one of ${rule.values.join("|")}, got ${JSON.stringify(raw)}` };
      }
      return { ok: raw };
    case "bool": {
      if (fromEnv && (raw === "true" || raw === "1")) return { ok: true };
      if (fromEnv && (raw === "false" || raw === "0")) return { ok: false };
      if (typeof raw !== "boolean")
        return { error: `${path}: expected true or false, got ${JSON.stringify(raw)}` };
      return { ok: raw };
    }
    case "strings": {
      const list = fromEnv && typeof raw === "string" ? raw.split(",").map((s) => s.trim()) : raw;
      if (!Array.isArray(list) || list.some((s) => typeof s !== "string" || s === "")) {
        return { error: `${path}: expected a list of non-empty strings, got ${JSON.stringify(raw)}` };
      }
      return { ok: list };
    }
    case "record": {
      let rec = raw;
      if (fromEnv && typeof raw === "string") {
        try {
          rec = JSON.parse(raw);
        } catch {
          return { error: `${path}: expected a JSON object, got ${JSON.stringify(raw)}` };
        }
      }
      if (typeof rec !== "object" || rec === null || Array.isArray(rec)) {
        return { error: `${path}: expected an object of strings` };
      }
      for (const [k, v] of Object.entries(rec)) {
        if (typeof v !== "string") return { error: `${path}.${k}: expected a string` };
      }
      return { ok: rec };
    }
  }
}

function getPath(obj: unknown, path: string): unknown {
  let cur = obj;
  for (const key of path.split(".")) {
    if (typeof cur !== "object" || cur === null) return undefined;
    cur = (cur as Record<string, unknown>)[key];
  }
  return cur;
}

function setPath(obj: Record<string, unknown>, path: string, value: unknown): void {
  const keys = path.split(".");
  let cur = obj;
  for (const key of keys.slice(0, -1)) cur = cur[key] as Record<string, unknown>;
  cur[keys[keys.length - 1]!] = value;
}

/** Every leaf path present in a parsed file that has no rule (typos). */
function unknownPaths(obj: unknown, prefix = ""): string[] {
  if (typeof obj !== "object" || obj === null || Array.isArray(obj)) return [];
  const out: string[] = [];
  for (const [k, v] of Object.entries(obj)) {
    const path = prefix ? `${prefix}.${k}` : k;
    if (path in rules) continue;
    const isSection = Object.keys(rules).some((r) => r.startsWith(`${path}.`));
    if (!isSection) out.push(`${path}: unknown setting`);
    else out.push(...unknownPaths(v, path));
  }
  return out;
}

/**
 * Builds the configuration: defaults, then the file's values, then the
 * environment. Throws ConfigError naming every bad field; returns a fresh
 * object the caller may keep.
 */
export function resolveConfig(file: unknown, env: Record<string, string | undefined> = process.env): Config {
  const problems: string[] = [];
  if (file !== undefined && (typeof file !== "object" || file === null || Array.isArray(file))) {
    throw new ConfigError(["the configuration file must hold an object"]);
  }
  problems.push(...unknownPaths(file));
  const config = structuredClone(defaultConfig) as unknown as Record<string, unknown>;
  for (const [path, rule] of Object.entries(rules)) {
    const fromFile = getPath(file, path);
    if (fromFile !== undefined) {
      const r = coerce(path, rule, fromFile, false);
      if ("error" in r) problems.push(r.error);
      else setPath(config, path, r.ok);
    }
    const name = path === "controller.httpPort" && env.PORT !== undefined ? "PORT" : envName(path);
    const fromEnv = env[name];
    if (fromEnv !== undefined) {
      const r = coerce(`${path} (from ${name})`, rule, fromEnv, true);
      if ("error" in r) problems.push(r.error);
      else setPath(config, path, r.ok);
    }
  }
  const http = (config as unknown as Config).controller.http;
  if (http.headersTimeoutMs > http.requestTimeoutMs)
    problems.push(
      `controller.http.headersTimeoutMs: ${http.headersTimeoutMs} exceeds controller.http.requestTimeoutMs (${http.requestTimeoutMs})`,
    );
  if (problems.length > 0) throw new ConfigError(problems);
  return config as unknown as Config;
}

/** Reads a JSON or YAML file (by extension; YAML otherwise) and resolves it. */
export function loadConfig(
  path: string | undefined,
  env: Record<string, string | undefined> = process.env,
): Config {
  if (path === undefined) return resolveConfig(undefined, env);
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    throw new ConfigError([`cannot read config file ${path}: ${(err as Error).message}`]);
  }
  let parsed: unknown;
  try {
    parsed = path.endsWith(".json") ? JSON.parse(text) : parseYaml(text);
  } catch (err) {
    throw new ConfigError([`cannot parse config file ${path}: ${(err as Error).message}`]);
  }
  return resolveConfig(parsed ?? {}, env);
}

/** The environment variable that overrides a config path (for docs and errors). */
export const configEnvName = envName;
