/**
 * Structured logs: one JSON object per line, one line per event, with the
 * request id and assignment attempt where there is one. Every process writes
 * to stderr so stdout stays free for command output (and bench JSON).
 */
export type LogLevel = "debug" | "info" | "warn" | "error";

const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export interface Logger {
  log(level: LogLevel, event: string, fields?: Record<string, unknown>): void;
  /** A logger that adds these fields to every line (e.g. role, worker id). */
  child(fields: Record<string, unknown>): Logger;
}

export interface LoggerOptions {
  readonly level?: LogLevel;
  readonly write?: (line: string) => void;
  readonly fields?: Record<string, unknown>;
}

export function createLogger(opts: LoggerOptions = {}): Logger {
  const min =
    ORDER[opts.level ?? (process.env.CONTINUUM_LOG_LEVEL as LogLevel | undefined) ?? "info"] ?? ORDER.info;
  const write = opts.write ?? ((line: string) => process.stderr.write(`${line}\n`));
  const base = opts.fields ?? {};
  return {
    log(level, event, fields) {
      if (ORDER[level] < min) return;
      write(JSON.stringify({ t: new Date().toISOString(), level, event, ...base, ...fields }, jsonSafe));
    },
    child(fields) {
      return createLogger({ ...opts, fields: { ...base, ...fields } });
    },
  };
}

/** A logger that drops everything (tests, benchmarks). */
export const silentLogger: Logger = {
  log() {},
  child() {
    return silentLogger;
  },
};

function jsonSafe(_key: string, value: unknown): unknown {
  if (typeof value === "bigint") return value.toString();
  if (value instanceof Error) return { name: value.name, message: value.message };
  return value;
}
