import type { CatalogLog } from "../../catalog/log.ts";
import { Replica } from "../../catalog/replica.ts";
import type { SnapshotStore } from "../../catalog/snapshot.ts";
import type { Engine } from "../../native/index.ts";
import { abortable } from "../../schema/abort.ts";
import type { Config } from "../../schema/config.ts";
import type { ModelFingerprint, NodeId } from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import { CatalogLink } from "../checkpoint/catalog-link.ts";
import { Checkpointer } from "../checkpoint/checkpointer.ts";
import { KvGeometry } from "../checkpoint/chunk-format.ts";
import type { PrefixRestorer, RouteCheckpointer } from "../pages/durable-hooks.ts";
import { PeerServer } from "../peer/server.ts";
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

/** Bound on each catalog wait of start-up (catching up, withdrawals, registration). */
const STARTUP_CATALOG_MS = 30_000;

/**
 * A worker's durable prefix cache: its chunk tiers, its catalog replica and
 * proposals, the peer server, the checkpointer and the restorer, opened and
 * closed together. `hooks` is what RuntimeOptions takes:
 *
 *   new WorkerRuntime(engine, { ...opts, restore: cache.restorer, checkpoint: cache.checkpointer })
 *
 * Close order releases users before what they use: checkpoints finish (their
 * chunks stored and proposed), restores settle, the peer server stops, the
 * replica stops, then the store drains its write-behind and closes.
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
  ) {}

  get hooks(): { restore: PrefixRestorer; checkpoint: RouteCheckpointer } {
    return { restore: this.restorer, checkpoint: this.checkpointer };
  }

  static async open(o: DurableCacheOptions): Promise<DurableCache> {
    const { config, engine } = o;
    const geometry = KvGeometry.of(engine.spec);
    const tiers = await ChunkTiers.open(config.store, o.storeReport);
    if (tiers.s3?.unreachableAtOpen !== undefined)
      o.logger.log("warn", "store.s3_unavailable", {
        endpoint: config.store.s3.endpoint,
        cause: tiers.s3.unreachableAtOpen,
        effect:
          "started degraded: no chunk is published until S3 answers (each put retries); restores use the local tiers",
      });
    const undo: (() => Promise<unknown>)[] = [() => tiers.close()];
    try {
      const replica = await Replica.start({
        log: o.log,
        ...(o.snapshots ? { snapshots: o.snapshots } : {}),
        warn: (m) => o.logger.log("warn", "catalog.replica", { message: m }),
      });
      undo.unshift(() => replica.stop());
      const peer = await PeerServer.start({
        host: config.worker.peerHost,
        port: o.peerPort ?? config.worker.peerPortBase + config.worker.index,
        secret: config.auth.clusterSecret,
        chunks: { get: (id) => tiers.getLocal(id) },
      });
      undo.unshift(() => peer.close());
      const catalog = new CatalogLink(o.log, replica, {
        workerId: config.worker.id,
        fingerprint: o.fingerprint,
        modelName: o.modelName,
        layout: o.layout,
        chunkTokens: config.pages.chunkTokens,
      });
      const cp = o.checkpoint ?? {};
      const checkpointer = new Checkpointer({
        engine,
        geometry,
        tiers,
        catalog,
        pageTokens: config.pages.pageTokens,
        chunkTokens: config.pages.chunkTokens,
        maxQueued: cp.maxQueued ?? 64,
        maxStagingBytes: cp.maxStagingBytes ?? 64 << 20,
        capturePerByteMs: cp.capturePerByteMs ?? 1e-5,
        publishTimeoutMs: cp.publishTimeoutMs ?? 30_000,
        logger: o.logger,
        ...(cp.beforePublish && { beforePublish: cp.beforePublish }),
      });
      const restorer = new Restorer({
        engine,
        geometry,
        tiers,
        catalog,
        pageTokens: config.pages.pageTokens,
        chunkTokens: config.pages.chunkTokens,
        peerSecret: config.auth.clusterSecret,
        fetchTimeoutMs: o.fetchTimeoutMs ?? 5_000,
        logger: o.logger,
      });
      const cache = new DurableCache(tiers, replica, catalog, peer, checkpointer, restorer);
      if (!o.deferRegistration) await cache.register(o.signal);
      return cache;
    } catch (err) {
      for (const u of undo) await u().catch(() => undefined);
      throw err;
    }
  }

  /**
   * Withdraws this worker's RAM replicas of an earlier life, then registers
   * the model and this worker (with its peer address), waiting until the
   * replica shows each (bounded: STARTUP_CATALOG_MS each; `signal` stops the
   * wait). Withdrawal comes first: a worker restarted with another model may
   * only withdraw them while the catalog still lists it under theirs. Once per
   * cache.
   */
  async register(signal?: AbortSignal): Promise<void> {
    if (this.registered) return;
    await abortable(this.replica.catchUp(STARTUP_CATALOG_MS), signal);
    await this.catalog.forgetRamApplied(STARTUP_CATALOG_MS, signal);
    await this.catalog.register(this.peer.address, STARTUP_CATALOG_MS, signal);
    this.registered = true;
  }

  /** Every capture queued so far stored, proposed and applied here (or given up); every restore settled. */
  async idle(): Promise<void> {
    await this.checkpointer.idle();
    await this.restorer.idle();
  }

  async close(): Promise<void> {
    await this.checkpointer.close();
    await this.restorer.idle();
    await this.peer.close();
    await this.replica.stop();
    await this.tiers.close();
  }
}
