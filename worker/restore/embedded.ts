import { mkdir } from "node:fs/promises";
import { dirname } from "node:path";
import { Effect } from "effect";
import { embeddedLogPath } from "../../catalog/console.ts";
import { CatalogDb } from "../../catalog/db.ts";
import { InconsistentLogError } from "../../catalog/embedded-file.ts";
import { EmbeddedLog } from "../../catalog/log-embedded.ts";
import { CatalogWriter } from "../../catalog/writer.ts";
import type { Engine } from "../../native/engine.ts";
import type { Config } from "../../schema/config.ts";
import type { Logger } from "../../schema/log.ts";
import { openScoped, resource } from "../../schema/scope.ts";
import type { LoadedModel } from "../model/model-dir.ts";
import type { PrefixRestorer, RouteCheckpointer } from "../pages/durable-hooks.ts";
import { lockFile } from "../store/dir-lock.ts";
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
 *
 * The log is locked (embedded.log.lock) for as long as the cache is open.
 * Start-up fails fast instead of waiting out its catalog bounds when the
 * writer cannot commit (a full disk): with the writer's error. After
 * start-up the writer retries with backoff; `writerStopped` settles if it
 * gives up for good.
 */
export interface EmbeddedCache {
  readonly cache: DurableCache;
  readonly hooks: { restore: PrefixRestorer; checkpoint: RouteCheckpointer };
  /** Resolves with the error the catalog writer stopped on (it never resolves while the writer runs). */
  readonly writerStopped: Promise<Error>;
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
  // Built in one scope (schema/scope.ts): it closes the cache, then the writer, the log and the lock.
  const opened = await openScoped(
    Effect.gen(function* () {
      yield* resource(
        () => lockFile(`${path}.lock`, `catalog log ${path}`),
        (lock) => lock.release(),
      );
      const log = yield* resource(
        () =>
          EmbeddedLog.open({ path }).catch((err) => {
            throw err instanceof InconsistentLogError
              ? new InconsistentLogError(
                  err.path,
                  err.at,
                  `${err.message}: run \`continuum catalog repair --dir ${o.config.store.dataDir}\``,
                )
              : err;
          }),
        (l) => l.close(),
      );
      const startup = new AbortController();
      let stopped: (err: Error) => void = () => {};
      const writerStopped = new Promise<Error>((resolve) => {
        stopped = resolve;
      });
      yield* resource(
        () => {
          const writer = new CatalogWriter({
            log,
            newDb: () => CatalogDb.empty(),
            logger: o.logger,
            onLeaseLost: (err) =>
              startup.abort(new Error(`the catalog writer cannot commit: ${err.message}`)),
          });
          const writing = writer.run().catch((err: Error) => {
            o.logger.log("error", "catalog.writer_stopped", { message: err.message });
            stopped(err);
          });
          return { writer, writing };
        },
        async ({ writer, writing }) => {
          await writer.stop();
          await writing;
        },
      );
      const cache = yield* resource(
        () =>
          DurableCache.open({
            engine: o.engine,
            fingerprint: o.model.fingerprint,
            modelName: o.modelName,
            layout: o.model.manifest.layout,
            config: o.config,
            log,
            logger: o.logger,
            // One process has no peers to serve; any free port keeps the default from colliding.
            peerPort: 0,
            signal: startup.signal,
          }),
        (c) => c.close(),
      );
      return { cache, writerStopped };
    }),
  );
  const { cache, writerStopped } = opened.value;
  return { cache, hooks: cache.hooks, writerStopped, close: () => opened.close() };
}
