import { mkdir } from "node:fs/promises";
import { dirname } from "node:path";
import { embeddedLogPath } from "../../catalog/console.ts";
import { CatalogDb } from "../../catalog/db.ts";
import { EmbeddedLog } from "../../catalog/log-embedded.ts";
import { CatalogWriter } from "../../catalog/writer.ts";
import type { Engine } from "../../native/index.ts";
import type { Config } from "../../schema/config.ts";
import type { Logger } from "../../schema/log.ts";
import type { LoadedModel } from "../model/model-dir.ts";
import type { PrefixRestorer, RouteCheckpointer } from "../pages/durable-hooks.ts";
import { DurableCache } from "./durable-cache.ts";

/**
 * The durable prefix cache of the embedded default (one process): the
 * embedded catalog log on disk (<dataDir>/catalog/embedded.log, where
 * `continuum console` and `continuum tail` read it) with its
 * writer in this process, and the worker's DurableCache over the configured
 * store (local files; S3 only when store.s3.enabled). Prefixes computed in an
 * earlier run are restored from SSD after a restart.
 *
 *   const cache = await openEmbeddedCache({ engine, model, modelName, config, logger });
 *   new WorkerRuntime(engine, { ...runtimeOptions, ...cache.hooks });
 *   …  await runtime.stop(); await cache.close();
 */
export interface EmbeddedCache {
  readonly cache: DurableCache;
  readonly hooks: { restore: PrefixRestorer; checkpoint: RouteCheckpointer };
  close(): Promise<void>;
}

export async function openEmbeddedCache(o: {
  readonly engine: Engine;
  readonly model: LoadedModel;
  readonly modelName: string;
  readonly config: Pick<Config, "pages" | "store" | "worker" | "auth">;
  readonly logger: Logger;
}): Promise<EmbeddedCache> {
  const path = embeddedLogPath(o.config);
  await mkdir(dirname(path), { recursive: true });
  const log = await EmbeddedLog.open({ path });
  const writer = new CatalogWriter({ log, newDb: () => CatalogDb.empty(), logger: o.logger });
  const writing = writer.run().catch((err) => {
    o.logger.log("error", "catalog.writer_stopped", { message: (err as Error).message });
  });
  const stopCatalog = async () => {
    await writer.stop();
    await writing;
    await log.close();
  };
  let cache: DurableCache;
  try {
    cache = await DurableCache.open({
      engine: o.engine,
      fingerprint: o.model.fingerprint,
      modelName: o.modelName,
      layout: o.model.manifest.layout,
      config: o.config,
      log,
      logger: o.logger,
      // One process has no peers to serve; any free port keeps the default from colliding.
      peerPort: 0,
    });
  } catch (err) {
    await stopCatalog();
    throw err;
  }
  return {
    cache,
    hooks: cache.hooks,
    async close() {
      await cache.close();
      await stopCatalog();
    },
  };
}
