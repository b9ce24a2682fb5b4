import { Effect } from "effect";
import { registerRestoreMetrics } from "../../controller/api/restore-metrics.ts";
import { createLogger } from "../../schema/log.ts";
import { resource } from "../../schema/scope.ts";
import { KvGeometry } from "../../worker/checkpoint/chunk-format.ts";
import { openEmbeddedCache } from "../../worker/restore/embedded.ts";
import { WorkerRuntime } from "../../worker/runtime/runtime.ts";
import { openFrontDoor } from "../api-server.ts";
import { type Command, UsageError } from "../command.ts";
import { openModelEngine } from "../embedded/model.ts";
import { EmbeddedService } from "../embedded/service.ts";
import { explainStartupError, ownDataDirs, registerDegradedMetric, serveDirs } from "../embedded/startup.ts";
import { configuredChatTemplate } from "../embedded/text-codec.ts";
import { workerStatus } from "../fleet.ts";
import { parseRoleArgs } from "../options.ts";
import { runScoped } from "../run-scoped.ts";
import { runtimeOptions } from "../runtime-options.ts";
import { embeddedWorkerView, webViewResource } from "../web-view.ts";

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
        yield* ownDataDirs(serveDirs(config), config.store.dataDir);
        const { model, id, engine, variant } = yield* openModelEngine(config, log, config.store.dataDir);
        const chatTemplate = yield* Effect.promise(() => configuredChatTemplate(config));
        // Durable prefixes (embedded catalog log + local chunk files): released after the runtime stops.
        const durable = yield* resource(
          () => openEmbeddedCache({ engine, model, modelName: id, config, logger: log }).catch(explain),
          (c) => c.close(),
        );
        const runtime = yield* resource(
          () => {
            const rt = new WorkerRuntime(engine, {
              ...runtimeOptions(config, model, log),
              ...durable.hooks,
            });
            rt.start();
            return rt;
          },
          (rt) => rt.stop(),
        );
        const restorer = durable.cache.restorer;
        const service = new EmbeddedService(runtime, model, id, () => restorer.stats().tokens, {
          chatTemplate,
          toolCallParser: config.model.toolCallParser,
        });
        const frontDoor = openFrontDoor({
          config,
          service,
          models: [{ id, dir: model.dir }],
          catalog: durable.cache.replica,
          log,
        });
        registerRestoreMetrics(frontDoor.server.metrics, () => restorer.stats());
        // The embedded log's writer is in this process, so the replica's lag is only what is in flight.
        yield* webViewResource(config, frontDoor.server, {
          mode: "embedded",
          workers: () => {
            const stats = runtime.stats();
            const offset = durable.cache.replica.offset();
            return [
              embeddedWorkerView(
                stats,
                workerStatus({
                  runtime: stats,
                  restore: restorer.stats(),
                  checkpoint: durable.cache.checkpointer.stats(),
                  catalogOffset: offset,
                  logEnd: offset,
                  chunkTokens: config.pages.chunkTokens,
                  kvBytesPerToken: KvGeometry.of(model.config.spec).tokenBytes,
                }),
              ),
            ];
          },
          catalog: () => ({ offset: durable.cache.replica.offset(), lag: 0 }),
          decisions: null,
        });
        registerDegradedMetric(frontDoor.server.metrics, config.store.dataDir, durable.cache.tiers.s3);
        const port = yield* resource(
          () => frontDoor.server.start(),
          () => frontDoor.close(),
        );
        log.log("info", "serve.ready", {
          url: `http://${config.controller.host}:${port}`,
          model: id,
          engine: engine.backend,
          variant,
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
