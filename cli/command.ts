/**
 * A subcommand of `continuum`. Each lives in `cli/commands/<name>.ts` and
 * default-exports one of these; the dispatcher discovers them by file name, so
 * adding a command never edits a shared list.
 */
export interface Command {
  /** One line for `continuum --help`. */
  readonly summary: string;
  /** Full usage text for `continuum NAME --help`. */
  readonly usage: string;
  /** Runs the command; resolves with the process exit code. */
  run(argv: readonly string[]): Promise<number>;
}

/** A usage error: printed with the command's usage, exit code 2. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

/** Runs an argument parser (node:util parseArgs); its errors (unknown option, missing value) become usage errors. */
export function parseUsage<T>(parse: () => T): T {
  try {
    return parse();
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}
