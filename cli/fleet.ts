import { join } from "node:path";
import { KafkaLog } from "../catalog/kafka/log.ts";
import type { CatalogLog } from "../catalog/log.ts";
import { S3SnapshotStore } from "../catalog/snapshot-s3.ts";
import { type Config, defaultConfig } from "../schema/config.ts";
import type { StoreTier, WorkerStatus } from "../schema/control.ts";
import { WorkerId } from "../schema/ids.ts";
import type { CheckpointStats } from "../worker/checkpoint/checkpointer.ts";
import type { PrefetchStats } from "../worker/prefetch/prefetcher.ts";
import type { RestoreStats } from "../worker/restore/restorer.ts";
import type { RuntimeStats } from "../worker/runtime/runtime-api.ts";
import { UsageError } from "./command.ts";

/**
 * What the fleet roles (`continuum controller`, `continuum worker`) share at
 * the composition root: the catalog transport and per-index naming.
 */

/** The fleet roles share one catalog across processes, which only the Kafka log provides. */
export function requireKafka(config: Config, role: string): void {
  if (config.catalog.log !== "kafka") {
    throw new UsageError(
      `catalog.log is 'embedded', which lives inside one process; \`continuum ${role}\` shares the catalog with other processes and needs catalog.log: kafka (and catalog.brokers)`,
    );
  }
}

/** Opens the Kafka catalog log for one process (its own client id). */
export function openCatalogLog(config: Config, clientId: string): Promise<KafkaLog> {
  return KafkaLog.open({
    brokers: config.catalog.brokers,
    clientId: `${config.catalog.clientId}.${clientId}`,
    topics: config.catalog.topics,
  });
}

/**
 * worker.index picks the worker's id and ports: the id is worker.id when set
 * explicitly, else `worker-<index>`; the peer port is peerPortBase + index.
 */
export function workerIdentity(config: Config): { id: WorkerId; peerPort: number } {
  const w = config.worker;
  const id = w.id !== defaultConfig.worker.id ? w.id : `worker-${w.index}`;
  const peerPort = w.peerPortBase + w.index;
  if (peerPort > 65535)
    throw new UsageError(`worker.peerPortBase + worker.index = ${peerPort} is not a port`);
  return { id: WorkerId(id), peerPort };
}

/**
 * The slice of the config a worker's DurableCache reads, for one worker id:
 * worker.id is the fleet identity (the catalog names replicas by it), and the
 * chunk files default to <dataDir>/workers/<id>/store, so workers sharing a
 * data dir (one machine, `continuum cluster up`) never share a local store.
 * An explicit store.dir.path is the operator's choice for this one worker.
 * Its auth is what the peer port uses: no secret when worker.peerTransfer is
 * false, so no peer chunk is served or read.
 */
export function workerCacheConfig(
  config: Config,
  id: WorkerId,
): Pick<Config, "pages" | "store" | "worker" | "auth"> {
  const dir = config.store.dir.path || join(config.store.dataDir, "workers", id, "store");
  return {
    pages: config.pages,
    // Peer chunks are served and read with the cluster secret; worker.peerTransfer false: with none (refused, never read).
    auth: config.worker.peerTransfer ? config.auth : { ...config.auth, clusterSecret: "" },
    worker: { ...config.worker, id },
    store: { ...config.store, dir: { ...config.store.dir, path: dir } },
  };
}

/** The durable tiers a worker's heartbeats advertise: the ones its store has. */
export function durableTiers(store: Config["store"]): StoreTier[] {
  const tiers: StoreTier[] = [];
  if (store.ram.maxBytes > 0) tiers.push("ram");
  tiers.push("ssd");
  if (store.s3.enabled) tiers.push("s3");
  return tiers;
}

/**
 * The fleet's catalog snapshots in the object store, when S3 is configured:
 * the controller writes one every catalog.snapshotEvery txs; every replica
 * (controller, workers, a restarted process) starts from the newest.
 */
export async function fleetSnapshots(config: Config): Promise<S3SnapshotStore | undefined> {
  const s3 = config.store.s3;
  if (!s3.enabled) return undefined;
  return S3SnapshotStore.open({
    endpoint: s3.endpoint,
    region: s3.region,
    accessKeyId: s3.accessKeyId,
    secretAccessKey: s3.secretAccessKey,
    bucket: s3.bucket,
    prefix: "catalog/snapshots/",
    requestTimeoutMs: s3.requestTimeoutMs,
  });
}

/** The catalog log's end offset, polled every `everyMs` (a failed poll keeps the last value). */
export function pollLogEnd(
  log: Pick<CatalogLog, "endOffset">,
  everyMs: number,
): { value: number; stop(): void } {
  const out = {
    value: 0,
    stop: () => clearInterval(timer),
  };
  const poll = () =>
    log.endOffset().then(
      (end) => {
        out.value = end;
      },
      () => undefined,
    );
  void poll();
  const timer = setInterval(poll, everyMs);
  return out;
}

export interface WorkerStatusSources {
  readonly runtime: Pick<
    RuntimeStats,
    "pagesTotal" | "pagesFree" | "cachedPromptTokens" | "computedPromptTokens"
  >;
  readonly restore: Pick<RestoreStats, "chunks" | "bytes" | "tokens">;
  readonly checkpoint: Pick<CheckpointStats, "chunksPublished">;
  readonly prefetch?: Pick<PrefetchStats, "fetched" | "hits" | "skipped">;
  readonly catalogOffset: number;
  readonly logEnd: number;
  readonly chunkTokens: number;
  readonly kvBytesPerToken: number;
}

/**
 * A worker's heartbeat status from its parts' counters (pure). The runtime
 * counts every cached prompt token, restored or resident, and the restorer
 * the rows its restores filled, so resident hits = cached − Σ restored rows
 * (at least 0). A published chunk's bytes are its tokens' attention state,
 * chunkTokens × kvBytesPerToken.
 */
export function workerStatus(s: WorkerStatusSources): WorkerStatus {
  const r = s.restore;
  // Rows restores filled (a chunk partly resident already fills fewer than chunkTokens).
  const restoredTokens = r.tokens.ram + r.tokens.ssd + r.tokens.peer + r.tokens.s3;
  return {
    totalPages: s.runtime.pagesTotal as WorkerStatus["totalPages"],
    // Cached prefixes hold attention state too, though they are evicted on demand.
    residentPages: Math.max(0, s.runtime.pagesTotal - s.runtime.pagesFree) as WorkerStatus["residentPages"],
    residentHitTokens: Math.max(
      0,
      s.runtime.cachedPromptTokens - restoredTokens,
    ) as WorkerStatus["residentHitTokens"],
    computedTokens: s.runtime.computedPromptTokens as WorkerStatus["computedTokens"],
    restoredChunks: { ...r.chunks },
    restoredBytes: { ...r.bytes },
    publishedChunks: s.checkpoint.chunksPublished,
    publishedBytes: s.checkpoint.chunksPublished * s.chunkTokens * s.kvBytesPerToken,
    catalogOffset: s.catalogOffset,
    catalogLag: Math.max(0, s.logEnd - s.catalogOffset),
    ...(s.prefetch
      ? {
          prefetch: {
            chunks: s.prefetch.fetched.ram + s.prefetch.fetched.ssd,
            hits: s.prefetch.hits,
            skipped: Object.values(s.prefetch.skipped).reduce((a, b) => a + b, 0),
          },
        }
      : {}),
  };
}
