import { Context, Effect, Layer } from "effect";
import type { Config } from "../../schema/config.ts";
import type { StoreReporter } from "./chunk.ts";
import { StoreError, StoreUnavailableError } from "./errors.ts";
import { openChunkStore } from "./index.ts";
import type { TieredChunkStore } from "./tiered.ts";

/**
 * The worker's chunk store as an Effect service. Building the layer opens the
 * tiers (files, S3 client, write-behind uploaders); tearing it down closes the
 * store, which first finishes accepted puts and uploads, so a scope's end
 * (Ctrl-C, `cluster down`, test teardown) never drops an acknowledged write.
 */
export class ChunkStore extends Context.Service<ChunkStore, TieredChunkStore>()(
  "continuum/worker/ChunkStore",
) {
  static layer(store: Config["store"], report?: StoreReporter): Layer.Layer<ChunkStore, StoreError> {
    return Layer.effect(
      ChunkStore,
      Effect.acquireRelease(
        Effect.tryPromise({
          try: () => openChunkStore(store, report),
          catch: (err) =>
            err instanceof StoreError ? err : new StoreUnavailableError("file", "open store", 1, err),
        }),
        (opened) => Effect.promise(() => opened.close()),
      ),
    );
  }
}
