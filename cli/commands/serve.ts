import { Effect } from "effect";
import { ConsoleError, runQuery } from "../../catalog/console.ts";
import { badRequest } from "../../controller/api/errors.ts";
import { registerRestoreMetrics } from "../../controller/api/restore-metrics.ts";
import { ApiServer } from "../../controller/api/server.ts";
import { createLogger } from "../../schema/log.ts";
import { openEmbeddedCache } from "../../worker/restore/embedded.ts";
import { loadEngine } from "../../worker/runtime/engine-load.ts";
import { WorkerRuntime } from "../../worker/runtime/runtime.ts";
import { type Command, UsageError } from "../command.ts";
import { durableReuseAllowed, ensureModel } from "../embedded/model.ts";
import { EmbeddedService } from "../embedded/service.ts";
import {
  explainStartupError,
  lockDirs,
  registerDegradedMetric,
  requireFreeSpace,
  serveDirs,
} from "../embedded/startup.ts";
import { parseRoleArgs } from "../options.ts";
import { resource, runScoped } from "../run-scoped.ts";
import { runtimeOptions } from "../runtime-options.ts";

const usage = [
  "Usage: continuum serve [--config FILE] [--port N] [--host H]",
  "",
  "The embedded default: the whole system in one process — the OpenAI-compatible HTTP",
  "API, one worker runtime on the native engine (worker.backend: auto = CUDA when built and a",
  "device is present, else CPU), and the model (model.dir, or the",
  "generated `model.preset` under store.dataDir, written on first start).",
  "Listens on 127.0.0.1:8080 unless PORT, --port or controller.httpPort say otherwise.",
  "Ctrl-C stops it cleanly.",
].join("\n");

const command: Command = {
  summary: "run the embedded default (HTTP API + one worker in one process); `npm start`",
  usage,
  async run(argv) {
    const { config, values } = parseRoleArgs(argv, { port: { type: "string" }, host: { type: "string" } });
    if (values.port !== undefined) {
      const port = Number(values.port);
      if (!Number.isInteger(port) || port < 0 || port > 65535)
        throw new UsageError(`--port must be 0..65535, got ${values.port}`);
      config.controller.httpPort = port;
    }
    if (typeof values.host === "string") config.controller.host = values.host;
    const log = createLogger({ fields: { role: "embedded" } });
    return runScoped(
      Effect.gen(function* () {
        const explain = (err: unknown) => {
          throw explainStartupError(err, config.store.dataDir);
        };
        // One owner per data dir, before anything is written to it (the generated model included).
        yield* resource(
          () => {
            try {
              const locks = lockDirs(serveDirs(config));
              requireFreeSpace(config.store.dataDir);
              return locks;
            } catch (err) {
              return explain(err);
            }
          },
          (locks) => {
            for (const l of locks.reverse()) l.release();
          },
        );
        const { model, id } = yield* Effect.promise(() => ensureModel(config, log).catch(explain));
        const engine = yield* resource(
          () =>
            loadEngine(model, config.pages, {
              ...(config.worker.threads ? { threads: config.worker.threads } : {}),
              backend: config.worker.backend,
            }),
          (e) => e.free(),
        );
        // Durable prefixes (embedded catalog log + local chunk files): released after the runtime stops.
        const durable = yield* resource(
          () => openEmbeddedCache({ engine, model, modelName: id, config, logger: log }).catch(explain),
          (c) => c.close(),
        );
        // No checkpoints or restores from an engine whose numerics are not the fingerprint's: see engineMatchesVariant.
        const exact = durableReuseAllowed(true, engine.backend, model.manifest.variant, log);
        const runtime = yield* resource(
          () => {
            const rt = new WorkerRuntime(engine, {
              ...runtimeOptions(config, model, log),
              ...(exact ? durable.hooks : {}),
            });
            rt.start();
            return rt;
          },
          (rt) => rt.stop(),
        );
        const catalog = durable.cache.catalog;
        const restorer = durable.cache.restorer;
        const service = new EmbeddedService(
          runtime,
          model,
          id,
          async (query, _args, rules) => {
            try {
              return runQuery(catalog.db.datalog(), query, rules);
            } catch (err) {
              if (err instanceof ConsoleError) throw badRequest(err.message, "query");
              throw err;
            }
          },
          () => restorer.stats().tokens,
        );
        const server = new ApiServer(service, {
          host: config.controller.host,
          port: config.controller.httpPort,
          tokens: config.auth.tokens,
          log: ({ event, ...fields }) => log.log("info", String(event), fields),
        });
        registerRestoreMetrics(server.metrics, () => restorer.stats());
        registerDegradedMetric(server.metrics, config.store.dataDir, durable.cache.tiers.s3);
        const port = yield* resource(
          () => server.start(),
          () => server.close(),
        );
        log.log("info", "serve.ready", {
          url: `http://${config.controller.host}:${port}`,
          model: id,
          engine: engine.backend,
          threads: engine.threads,
        });
        process.stderr.write(
          `continuum: serving model '${id}' on http://${config.controller.host}:${port}/v1 (Ctrl-C to stop)\n`,
        );
        // Serves until stopped, or until the catalog writer gives up for good (its bound on
        // consecutive failures): then the process fails with the writer's error.
        const stopped = yield* Effect.promise(() => durable.writerStopped);
        return yield* Effect.fail(new Error(`the catalog writer stopped: ${stopped.message}`));
      }),
    );
  },
};
export default command;
