import { parseArgs } from "node:util";
import { Effect } from "effect";
import { CatalogDb } from "../../catalog/db.ts";
import { KafkaLog } from "../../catalog/kafka/log.ts";
import { CatalogWriter } from "../../catalog/writer.ts";
import { loadConfig } from "../../schema/config-load.ts";
import { createLogger } from "../../schema/log.ts";
import { resource } from "../../schema/scope.ts";
import { type Command, UsageError } from "../command.ts";
import { runScoped } from "../run-scoped.ts";

/**
 * `continuum writer --config F`: the catalog writer as its own process, for a
 * fleet on Kafka. Start two: one becomes active, the other waits as a standby
 * and takes over (fencing the first) when it dies. Logs one JSON line per
 * event on stderr (writer.standby, writer.active, writer.lease_lost,
 * writer.stopped). SIGTERM/SIGINT close its scope: the writer stops, then its log.
 */
const command: Command = {
  summary: "run the catalog writer (Kafka): proposals → validated, numbered catalog.tx",
  usage: [
    "Usage: continuum writer [--config FILE]",
    "",
    "  --config FILE   JSON or YAML configuration; catalog.log must be kafka.",
    "                  CONTINUUM_CATALOG_BROKERS etc. override it.",
    "",
    "Run two for a standby: exactly one is active at a time.",
  ].join("\n"),
  async run(argv) {
    let values: { config?: string | undefined };
    try {
      ({ values } = parseArgs({ args: [...argv], options: { config: { type: "string" } }, strict: true }));
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
    const config = loadConfig(values.config);
    if (config.catalog.log !== "kafka") {
      throw new UsageError(
        "catalog.log is 'embedded': the embedded log's writer runs inside the single-process server; a separate writer process needs catalog.log: kafka",
      );
    }
    const logger = createLogger({ fields: { role: "catalog-writer", pid: process.pid } });
    return runScoped(
      Effect.gen(function* () {
        const log = yield* resource(
          () =>
            KafkaLog.open({
              brokers: config.catalog.brokers,
              clientId: `${config.catalog.clientId}.writer`,
              topics: config.catalog.topics,
            }),
          (l) => l.close(),
        );
        // Runs until stopped (the scope closes: Ctrl-C, SIGTERM) or it gives up for good.
        const writer = yield* resource(
          () => {
            const w = new CatalogWriter({ log, newDb: () => CatalogDb.empty(), logger });
            const running = w.run();
            running.catch(() => undefined); // handled below; never an unhandled rejection meanwhile
            return { w, running };
          },
          async ({ w, running }) => {
            await w.stop();
            await running.catch(() => undefined);
          },
        );
        yield* Effect.tryPromise({
          try: () => writer.running,
          catch: (err) => {
            logger.log("error", "writer.failed", { error: (err as Error).message });
            return err;
          },
        });
      }),
    );
  },
};

export default command;
