import {
  type BackendChoice,
  type BackendName,
  chooseBackend,
  nativeBackends,
} from "../../native/backends.ts";
import type { Engine, EngineOptions } from "../../native/engine.ts";
import { openEngine } from "../model/engine.ts";
import { layerGroups } from "../model/layout.ts";
import type { LoadedModel } from "../model/model-dir.ts";
import { executionVariant, servedVariant } from "../model/variant.ts";

/** The backend an engine will get here, and the execution variant a process running it serves under. */
export interface EngineChoice {
  readonly backend: BackendName;
  readonly variant: string;
}

/**
 * Resolves `backend` (worker.backend) to the backend an engine gets on this
 * machine and `configured` (model.variant) to the variant the process
 * serves under (servedVariant: a named one must be the engine's). Decided
 * before the model is loaded, since the fingerprint names the variant; pass
 * `backend` on to loadEngine so the engine is the one chosen here.
 */
export function chooseEngine(backend: BackendChoice, configured: string): EngineChoice {
  // "cpu" never probes the CUDA runtime (the probe loads the driver).
  const cuda = backend === "cpu" ? { built: false, devices: 0 } : nativeBackends().cuda;
  const name = chooseBackend(backend, cuda);
  return { backend: name, variant: servedVariant(configured, executionVariant(name, cuda)) };
}

/**
 * Creates the engine for a loaded model and allocates its page pool, one
 * page table per layer group (layerGroups, as the WorkerRuntime holds its
 * pages), and commits the pool, so requests never pay for its first touch;
 * frees the engine if the pool fails.
 */
export async function loadEngine(
  model: LoadedModel,
  pool: { readonly physicalPages: number; readonly pageTokens: number },
  opts: EngineOptions = {},
): Promise<Engine> {
  const engine = await openEngine(model.config.spec, model.weights, opts);
  try {
    const groups = layerGroups(model.config.spec.layers);
    engine.createPool(
      pool.physicalPages,
      pool.pageTokens,
      groups.groups.length > 1 ? groups.groupOf : undefined,
    );
    await engine.commitPool();
  } catch (err) {
    engine.free();
    throw err;
  }
  return engine;
}
