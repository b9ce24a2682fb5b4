import { Effect } from "effect";
import { registerRestoreMetrics } from "../../controller/api/restore-metrics.ts";
import { createLogger } from "../../schema/log.ts";
import { openEmbeddedCache } from "../../worker/restore/embedded.ts";
import { loadEngine } from "../../worker/runtime/engine-load.ts";
import { WorkerRuntime } from "../../worker/runtime/runtime.ts";
import { openFrontDoor } from "../api-server.ts";
import { type Command, UsageError } from "../command.ts";
import { durableReuseAllowed, ensureModel } from "../embedded/model.ts";
import { EmbeddedService } from "../embedded/service.ts";
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
        const { model, id } = yield* Effect.promise(() => ensureModel(config, log));
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
          () => openEmbeddedCache({ engine, model, modelName: id, config, logger: log }),
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
        const restorer = durable.cache.restorer;
        const service = new EmbeddedService(runtime, model, id, () => restorer.stats().tokens);
        const frontDoor = openFrontDoor({
          config,
          service,
          models: [{ id, dir: model.dir, eosTokenIds: model.eosTokenIds, vocab: model.config.spec.vocab }],
          catalog: durable.cache.replica,
          log,
        });
        registerRestoreMetrics(frontDoor.server.metrics, () => restorer.stats());
        const port = yield* resource(
          () => frontDoor.server.start(),
          () => frontDoor.close(),
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
        yield* Effect.never;
      }),
    );
  },
};
export default command;
