import { CatalogQueryEngine, type QuerySource } from "../catalog/query-engine.ts";
import type { CodecJob } from "../controller/api/prompts.ts";
import { ApiServer } from "../controller/api/server.ts";
import type { InferenceService } from "../controller/api/service.ts";
import { ThreadPool } from "../controller/api/thread-pool.ts";
import type { Config } from "../schema/config.ts";
import type { Logger } from "../schema/log.ts";
import type { CodecThreadData } from "./embedded/codec-thread.ts";

/**
 * The HTTP front door as both the embedded default and the fleet controller
 * run it: the API server with the configured bounds, a tokenizer thread pool
 * per served model, and the bounded catalog query engine over the process's
 * replica. `close` releases them in reverse: the server (no new requests),
 * then the threads.
 */

/** A served model's id and the directory its tokenizer threads load the tokenizer from. */
export interface FrontDoorModel {
  readonly id: string;
  readonly dir: string;
}

export interface ApiFrontDoor {
  readonly server: ApiServer;
  close(): Promise<void>;
}

const CODEC_THREAD = new URL("./embedded/codec-thread.ts", import.meta.url);

export function openFrontDoor(o: {
  readonly config: Config;
  readonly service: InferenceService;
  readonly models: readonly FrontDoorModel[];
  /** The replica that POST /v1/catalog/query reads; absent: the endpoint answers 503. */
  readonly catalog?: QuerySource;
  readonly log: Logger;
}): ApiFrontDoor {
  const c = o.config.controller;
  const tokenizers = new Map(
    o.models.map((m) => {
      const data: CodecThreadData = { modelDir: m.dir };
      const pool = new ThreadPool<CodecJob, number[][]>({
        entry: CODEC_THREAD,
        data,
        threads: c.limits.tokenizerThreads,
        maxQueued: c.limits.tokenizerQueue,
        name: "tokenizer",
      });
      return [m.id, pool] as const;
    }),
  );
  const catalog = o.catalog ? new CatalogQueryEngine(o.catalog, c.catalogQuery) : undefined;
  const server = new ApiServer(o.service, {
    host: c.host,
    port: c.httpPort,
    auth: {
      tokens: o.config.auth.tokens,
      adminTenants: o.config.auth.adminTenants,
      metricsToken: o.config.auth.metricsToken,
    },
    http: c.http,
    limits: c.limits,
    corsOrigins: c.corsOrigins,
    tokenizers,
    ...(catalog ? { catalog } : {}),
    log: (event, fields, level) => o.log.log(level ?? "info", event, fields),
  });
  return {
    server,
    async close() {
      await server.close();
      await Promise.all([...tokenizers.values()].map((p) => p.close()));
      await catalog?.close();
    },
  };
}
