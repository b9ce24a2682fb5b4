import { createEngine, type Engine, type EngineOptions } from "../../native/engine.ts";
import type { ModelSpec } from "../../native/model-spec.ts";
import type { WeightDType, WeightTensor } from "../../native/weights.ts";
import type { EngineSpec } from "./config.ts";
import { bf16BitsToF32, f32ToBf16Bits, roundToF16, type WeightFormat } from "./dtype.ts";
import { layerWindows } from "./layout.ts";
import { layerInvFreq, ropeAttentionFactor } from "./rope.ts";
import type { LoadedTensor } from "./safetensors.ts";
import type { ModelWeights } from "./weights.ts";

/**
 * The bridge from a loaded model to the native engine: the spec in the
 * engine's terms and the tensors it needs, by role, under the engine's
 * (unfused) names; an unused lm_head of a tied model is not passed. The
 * engine copies the bytes into native memory, so the caller may drop
 * `weights` once the engine is created.
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

/**
 * √hidden as the embedding's dtype holds it: Gemma multiplies by
 * torch.tensor(hidden ** 0.5, dtype=hidden_states.dtype), so a bf16
 * checkpoint scales by the bf16 value (√1152 = 33.94… becomes 34).
 */
export function embedScaleOf(spec: EngineSpec, embedDtype: WeightFormat): number {
  if (!spec.scaleEmbeddings) return 1;
  const s = Math.fround(Math.sqrt(spec.hidden));
  if (embedDtype === "BF16") return bf16BitsToF32(f32ToBf16Bits(s));
  if (embedDtype === "F16") return roundToF16(s);
  return s;
}

/**
 * The native spec. `embedDtype` is the embedding's storage dtype (for
 * Gemma's embedding scale).
 */
export function nativeSpec(spec: EngineSpec, embedDtype: WeightFormat = "F32"): ModelSpec {
  const rs = spec.ropeScaling;
  const half = spec.headDim / 2;
  const invFreq = new Float32Array(spec.nLayers * half);
  for (let l = 0; l < spec.nLayers; l++) invFreq.set(layerInvFreq(spec, l), l * half);
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
    ropeScaling:
      rs?.kind === "llama3"
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
    normOffset: spec.normOffset,
    qkNorm: spec.qkNorm,
    sandwichNorms: spec.sandwichNorms,
    activation: spec.activation,
    embedScale: embedScaleOf(spec, embedDtype),
    ropeScale: ropeAttentionFactor(spec),
    // Absent: the engine's default 1/√headDim, which it computes itself in f32.
    ...(spec.attnScale !== null ? { attnScale: spec.attnScale } : {}),
    attnSoftcap: spec.attnSoftcap,
    finalSoftcap: spec.finalSoftcap,
    layerWindows: layerWindows(spec.layers),
    layerInvFreq: invFreq,
  };
}

/** The tensors by the engine's names (native/weights.ts: weightNames), taken from their roles. */
export function nativeWeights(weights: ModelWeights, spec: EngineSpec): Map<string, WeightTensor> {
  const out = new Map<string, WeightTensor>();
  const put = (name: string, t: LoadedTensor | undefined) => {
    if (t) out.set(name, { dtype: NATIVE_DTYPE[t.dtype], shape: t.shape, data: t.data });
  };
  put("model.embed_tokens.weight", weights.embed);
  for (const [i, L] of weights.layers.entries()) {
    const p = `model.layers.${i}.`;
    put(`${p}input_layernorm.weight`, L.inputNorm);
    put(`${p}self_attn.q_proj.weight`, L.q);
    put(`${p}self_attn.k_proj.weight`, L.k);
    put(`${p}self_attn.v_proj.weight`, L.v);
    put(`${p}self_attn.q_proj.bias`, L.qBias);
    put(`${p}self_attn.k_proj.bias`, L.kBias);
    put(`${p}self_attn.v_proj.bias`, L.vBias);
    put(`${p}self_attn.q_norm.weight`, L.qNorm);
    put(`${p}self_attn.k_norm.weight`, L.kNorm);
    put(`${p}self_attn.o_proj.weight`, L.o);
    if (spec.sandwichNorms) {
      put(`${p}post_attention_layernorm.weight`, L.attnOutNorm);
      put(`${p}pre_feedforward_layernorm.weight`, L.mlpNorm);
      put(`${p}post_feedforward_layernorm.weight`, L.mlpOutNorm);
    } else {
      put(`${p}post_attention_layernorm.weight`, L.mlpNorm);
    }
    put(`${p}mlp.gate_proj.weight`, L.gate);
    put(`${p}mlp.up_proj.weight`, L.up);
    put(`${p}mlp.down_proj.weight`, L.down);
  }
  put("model.norm.weight", weights.norm);
  if (!spec.tiedEmbeddings) put("lm_head.weight", weights.lmHead);
  return out;
}

export function openEngine(
  spec: EngineSpec,
  weights: ModelWeights,
  opts: EngineOptions = {},
): Promise<Engine> {
  return createEngine(nativeSpec(spec, weights.embed.dtype), nativeWeights(weights, spec), opts);
}
