import { Effect, type Scope } from "effect";
import type { Engine, EngineOptions } from "../../native/index.ts";
import { openEngine } from "../model/engine.ts";
import type { LoadedModel } from "../model/model-dir.ts";

/** Creates the engine for a loaded model and allocates its page pool; frees the engine if the pool fails. */
export async function loadEngine(
  model: LoadedModel,
  pool: { readonly physicalPages: number; readonly pageTokens: number },
  opts: EngineOptions = {},
): Promise<Engine> {
  const engine = await openEngine(model.config.spec, model.weights, opts);
  try {
    engine.createPool(pool.physicalPages, pool.pageTokens);
  } catch (err) {
    engine.free();
    throw err;
  }
  return engine;
}

/** loadEngine as a scoped resource: the engine (weights and page pool) is freed when the scope closes. */
export function scopedEngine(
  model: LoadedModel,
  pool: { readonly physicalPages: number; readonly pageTokens: number },
  opts: EngineOptions = {},
): Effect.Effect<Engine, unknown, Scope.Scope> {
  return Effect.acquireRelease(
    Effect.tryPromise({ try: () => loadEngine(model, pool, opts), catch: (e) => e }),
    (engine) => Effect.sync(() => engine.free()),
  );
}
