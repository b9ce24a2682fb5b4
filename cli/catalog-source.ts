import { ConsoleError, embeddedLogPath, openTxSource, type TxSource } from "../catalog/console.ts";
import { Replica } from "../catalog/replica.ts";
import { ConfigError, loadConfig } from "../schema/config-load.ts";

/** What `console`, `tail` and `replay` read the catalog from: --brokers (split), --log, --config. */
export interface CatalogArgs {
  readonly brokers: readonly string[] | undefined;
  readonly log: string | undefined;
  readonly config: string | undefined;
}

/** `--brokers a,b` → its non-empty names. */
export function brokerList(text: string | undefined): string[] | undefined {
  return text?.split(",").filter((b) => b !== "");
}

/**
 * Runs `use` on the tx log the arguments name (Kafka with brokers, else a
 * copy of the embedded log: catalog/console.ts openTxSource) and closes it
 * after. A ConsoleError or ConfigError is printed as `continuum NAME: …` and
 * the command exits 1; any other error is thrown on.
 */
export async function withTxSource(
  name: string,
  args: CatalogArgs,
  use: (source: TxSource) => Promise<number>,
): Promise<number> {
  let source: TxSource | undefined;
  try {
    const cfg = loadConfig(args.config);
    source = await openTxSource({ brokers: args.brokers, logPath: args.log ?? embeddedLogPath(cfg), cfg });
    return await use(source);
  } catch (err) {
    if (err instanceof ConsoleError || err instanceof ConfigError) {
      console.error(`continuum ${name}: ${err.message}`);
      return 1;
    }
    throw err;
  } finally {
    await source?.close();
  }
}

/** withTxSource with a replica of that log, caught up before `use` runs and stopped before the log closes. */
export function withReplica(
  name: string,
  args: CatalogArgs,
  use: (replica: Replica, source: TxSource) => Promise<number>,
): Promise<number> {
  return withTxSource(name, args, async (source) => {
    const replica = await Replica.start({ log: source.log, warn: (m) => console.error(m) });
    try {
      await replica.catchUp();
      return await use(replica, source);
    } finally {
      await replica.stop();
    }
  });
}
