import { copyFile, mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import datascript, { type DB } from "datascript";
import { ATTRIBUTES } from "../schema/catalog.ts";
import type { Config } from "../schema/config.ts";
import { KafkaLog } from "./kafka/log.ts";
import type { TxLogReader } from "./log.ts";
import { EmbeddedLog } from "./log-embedded.ts";

/**
 * The Datalog console's logic: query text in, result or a clear error out.
 *
 * Catalog attributes are stored under plain string names ("chunk/node"), as
 * DataScript's JavaScript API does; in query and rule text they are written
 * as keywords (`:chunk/node`) like any Datalog, and rewritten to the strings
 * before DataScript sees them. A keyword in a catalog namespace that names no
 * attribute is an error listing the namespace's attributes, so a typo is not
 * a silently empty result. Every failure is a ConsoleError with one line of
 * text; nothing the user types produces a stack trace.
 */
export class ConsoleError extends Error {
  override readonly name = "ConsoleError";
}

const NAMESPACES = new Set(Object.keys(ATTRIBUTES).map((a) => a.slice(0, a.indexOf("/"))));
const KEYWORD_CHAR = /[A-Za-z0-9*+!_?<>=/.-]/;
const PAIRS: Record<string, string> = { "(": ")", "[": "]", "{": "}" };

/** Where the open brackets stand: [] when balanced; throws on a mismatched closer or an unterminated string. */
export function openBrackets(text: string): string[] {
  const stack: string[] = [];
  for (let i = 0; i < text.length; i++) {
    const ch = text[i]!;
    if (ch === '"') {
      i++;
      while (i < text.length && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
      if (i >= text.length) throw new ConsoleError("parse error: unterminated string");
    } else if (ch === ";") {
      while (i < text.length && text[i] !== "\n") i++;
    } else if (ch in PAIRS) {
      stack.push(PAIRS[ch]!);
    } else if (ch === ")" || ch === "]" || ch === "}") {
      const want = stack.pop();
      if (want !== ch)
        throw new ConsoleError(
          `parse error: unexpected '${ch}' at character ${i + 1}${want ? ` (expected '${want}')` : ""}`,
        );
    }
  }
  return stack;
}

/** Rewrites catalog keywords to attribute strings; rejects unknown catalog attributes and unbalanced text. */
export function prepareEdn(text: string, what: "query" | "rules"): string {
  const open = openBrackets(text);
  if (open.length > 0)
    throw new ConsoleError(`parse error: ${what} ends before '${open.reverse().join("")}'`);
  let out = "";
  for (let i = 0; i < text.length; i++) {
    const ch = text[i]!;
    if (ch === '"') {
      const start = i;
      i++;
      while (i < text.length && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
      out += text.slice(start, i + 1);
    } else if (ch === ";") {
      while (i < text.length && text[i] !== "\n") i++;
      out += "\n";
    } else if (ch === ":" && (i === 0 || !KEYWORD_CHAR.test(text[i - 1]!))) {
      let j = i + 1;
      while (j < text.length && KEYWORD_CHAR.test(text[j]!)) j++;
      const kw = text.slice(i + 1, j);
      const slash = kw.indexOf("/");
      const ns = slash > 0 ? kw.slice(0, slash) : "";
      if (NAMESPACES.has(ns)) {
        if (!(kw in ATTRIBUTES)) {
          const known = Object.keys(ATTRIBUTES).filter((a) => a.startsWith(`${ns}/`));
          throw new ConsoleError(
            `unknown attribute :${kw}; ${ns} has ${known.map((a) => `:${a}`).join(" ")}`,
          );
        }
        out += JSON.stringify(kw);
      } else {
        out += `:${kw}`;
      }
      i = j - 1;
    } else {
      out += ch;
    }
  }
  return out;
}

/** Runs a Datalog query (with optional rules, bound to `%`) against a db. */
export function runQuery(db: DB, query: string, rules?: string): unknown {
  const trimmed = query.trim();
  if (trimmed === "") throw new ConsoleError("empty query");
  if (!trimmed.startsWith("[") && !trimmed.startsWith("{"))
    throw new ConsoleError(
      "parse error: a query is an EDN vector [:find … :where …] or map {:find … :where …}",
    );
  const q = prepareEdn(trimmed, "query");
  const inputs: unknown[] = [db];
  if (rules !== undefined) {
    const r = prepareEdn(rules.trim(), "rules");
    if (!/:in\s[^:]*%/.test(q))
      throw new ConsoleError("rules given but the query has no % in its :in clause (e.g. :in $ %)");
    inputs.push(r);
  }
  try {
    return datascript.q(q, ...inputs);
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    const kind = /EOF|Unexpected|Invalid token|Unmatched|read/i.test(msg) ? "parse error" : "query error";
    throw new ConsoleError(`${kind}: ${msg.split("\n")[0]}`);
  }
}

function sortKey(v: unknown): string {
  return JSON.stringify(v) ?? "";
}

/** Text output: one row per line (sorted, since Datalog results are sets), values separated by two spaces. */
export function formatResult(result: unknown, json: boolean): string {
  if (json) return JSON.stringify(result);
  if (!Array.isArray(result)) return result === null || result === undefined ? "nil" : JSON.stringify(result);
  const rows = [...result].sort((a, b) => (sortKey(a) < sortKey(b) ? -1 : sortKey(a) > sortKey(b) ? 1 : 0));
  const lines = rows.map((row) =>
    Array.isArray(row) ? row.map((v) => JSON.stringify(v)).join("  ") : JSON.stringify(row),
  );
  lines.push(`(${rows.length} ${rows.length === 1 ? "row" : "rows"})`);
  return lines.join("\n");
}

/** The attribute list, for `.attrs` in the REPL. */
export function describeAttributes(): string {
  return Object.entries(ATTRIBUTES)
    .map(([a, s]) => `:${a.padEnd(28)} ${s.type.padEnd(7)} ${"unique" in s ? "unique " : ""}${s.doc}`)
    .join("\n");
}

// ------------------------------------------------------------ where the log is

/** The embedded log file of the single-process default. */
export function embeddedLogPath(cfg: Pick<Config, "store">): string {
  return join(cfg.store.dataDir, "catalog", "embedded.log");
}

/** Where replicas keep catalog snapshots by default. */
export function snapshotDir(cfg: Config): string {
  return join(cfg.store.dataDir, "catalog", "snapshots");
}

export interface TxSource {
  readonly log: TxLogReader;
  /** Human description for messages. */
  readonly where: string;
  close(): Promise<void>;
}

/**
 * Opens the tx log for reading: Kafka when brokers are given, else the
 * embedded log file. The embedded file belongs to the process that writes it
 * (opening recovers and may truncate a torn tail), so the console reads a
 * private copy taken at start: it sees every tx committed before then.
 */
export async function openTxSource(opts: {
  readonly brokers?: readonly string[];
  readonly logPath: string;
  readonly cfg: Config;
}): Promise<TxSource> {
  if (opts.brokers !== undefined && opts.brokers.length > 0) {
    const log = await KafkaLog.open({
      brokers: opts.brokers,
      clientId: `${opts.cfg.catalog.clientId}-console-${process.pid}`,
      topics: opts.cfg.catalog.topics,
    });
    return {
      log,
      where: `Kafka ${opts.brokers.join(",")} topic ${opts.cfg.catalog.topics.tx}`,
      close: () => log.close(),
    };
  }
  try {
    await stat(opts.logPath);
  } catch {
    throw new ConsoleError(
      `no embedded catalog log at ${opts.logPath} (start the server first, or pass --log FILE or --brokers)`,
    );
  }
  const dir = await mkdtemp(join(tmpdir(), "continuum-console-"));
  const copy = join(dir, "embedded.log");
  await copyFile(opts.logPath, copy);
  const log = await EmbeddedLog.open({ path: copy });
  return {
    log,
    where: opts.logPath,
    close: async () => {
      await log.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
