import { Effect } from "effect";
import { Replica } from "../../catalog/replica.ts";
import { defaultAssignmentLimits } from "../../controller/assignments.ts";
import { DecisionRecorder } from "../../controller/fleet/decisions.ts";
import { DemandWindow } from "../../controller/fleet/demand.ts";
import { WorkerHub } from "../../controller/fleet/hub.ts";
import { registerFleetMetrics } from "../../controller/fleet/metrics.ts";
import { FleetService } from "../../controller/fleet/service.ts";
import { PlacementAuthority } from "../../controller/placement/authority.ts";
import { defaultRouterPolicy, roundRobinRouterPolicy } from "../../controller/router.ts";
import { RecentDecisions } from "../../controller/ui/recent-decisions.ts";
import { createLogger } from "../../schema/log.ts";
import { resource } from "../../schema/scope.ts";
import { openFrontDoor } from "../api-server.ts";
import type { Command } from "../command.ts";
import { ensureModelIdentity } from "../embedded/model.ts";
import { configuredChatTemplate, textCodec } from "../embedded/text-codec.ts";
import { fleetSnapshots, openCatalogLog, pollLogEnd, requireKafka } from "../fleet.ts";
import { parseRoleArgs } from "../options.ts";
import { runScoped } from "../run-scoped.ts";
import { webViewResource } from "../web-view.ts";

const usage = [
  "Usage: continuum controller [--config FILE]",
  "",
  "The fleet controller: the OpenAI-compatible HTTP API (controller.host:httpPort), the",
  "worker socket (WebSocket on controller.workerPort) that workers connect to, the TTFT",
  "router with fenced assignments, and a catalog replica (catalog.log must be kafka).",
  "",
  "  controller.heartbeatTtlMs     a worker silent this long is offline",
  "  controller.offerTimeoutMs     an offer not accepted in this time moves on (attempt + 1)",
  "  controller.progressTimeoutMs  accept → first token, and between tokens",
  "  controller.residentFreshMs    resident prefixes are trusted this long after a heartbeat",
  "  auth.clusterSecret            workers must present it as a bearer token",
  "  controller.workerTokens       worker id → that worker's own token; a listed worker must",
  "                                present it (the shared secret then admits only the others)",
  "  auth.tokens                   API bearer tokens → tenants",
  "  controller.placement.*        the placement authority (one controller at a time, under a",
  "                                catalog lease): hot prefixes placed in workers' RAM/SSD",
  "",
  "The model (model.dir or the generated model.preset) must be the one the workers serve:",
  "the controller tokenizes and fingerprints it. Ctrl-C stops it cleanly.",
].join("\n");

const command: Command = {
  summary: "run the fleet controller (HTTP API + worker socket + router + catalog replica)",
  usage,
  async run(argv) {
    const { config } = parseRoleArgs(argv, {});
    requireKafka(config, "controller");
    const log = createLogger({ fields: { role: "controller" } });
    const c = config.controller;
    return runScoped(
      Effect.gen(function* () {
        // Tokenizer and fingerprint only: the controller runs no model, so it never holds the weights.
        const { model, id: modelId } = yield* Effect.promise(() => ensureModelIdentity(config, log));
        const chatTemplate = yield* Effect.promise(() => configuredChatTemplate(config));
        const catalogLog = yield* resource(
          () => openCatalogLog(config, "controller"),
          (l) => l.close(),
        );
        const snapshots = yield* resource(
          () => fleetSnapshots(config),
          (st) => st?.close(),
        );
        // The controller is the fleet's snapshot writer; every replica reads them.
        const replica = yield* resource(
          () =>
            Replica.start({
              log: catalogLog,
              warn: (message) => log.log("warn", "catalog.replica", { message }),
              ...(snapshots ? { snapshots, snapshotEvery: config.catalog.snapshotEvery } : {}),
            }),
          (r) => r.stop(),
        );
        // Catalog lag = the log's end − the replica's offset; the end is polled, not asked per scrape.
        const logEnd = yield* resource(
          () => pollLogEnd(catalogLog, 2_000),
          (p) => p.stop(),
        );
        const hub = yield* resource(
          async () => {
            const h = new WorkerHub({
              host: c.host,
              port: c.workerPort,
              clusterSecret: config.auth.clusterSecret,
              workerTokens: c.workerTokens,
              ttlMs: c.heartbeatTtlMs,
              log,
            });
            await h.start();
            return h;
          },
          (h) => h.close(),
        );
        const recorder = yield* resource(
          () => new DecisionRecorder(catalogLog, { clientId: c.id, log }),
          (r) => r.close(),
        );
        const pl = c.placement;
        const recent = config.controller.ui ? new RecentDecisions() : undefined;
        const service = yield* resource(
          () =>
            new FleetService(
              hub,
              {
                db: () => replica.catalog,
                lag: () => Math.max(0, logEnd.value - replica.offset()),
              },
              recorder,
              {
                model: {
                  id: modelId,
                  fingerprint: model.fingerprint,
                  maxContext: model.config.spec.maxPosition,
                  codec: textCodec(model, chatTemplate, undefined, config.model.toolCallParser),
                },
                chunkTokens: config.pages.chunkTokens,
                limits: {
                  ...defaultAssignmentLimits,
                  offerTimeoutMs: c.offerTimeoutMs,
                  progressTimeoutMs: c.progressTimeoutMs,
                },
                policy: {
                  ...(c.routing === "round_robin" ? roundRobinRouterPolicy : defaultRouterPolicy),
                  weights: { ...c.ttftWeights },
                  peers: config.worker.peerTransfer,
                  heartbeatTtlMs: c.heartbeatTtlMs,
                  residentFreshMs: c.residentFreshMs,
                },
                maxActive: 4096,
                tickMs: 50,
                log,
                ...(recent ? { recent } : {}),
                ...(pl.enabled
                  ? {
                      demand: {
                        window: new DemandWindow(model.fingerprint, 4096),
                        everyMs: pl.demandWindowMs,
                      },
                    }
                  : {}),
              },
            ),
          (s) => s.close(),
        );
        if (pl.enabled) {
          yield* resource(
            () => {
              const a = new PlacementAuthority(replica, catalogLog, {
                key: `placement/${model.fingerprint}`,
                holder: c.id,
                fingerprint: model.fingerprint,
                intervalMs: pl.intervalMs,
                leaseTtlMs: pl.leaseTtlMs,
                halfLifeMs: pl.halfLifeMs,
                maxDemandNodes: 65_536,
                budgetBytes: { ram: pl.ramBytesPerWorker, ssd: pl.ssdBytesPerWorker },
                policy: {
                  minDemand: pl.minDemand,
                  maxReplicas: pl.maxReplicas,
                  spread: pl.spread,
                  maxChanges: pl.maxChanges,
                },
                workers: () => service.placeableWorkers(),
                log: log.child({ part: "placement" }),
              });
              a.start();
              return a;
            },
            (a) => a.stop(),
          );
        }
        const frontDoor = openFrontDoor({
          config,
          service,
          models: [{ id: modelId, dir: model.dir }],
          catalog: replica,
          log,
        });
        registerFleetMetrics(frontDoor.server.metrics, {
          hub,
          service,
          heartbeatTtlMs: c.heartbeatTtlMs,
          catalogOffset: () => replica.offset(),
        });
        yield* webViewResource(config, frontDoor.server, {
          mode: "fleet",
          workers: () => service.workers(),
          catalog: () => ({ offset: replica.offset(), lag: Math.max(0, logEnd.value - replica.offset()) }),
          decisions: recent ?? null,
        });
        const port = yield* resource(
          () => frontDoor.server.start(),
          () => frontDoor.close(),
        );
        log.log("info", "controller.ready", {
          url: `http://${c.host}:${port}`,
          workerPort: hub.port,
          model: modelId,
          fingerprint: model.fingerprint,
        });
        process.stderr.write(
          `continuum: controller serving '${modelId}' on http://${c.host}:${port}/v1, workers connect to ws://${c.host}:${hub.port} (Ctrl-C to stop)\n`,
        );
        yield* Effect.never;
      }),
    );
  },
};
export default command;
