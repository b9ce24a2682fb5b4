import { Effect } from "effect";
import { createLogger } from "../../schema/log.ts";
import { resource } from "../../schema/scope.ts";
import { WorkerAgent } from "../../worker/agent/agent.ts";
import { KvGeometry } from "../../worker/checkpoint/chunk-format.ts";
import { Prefetcher } from "../../worker/prefetch/prefetcher.ts";
import { DurableCache } from "../../worker/restore/durable-cache.ts";
import { WorkerRuntime } from "../../worker/runtime/runtime.ts";
import { ConstraintCompiler } from "../../worker/structured/constraint.ts";
import {
  probeSamples,
  probeTiers,
  WarmStart,
  warmCatalog,
  warmEngine,
  warmStep,
} from "../../worker/warm/warm-start.ts";
import type { Command } from "../command.ts";
import { openModelEngine } from "../embedded/model.ts";
import { ownDataDirs } from "../embedded/startup.ts";
import {
  durableTiers,
  fleetSnapshots,
  openCatalogLog,
  pollLogEnd,
  requireKafka,
  workerCacheConfig,
  workerIdentity,
  workerStatus,
} from "../fleet.ts";
import { parseRoleArgs } from "../options.ts";
import { runScoped } from "../run-scoped.ts";
import { runtimeOptions } from "../runtime-options.ts";

const usage = [
  "Usage: continuum worker [--config FILE]",
  "",
  "One inference worker of a fleet: the worker runtime on the native engine, its agent",
  "(a WebSocket to worker.controllerUrl: heartbeats, offers, tokens) and its durable prefix",
  "cache (RAM, local files, S3 when store.s3.enabled) on the shared catalog.",
  "",
  "  worker.index          picks the worker id (worker-<index>, unless worker.id is set)",
  "                        and the peer port (worker.peerPortBase + index)",
  "  worker.controllerUrl  ws://HOST:PORT of the controller's worker socket (controller.workerPort)",
  "  worker.peerHost       the address the peer port listens on and other workers reach it at",
  "                        (default 127.0.0.1); GET /ready there answers 200 once warm and connected",
  "  auth.clusterSecret    the controller's shared secret (sent as a bearer token)",
  "  worker.token          this worker's own token (default: controller.workerTokens[id]),",
  "                        sent instead of the shared secret",
  "  catalog.log           must be kafka (catalog.brokers, catalog.topics)",
  "  store.dir.path        this worker's chunk files (default <store.dataDir>/workers/<id>/store)",
  "  worker.durableReuse   false: no checkpoints and no restores (only resident pages are reused)",
  "  worker.peerTransfer   false: no chunks served to or read from other workers (S3 is shared)",
  "  worker.prefetch.*     chunks placed on this worker (controller.placement) pulled into its",
  "                        RAM/SSD ahead of demand, on a bounded queue beside the runtime",
  "  model.variant         auto (this engine's execution variant) or the variant it must compute:",
  "                        chunks are reused only between workers of one variant; the controller",
  "                        routes to the variant its own model.variant names",
  "",
  "Environment overrides: CONTINUUM_WORKER_INDEX, CONTINUUM_WORKER_CONTROLLER_URL,",
  "CONTINUUM_AUTH_CLUSTER_SECRET, CONTINUUM_CATALOG_BROKERS, ... Ctrl-C stops it cleanly.",
].join("\n");

const command: Command = {
  summary: "run one fleet worker (runtime + agent connected to the controller + catalog replica)",
  usage,
  async run(argv) {
    const { config } = parseRoleArgs(argv, {});
    requireKafka(config, "worker");
    const { id: workerId, peerPort } = workerIdentity(config);
    const log = createLogger({ fields: { role: "worker", workerId } });
    return runScoped(
      Effect.gen(function* () {
        // Warm start (worker/warm/): every one-time cost paid before the worker says it is ready.
        const warm = new WarmStart();
        const loadStart = performance.now();
        const cacheConfig = workerCacheConfig(config, workerId);
        const storeDir = cacheConfig.store.dir.path;
        // One owner per worker directory (its chunk files), before anything is written there.
        yield* ownDataDirs([storeDir], storeDir);
        // The controller routes to this worker only if it routes the engine's execution variant.
        const { model, id: modelId, engine, variant } = yield* openModelEngine(config, log, storeDir);
        warm.mark("model", performance.now() - loadStart);
        // This worker's durable prefixes: RAM and local files of its own (one
        // directory per worker id, so workers sharing a data dir never share a
        // store), S3 when store.s3.enabled, on the fleet's shared Kafka catalog.
        // It registers the model and the worker (with its peer address) once
        // the worker is warm, and is released after the runtime stops.
        const catalogLog = yield* resource(
          () => openCatalogLog(config, workerId),
          (l) => l.close(),
        );
        // The catalog log's end, polled (not asked per heartbeat), for the replica's lag in the status.
        const logEnd = yield* resource(
          () => pollLogEnd(catalogLog, 2_000),
          (p) => p.stop(),
        );
        const snapshots = yield* resource(
          () => fleetSnapshots(config),
          (st) => st?.close(),
        );
        const durable = yield* resource(
          () =>
            DurableCache.open({
              engine,
              fingerprint: model.fingerprint,
              modelName: modelId,
              layout: model.manifest.layout,
              config: cacheConfig,
              log: catalogLog,
              logger: log,
              peerPort,
              ...(snapshots ? { snapshots } : {}),
              // Registered once warm, below: nobody plans on this worker before it is ready.
              deferRegistration: true,
            }),
          (c) => c.close(),
        );
        // worker.durableReuse false: the cache stays open (its replica, its
        // registration) but the runtime gets no checkpoint or restore hooks and
        // the heartbeats advertise no durable tiers, so nothing is captured,
        // published or restored; only this pool's resident prefixes are reused.
        const reuse = config.worker.durableReuse;
        const runtime = yield* resource(
          () => {
            const rt = new WorkerRuntime(engine, {
              ...runtimeOptions(config, model, log),
              ...(reuse ? durable.hooks : {}),
            });
            rt.start();
            return rt;
          },
          (rt) => rt.stop(),
        );
        const kvBytesPerToken = KvGeometry.of(model.config.spec).tokenBytes;
        // Prefetch of placed chunks starts once the worker is warm and registered (below): before that,
        // its fresh RAM replicas would race register()'s withdrawal of an earlier life's RAM replicas.
        let prefetcher: Prefetcher | null = null;
        const agent = yield* resource(
          () => {
            const a = new WorkerAgent(runtime, {
              workerId,
              controllerUrl: config.worker.controllerUrl,
              // Its own token (set, or found in a config shared with the controller), else the shared secret.
              clusterSecret:
                config.worker.token || config.controller.workerTokens[workerId] || config.auth.clusterSecret,
              fingerprint: model.fingerprint,
              maxContext: model.config.spec.maxPosition,
              pageTokens: config.pages.pageTokens,
              chunkTokens: config.pages.chunkTokens,
              kvBytesPerToken,
              durableTiers: reuse ? durableTiers(cacheConfig.store) : [],
              stopTokenIds: model.eosTokenIds,
              constraints: new ConstraintCompiler(model.tokenizer.tokenBytes()),
              heartbeatIntervalMs: config.worker.heartbeatIntervalMs,
              reconnectBaseMs: 100,
              reconnectMaxMs: 5_000,
              fenceMemory: 4096,
              maxQueuedBytes: 16 << 20,
              log,
              status: () =>
                workerStatus({
                  runtime: runtime.stats(),
                  restore: durable.restorer.stats(),
                  checkpoint: durable.checkpointer.stats(),
                  ...(prefetcher ? { prefetch: prefetcher.stats() } : {}),
                  catalogOffset: durable.replica.offset(),
                  logEnd: logEnd.value,
                  chunkTokens: config.pages.chunkTokens,
                  kvBytesPerToken,
                }),
            });
            return a;
          },
          (a) => a.stop(),
        );
        // (catch: the failure itself, so the exit names its cause, not "An error occurred in Effect.tryPromise".)
        yield* Effect.tryPromise({
          try: async () => {
            const probe = await warmStep(warm, "tiers", () =>
              probeTiers(durable.tiers, workerId, log, config.pages.chunkTokens * kvBytesPerToken),
            );
            if (config.worker.probeCosts) for (const s of probeSamples(probe)) runtime.calibrate(s);
            await warmStep(warm, "catalog", () =>
              warmCatalog(durable, runtime, config.pages.pageTokens, 60_000),
            );
            await warmStep(warm, "engine", () =>
              warmEngine(runtime, config.pages.pageTokens, model.config.spec.vocab),
            );
            await warmStep(warm, "registered", () => durable.register());
            log.log("info", "worker.warm", { steps: warm.report(), probe });
          },
          catch: (e) => e,
        });
        // Prefetch: released before the agent and the durable cache (it uses its tiers and replica).
        const pf = config.worker.prefetch;
        prefetcher =
          reuse && pf.enabled
            ? yield* resource(
                () =>
                  new Prefetcher({
                    tiers: durable.tiers,
                    catalog: durable.catalog,
                    peerSecret: cacheConfig.auth.clusterSecret,
                    maxQueued: pf.maxQueued,
                    // Pinned bytes leave room for one more chunk of any other put (a checkpoint's).
                    ramBytes: Math.max(
                      0,
                      Math.min(
                        pf.ramBytes,
                        cacheConfig.store.ram.maxBytes - 2 * config.pages.chunkTokens * kvBytesPerToken,
                      ),
                    ),
                    ssdBytes: pf.ssdBytes,
                    fetchTimeoutMs: pf.fetchTimeoutMs,
                    maxDeferMs: pf.maxDeferMs,
                    retryMs: pf.retryMs,
                    busy: () => {
                      const s = runtime.stats();
                      return s.waiting + s.running > 0;
                    },
                    logger: log.child({ part: "prefetch" }),
                  }),
                (p) => p.stop(),
              )
            : null;
        // Warm: the first heartbeat says ready, so the controller may offer work from the first one on.
        agent.markReady();
        agent.start();
        log.log("info", "worker.ready", {
          model: modelId,
          fingerprint: model.fingerprint,
          controller: config.worker.controllerUrl,
          engine: engine.backend,
          variant,
          threads: engine.threads,
          warmMs: Math.round(Object.values(warm.report()).reduce((a, b) => a + (b ?? 0), 0)),
        });
        process.stderr.write(
          `continuum: worker ${workerId} serving '${modelId}', connecting to ${config.worker.controllerUrl} (Ctrl-C to stop)\n`,
        );
        yield* Effect.tryPromise({ try: () => agent.connected, catch: (e) => e });
        // GET /ready on the peer port answers from the same state: warm and connected.
        durable.peer.markReady();
        log.log("info", "worker.connected", { controller: config.worker.controllerUrl });
        yield* Effect.never;
      }),
    );
  },
};
export default command;
