import { Effect } from "effect";
import type { CatalogLog } from "../../catalog/log.ts";
import { Replica } from "../../catalog/replica.ts";
import type { SnapshotStore } from "../../catalog/snapshot.ts";
import type { Engine } from "../../native/engine.ts";
import type { ModelSpec } from "../../native/model-spec.ts";
import { abortable } from "../../schema/abort.ts";
import type { Config } from "../../schema/config.ts";
import type { ModelFingerprint, NodeId } from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import { openScoped, resource, type Scoped } from "../../schema/scope.ts";
import { CatalogLink } from "../checkpoint/catalog-link.ts";
import { Checkpointer } from "../checkpoint/checkpointer.ts";
import { KvGeometry } from "../checkpoint/chunk-format.ts";
import { type LayerGroups, layerGroups, layoutsOfWindows } from "../model/layout.ts";
import type { PrefixRestorer, RouteCheckpointer } from "../pages/durable-hooks.ts";
import { PeerServer } from "../peer/server.ts";
import { FileReclaimer } from "../reclaim/file-reclaimer.ts";
import type { StoreReporter } from "../store/chunk.ts";
import { ChunkTiers } from "../store/chunk-tiers.ts";
import { Restorer } from "./restorer.ts";

export interface DurableCacheOptions {
  readonly engine: Engine;
  readonly fingerprint: ModelFingerprint;
  readonly modelName: string;
  /** The model manifest's attention-state layout. */
  readonly layout: string;
  readonly config: Pick<Config, "pages" | "store" | "worker" | "auth">;
  /** The catalog log: proposals out, catalog.tx in (a writer runs elsewhere, or beside it in the embedded default). */
  readonly log: CatalogLog;
  readonly logger: Logger;
  /** Peer port; default worker.peerPortBase + worker.index (0: any free port). */
  readonly peerPort?: number;
  readonly checkpoint?: {
    readonly maxQueued?: number;
    readonly maxStagingBytes?: number;
    readonly capturePerByteMs?: number;
    readonly publishTimeoutMs?: number;
    readonly beforePublish?: (node: NodeId) => Promise<void>;
  };
  readonly fetchTimeoutMs?: number;
  readonly storeReport?: StoreReporter;
  /** Catalog snapshots to start the replica from (read only: the fleet's controller writes them). */
  readonly snapshots?: SnapshotStore;
  /**
   * Register the model and worker (and withdraw RAM replicas of an earlier
   * life) in open() (default), or leave it to register() once the worker is
   * warm (worker/warm/: nobody plans on a worker before it is ready).
   */
  readonly deferRegistration?: boolean;
  /** Aborted when start-up has failed elsewhere (the embedded writer cannot commit): open stops waiting and throws its reason. */
  readonly signal?: AbortSignal;
}

/**
 * The layer groups a runtime holds its pages in (layerGroups, as loadEngine
 * made the pool) and the page geometry they give: what the checkpointer and
 * restorer work on.
 */
export function durableGeometry(spec: ModelSpec): { groups: LayerGroups; geometry: KvGeometry } {
  const groups = layerGroups(layoutsOfWindows(spec.layerWindows, spec.nLayers));
  return { groups, geometry: KvGeometry.of(spec, groups.slots) };
}

/**
 * Free bytes the reclaimer keeps in the chunk files: a sixteenth of them, at
 * least two chunks (so a capture rarely waits for a round), at most all.
 */
export function fileHeadroom(maxBytes: number, chunkBytes: number): number {
  return Math.min(maxBytes, Math.max(2 * chunkBytes, Math.floor(maxBytes / 16)));
}

/** Bound on each catalog wait of start-up (catching up, withdrawals, registration). */
const STARTUP_CATALOG_MS = 30_000;

/**
 * A worker's durable prefix cache: its chunk tiers, its catalog replica and
 * proposals, the peer server, the checkpointer and the restorer, opened and
 * closed together. `hooks` is what RuntimeOptions takes:
 *
 *   new WorkerRuntime(engine, { ...opts, restore: cache.restorer, checkpoint: cache.checkpointer })
 *
 * Its parts are built in one scope (schema/scope.ts), so they close in the
 * reverse of the order open builds them: checkpoints finish (their chunks
 * stored and proposed), restores settle, the peer server stops, the replica
 * stops, then the store drains its write-behind and closes.
 */
export class DurableCache {
  private registered = false;

  private constructor(
    readonly tiers: ChunkTiers,
    readonly replica: Replica,
    readonly catalog: CatalogLink,
    readonly peer: PeerServer,
    readonly checkpointer: Checkpointer,
    readonly restorer: Restorer,
    /** null without S3: then the files are the durable copy and nothing deletes them to make room. */
    readonly reclaimer: FileReclaimer | null,
    private readonly scope: Scoped<unknown>,
  ) {}

  get hooks(): { restore: PrefixRestorer; checkpoint: RouteCheckpointer } {
    return { restore: this.restorer, checkpoint: this.checkpointer };
  }

  static async open(o: DurableCacheOptions): Promise<DurableCache> {
    const { config, engine } = o;
    const { groups, geometry } = durableGeometry(engine.spec);
    if (engine.pageBytes !== 0 && engine.pageBytes !== geometry.pageBytes(config.pages.pageTokens))
      throw new RangeError(
        `engine pages are ${engine.pageBytes} bytes, the served groups' ${geometry.pageBytes(config.pages.pageTokens)}`,
      );
    const opened = await openScoped(
      Effect.gen(function* () {
        const tiers = yield* resource(
          () => ChunkTiers.open(config.store, o.storeReport),
          (t) => t.close(),
        );
        if (tiers.s3?.unreachableAtOpen !== undefined)
          o.logger.log("warn", "store.s3_unavailable", {
            endpoint: config.store.s3.endpoint,
            cause: tiers.s3.unreachableAtOpen,
            effect:
              "started degraded: no chunk is published until S3 answers (each put retries); restores use the local tiers",
          });
        const replica = yield* resource(
          () =>
            Replica.start({
              log: o.log,
              ...(o.snapshots ? { snapshots: o.snapshots } : {}),
              warn: (m) => o.logger.log("warn", "catalog.replica", { message: m }),
            }),
          (r) => r.stop(),
        );
        const peer = yield* resource(
          () =>
            PeerServer.start({
              host: config.worker.peerHost,
              port: o.peerPort ?? config.worker.peerPortBase + config.worker.index,
              secret: config.auth.clusterSecret,
              chunks: { get: (id) => tiers.getLocal(id) },
            }),
          (p) => p.close(),
        );
        const catalog = new CatalogLink(o.log, replica, {
          workerId: config.worker.id,
          fingerprint: o.fingerprint,
          modelName: o.modelName,
          layout: o.layout,
          chunkTokens: config.pages.chunkTokens,
        });
        // Deferred: register() once the worker is warm (worker/warm/).
        if (!o.deferRegistration)
          yield* Effect.tryPromise({
            try: () => registerWorker(replica, catalog, peer.address, o.signal),
            catch: (e) => e,
          });
        // What the restorer and the checkpointer both work on.
        const pages = {
          engine,
          geometry,
          groups,
          tiers,
          catalog,
          pageTokens: config.pages.pageTokens,
          chunkTokens: config.pages.chunkTokens,
        };
        const restorer = yield* resource(
          () =>
            new Restorer({
              ...pages,
              peerSecret: config.auth.clusterSecret,
              fetchTimeoutMs: o.fetchTimeoutMs ?? 5_000,
              logger: o.logger,
            }),
          (r) => r.idle(),
        );
        const cp = o.checkpoint ?? {};
        const checkpointer = yield* resource(
          () =>
            new Checkpointer({
              ...pages,
              maxQueued: cp.maxQueued ?? 64,
              maxStagingBytes: cp.maxStagingBytes ?? 64 << 20,
              capturePerByteMs: cp.capturePerByteMs ?? 1e-5,
              publishTimeoutMs: cp.publishTimeoutMs ?? 30_000,
              logger: o.logger,
              ...(cp.beforePublish && { beforePublish: cp.beforePublish }),
            }),
          (c) => c.close(),
        );
        // With S3 on, the files are a cache of it: their coldest chunks S3 holds make room (first to close).
        const reclaimer =
          tiers.s3 === undefined
            ? null
            : yield* resource(
                () =>
                  new FileReclaimer({
                    file: tiers.file,
                    catalog,
                    logger: o.logger,
                    headroomBytes: fileHeadroom(
                      config.store.dir.maxBytes,
                      geometry.tokenBytes * config.pages.chunkTokens,
                    ),
                    intervalMs: 250,
                    maxScan: 1024,
                    maxDelete: 64,
                  }),
                (r) => r.stop(),
              );
        return { tiers, replica, catalog, peer, checkpointer, restorer, reclaimer };
      }),
    );
    const p = opened.value;
    const cache = new DurableCache(
      p.tiers,
      p.replica,
      p.catalog,
      p.peer,
      p.checkpointer,
      p.restorer,
      p.reclaimer,
      opened,
    );
    cache.registered = !o.deferRegistration;
    return cache;
  }

  /** Registers a cache opened with deferRegistration (registerWorker); once per cache. */
  async register(signal?: AbortSignal): Promise<void> {
    if (this.registered) return;
    await registerWorker(this.replica, this.catalog, this.peer.address, signal);
    this.registered = true;
  }

  /** Every capture queued so far stored, proposed and applied here (or given up); every restore settled. */
  async idle(): Promise<void> {
    await this.checkpointer.idle();
    await this.restorer.idle();
  }

  close(): Promise<void> {
    return this.scope.close();
  }
}

/**
 * Withdraws this worker's RAM replicas of an earlier life, then registers the
 * model and this worker (with its peer address), waiting until the replica
 * shows each (bounded: STARTUP_CATALOG_MS each; `signal` stops the wait).
 * Withdrawal comes first: a worker restarted with another model may only
 * withdraw them while the catalog still lists it under theirs.
 */
async function registerWorker(
  replica: Replica,
  catalog: CatalogLink,
  address: string,
  signal: AbortSignal | undefined,
): Promise<void> {
  await abortable(replica.catchUp(STARTUP_CATALOG_MS), signal);
  await catalog.forgetRamApplied(STARTUP_CATALOG_MS, signal);
  await catalog.register(address, STARTUP_CATALOG_MS, signal);
}
