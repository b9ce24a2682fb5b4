import { join } from "node:path";
import type { Config } from "../../schema/config.ts";
import type { StoreReporter } from "./chunk.ts";
import { FileTier } from "./file.ts";
import { RamTier } from "./ram.ts";
import { S3Tier } from "./s3.ts";
import { TieredChunkStore } from "./tiered.ts";

export type {
  Chunk,
  ChunkInfo,
  ChunkMeta,
  ChunkTier,
  StoreEvent,
  StoreReporter,
  TierStats,
} from "./chunk.ts";
export { VerifiedChunk } from "./chunk.ts";
export * from "./errors.ts";
export { FileTier } from "./file.ts";
export { RamTier } from "./ram.ts";
export { S3Tier } from "./s3.ts";
export type { PutResult, StoreStats } from "./tiered.ts";
export { TieredChunkStore } from "./tiered.ts";
export type { DrainReport, Durability, WriteBehindStats } from "./write-behind.ts";

/** The configured store and its individual tiers (restore reads one named tier at a time). */
export interface ConfiguredTiers {
  readonly store: TieredChunkStore;
  readonly ram: RamTier | undefined;
  readonly file: FileTier;
  readonly s3: S3Tier | undefined;
}

/**
 * Opens the tiers the configuration describes (RAM when store.ram.maxBytes > 0,
 * files under store.dir.path, default <dataDir>/store; S3 when store.s3.enabled)
 * and the tiered store over them. The caller owns the store: its `close()`
 * closes the tiers.
 */
export async function openConfiguredTiers(
  store: Config["store"],
  report?: StoreReporter,
): Promise<ConfiguredTiers> {
  const maxObjectBytes = store.dir.maxObjectBytes;
  const ram =
    store.ram.maxBytes > 0
      ? new RamTier({ maxBytes: store.ram.maxBytes, maxObjectBytes, ...(report && { report }) })
      : undefined;
  const file = await FileTier.open({
    dir: store.dir.path || join(store.dataDir, "store"),
    maxObjectBytes,
    maxBytes: store.dir.maxBytes,
    ...(report && { report }),
  });
  const s = store.s3;
  let s3: S3Tier | undefined;
  try {
    s3 = s.enabled
      ? await S3Tier.open({
          endpoint: s.endpoint,
          bucket: s.bucket,
          region: s.region,
          accessKeyId: s.accessKeyId,
          secretAccessKey: s.secretAccessKey,
          maxObjectBytes,
          multipartThresholdBytes: s.multipartThresholdBytes,
          partBytes: s.partBytes,
          partConcurrency: s.partConcurrency,
          maxAttempts: s.maxAttempts,
          retryBaseMs: s.retryBaseMs,
          requestTimeoutMs: s.requestTimeoutMs,
          createBucket: s.createBucket,
          ...(report && { report }),
        })
      : undefined;
  } catch (err) {
    await file.close();
    throw err;
  }
  const tiered = new TieredChunkStore({
    ...(ram && { ram }),
    file,
    ...(s3 && { s3 }),
    maxObjectBytes,
    writeBehind: {
      capacity: s.writeBehindQueue,
      maxBytes: s.writeBehindBytes,
      concurrency: s.writeBehindConcurrency,
      requiredWaitMs: s.requiredWaitMs,
    },
    ...(report && { report }),
  });
  return { store: tiered, ram, file, s3 };
}
