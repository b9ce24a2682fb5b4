import {
  createEngine,
  type Engine,
  type ModelSpec,
  type WeightDType,
  type Weights,
} from "../../native/index.ts";
import type { EngineSpec } from "../model/config.ts";
import type { LoadedModel } from "../model/model-dir.ts";

/**
 * The bridge from a loaded Hugging Face model to the native engine: the
 * model's parsed spec in the binding's field names, and its tensors by
 * checkpoint name with the binding's dtype names. No bytes are copied.
 */
export function nativeSpec(spec: EngineSpec): ModelSpec {
  const sc = spec.ropeScaling;
  return {
    nLayers: spec.nLayers,
    hidden: spec.hidden,
    nHeads: spec.nHeads,
    nKvHeads: spec.nKvHeads,
    headDim: spec.headDim,
    vHeadDim: spec.vHeadDim,
    ffn: spec.ffn,
    vocab: spec.vocab,
    rmsEps: spec.rmsEps,
    ropeTheta: spec.ropeTheta,
    ropeScaling: sc
      ? {
          factor: sc.factor,
          low_freq_factor: sc.lowFreqFactor,
          high_freq_factor: sc.highFreqFactor,
          original_max_position_embeddings: sc.originalMaxPosition,
        }
      : null,
    attentionBias: spec.attentionBias,
    tiedEmbeddings: spec.tiedEmbeddings,
    maxPosition: spec.maxPosition,
  };
}

export function nativeWeights(model: LoadedModel): Weights {
  const out = new Map<string, { dtype: WeightDType; shape: readonly number[]; data: Uint8Array }>();
  for (const [name, t] of model.weights.tensors) {
    out.set(name, { dtype: t.dtype.toLowerCase() as WeightDType, shape: t.shape, data: t.data });
  }
  return out;
}

/** Creates the engine for a loaded model and allocates its page pool. */
export async function loadEngine(
  model: LoadedModel,
  pool: { readonly physicalPages: number; readonly pageTokens: number },
  threads?: number,
): Promise<Engine> {
  const engine = await createEngine(
    nativeSpec(model.config.spec),
    nativeWeights(model),
    threads ? { threads } : {},
  );
  try {
    engine.createPool(pool.physicalPages, pool.pageTokens);
  } catch (err) {
    engine.free();
    throw err;
  }
  return engine;
}
