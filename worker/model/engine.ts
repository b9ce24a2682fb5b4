import {
  createEngine,
  type Engine,
  type EngineOptions,
  type ModelSpec,
  type WeightDType,
  type WeightTensor,
} from "../../native/index.ts";
import type { EngineSpec } from "./config.ts";
import type { WeightFormat } from "./dtype.ts";
import type { ModelWeights } from "./weights.ts";

/**
 * The bridge from a loaded model to the native engine: the spec in the
 * engine's terms and the tensors it needs (an unused lm_head of a tied model
 * is not passed). The engine copies the bytes into native memory, so the
 * caller may drop `weights` once the engine is created.
 */
const NATIVE_DTYPE: Record<WeightFormat, WeightDType> = {
  F32: "f32",
  F16: "f16",
  BF16: "bf16",
  Q8_0: "q8_0",
  Q4_0: "q4_0",
  Q4_K: "q4_k",
  Q6_K: "q6_k",
};

export function nativeSpec(spec: EngineSpec): ModelSpec {
  const rs = spec.ropeScaling;
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
    ropeScaling: rs
      ? {
          factor: rs.factor,
          low_freq_factor: rs.lowFreqFactor,
          high_freq_factor: rs.highFreqFactor,
          original_max_position_embeddings: rs.originalMaxPosition,
        }
      : null,
    attentionBias: spec.attentionBias,
    tiedEmbeddings: spec.tiedEmbeddings,
    maxPosition: spec.maxPosition,
  };
}

export function nativeWeights(weights: ModelWeights, spec: EngineSpec): Map<string, WeightTensor> {
  const out = new Map<string, WeightTensor>();
  for (const [name, t] of weights.tensors) {
    if (spec.tiedEmbeddings && name === "lm_head.weight") continue;
    out.set(name, { dtype: NATIVE_DTYPE[t.dtype], shape: t.shape, data: t.data });
  }
  return out;
}

export function openEngine(
  spec: EngineSpec,
  weights: ModelWeights,
  opts: EngineOptions = {},
): Promise<Engine> {
  return createEngine(nativeSpec(spec), nativeWeights(weights, spec), opts);
}
