import {
  type Json,
  ModelConfigError,
  nonNegInt,
  onlyValue,
  optBool,
  optPosInt,
  optString,
  posFloat,
  posFloatOrOff,
  posFloats,
  posInt,
  tokenIds,
} from "./config-read.ts";
import { type AttentionLayout, GLOBAL_LAYER, slidingLayer } from "./layout.ts";

export { ModelConfigError } from "./config-read.ts";

/**
 * Parses a Hugging Face `config.json` into the engine's spec. Supported:
 * LlamaForCausalLM (Llama 2 and 3), MistralForCausalLM, Qwen2ForCausalLM
 * (q/k/v bias), Qwen3ForCausalLM (q/k norms), Gemma2ForCausalLM,
 * Gemma3ForCausalLM (text) and Phi3ForCausalLM, each with its sliding-window
 * layers where the config turns them on. Missing optional keys take the
 * Hugging Face defaults of that architecture; a key that is present but
 * wrong, or a feature the engine does not implement (a rope scaling type, a
 * mixture-of-experts block), is an error naming the key — never a silent
 * fallback.
 */

/** Llama-3 frequency-dependent RoPE scaling (rope_type "llama3"). */
export interface Llama3RopeScaling {
  readonly kind: "llama3";
  readonly factor: number;
  readonly lowFreqFactor: number;
  readonly highFreqFactor: number;
  readonly originalMaxPosition: number;
}

/** Position interpolation (rope_type "linear"): every frequency divided by `factor`. */
export interface LinearRopeScaling {
  readonly kind: "linear";
  readonly factor: number;
}

/**
 * Phi-3's LongRoPE (rope_type "longrope", formerly "su"): frequency i divided
 * by factors[i], and cos/sin multiplied by attentionFactor. Hugging Face
 * picks the long factors when max_position_embeddings exceeds
 * original_max_position_embeddings, then switches back to the short ones for
 * a sequence that is still shorter; a prefix's K/V would then depend on how
 * long the sequence later grows, so here the factors are fixed per model: the
 * ones Hugging Face initialises with (long for a long-context model).
 */
export interface LongRopeScaling {
  readonly kind: "longrope";
  readonly factors: readonly number[];
  /** Which of the config's lists `factors` is. */
  readonly set: "long" | "short";
  readonly attentionFactor: number;
}

export type RopeScaling = Llama3RopeScaling | LinearRopeScaling | LongRopeScaling;

export type Family = "llama" | "qwen3" | "gemma2" | "gemma3" | "phi3";
export type Activation = "silu" | "gelu_tanh";

/**
 * What the native engine needs to shape its computation. Heads: q has
 * `nHeads` heads, k/v have `nKvHeads` (GQA: head h reads kv head
 * h / (nHeads / nKvHeads)); `headDim` for q/k, `vHeadDim` for v. The family
 * fields say how a layer differs from Llama's (native/src/backend.h gives
 * the forward they drive).
 */
export interface EngineSpec {
  readonly nLayers: number;
  readonly hidden: number;
  readonly nHeads: number;
  readonly nKvHeads: number;
  readonly headDim: number;
  readonly vHeadDim: number;
  /** MLP inner width (intermediate_size). */
  readonly ffn: number;
  /** Rows of the embedding and lm_head (may exceed the tokenizer's vocabulary). */
  readonly vocab: number;
  readonly rmsEps: number;
  readonly ropeTheta: number;
  /** Scaling of the global layers' RoPE frequencies. */
  readonly ropeScaling?: RopeScaling;
  /** q/k/v projections carry a bias (Qwen2). o_proj never does. */
  readonly attentionBias: boolean;
  /** lm_head shares model.embed_tokens.weight. */
  readonly tiedEmbeddings: boolean;
  /** Longest context (positions 0..maxPosition-1) the model supports exactly. */
  readonly maxPosition: number;
  readonly family: Family;
  /** Per layer: global, or sliding with its window (layout.ts). */
  readonly layers: readonly AttentionLayout[];
  /** RMSNorm multiplies by (1 + w) instead of w (Gemma). */
  readonly normOffset: boolean;
  /** RMSNorm of every q and k head before RoPE, weights q_norm / k_norm [headDim] (Qwen3, Gemma 3). */
  readonly qkNorm: boolean;
  /** Norms on the attention and MLP outputs, and pre_feedforward_layernorm before the MLP (Gemma). */
  readonly sandwichNorms: boolean;
  /** The MLP gate: silu (SwiGLU) or gelu_pytorch_tanh (GeGLU). */
  readonly activation: Activation;
  /** Embeddings multiplied by √hidden (Gemma). */
  readonly scaleEmbeddings: boolean;
  /** Softmax scale query_pre_attn_scalar^-0.5 (Gemma); null: 1/√headDim. */
  readonly attnScale: number | null;
  /** Scores become cap · tanh(score / cap) (Gemma 2's attn_logit_softcapping). */
  readonly attnSoftcap: number | null;
  /** Logits become cap · tanh(logit / cap) (final_logit_softcapping). */
  readonly finalSoftcap: number | null;
  /** RoPE base of the sliding layers, unscaled (Gemma 3's rope_local_base_freq); absent: ropeTheta. */
  readonly localRopeTheta?: number;
  /** The checkpoint fuses q/k/v into qkv_proj and gate/up into gate_up_proj (Phi-3). */
  readonly fusedProjections: boolean;
}

export type Architecture =
  | "LlamaForCausalLM"
  | "MistralForCausalLM"
  | "Qwen2ForCausalLM"
  | "Qwen3ForCausalLM"
  | "Gemma2ForCausalLM"
  | "Gemma3ForCausalLM"
  | "Phi3ForCausalLM";

export interface ModelConfig {
  readonly architecture: Architecture;
  readonly spec: EngineSpec;
  readonly bosTokenId: number | null;
  /** Every token id that ends generation (eos_token_id may be a list). */
  readonly eosTokenIds: readonly number[];
  /** torch_dtype as written, for information only. */
  readonly torchDtype: string | null;
}

/** Per-architecture Hugging Face defaults (their configuration_*.py) for keys a config may omit. */
interface ArchDefaults {
  readonly family: Family;
  readonly modelType: string;
  readonly maxPosition: number;
  readonly tied: boolean;
  readonly ropeTheta: number;
  readonly rmsEps: number;
  /** head_dim when absent; null: hidden_size / num_attention_heads. */
  readonly headDim: number | null;
  /** sliding_window when absent (null: none). */
  readonly slidingWindow: number | null;
}

const ARCHS: Record<Architecture, ArchDefaults> = {
  LlamaForCausalLM: d("llama", "llama", 2048, false, 10000, 1e-6, null, null),
  MistralForCausalLM: d("llama", "mistral", 4096 * 32, false, 10000, 1e-6, null, 4096),
  Qwen2ForCausalLM: d("llama", "qwen2", 32768, false, 10000, 1e-6, null, 4096),
  Qwen3ForCausalLM: d("qwen3", "qwen3", 32768, false, 10000, 1e-6, 128, 4096),
  Gemma2ForCausalLM: d("gemma2", "gemma2", 8192, true, 10000, 1e-6, 256, 4096),
  Gemma3ForCausalLM: d("gemma3", "gemma3_text", 131072, true, 1e6, 1e-6, 256, 4096),
  Phi3ForCausalLM: d("phi3", "phi3", 4096, false, 10000, 1e-5, null, null),
};

function d(
  family: Family,
  modelType: string,
  maxPosition: number,
  tied: boolean,
  ropeTheta: number,
  rmsEps: number,
  headDim: number | null,
  slidingWindow: number | null,
): ArchDefaults {
  return { family, modelType, maxPosition, tied, ropeTheta, rmsEps, headDim, slidingWindow };
}

const ARCH_BY_MODEL_TYPE = new Map(
  Object.entries(ARCHS).map(([arch, a]) => [a.modelType, arch as Architecture] as const),
);

/** Keys of mixture-of-experts configs (Mixtral, Qwen2/3-MoE, Phi-3.5-MoE); none is implemented. */
const MOE_KEYS = ["num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size"] as const;

function architectureOf(cfg: Json): Architecture {
  const archs = cfg.architectures;
  if (archs !== undefined && archs !== null) {
    if (!Array.isArray(archs) || archs.length !== 1 || typeof archs[0] !== "string")
      throw new ModelConfigError("architectures", `must be a list of one name, got ${JSON.stringify(archs)}`);
    const name = archs[0];
    if (name in ARCHS) return name as Architecture;
    const hint =
      name === "Gemma3ForConditionalGeneration"
        ? " (the text-only Gemma3ForCausalLM, model_type gemma3_text, is)"
        : "";
    throw new ModelConfigError(
      "architectures",
      `'${name}' is not supported${hint} (supported: ${Object.keys(ARCHS).join(", ")})`,
    );
  }
  const mt = cfg.model_type;
  const arch = typeof mt === "string" ? ARCH_BY_MODEL_TYPE.get(mt) : undefined;
  if (arch) return arch;
  if (mt === undefined)
    throw new ModelConfigError("architectures", "missing (and no model_type to infer it)");
  throw new ModelConfigError(
    "model_type",
    `'${String(mt)}' is not supported (supported: ${[...ARCH_BY_MODEL_TYPE.keys()].join(", ")})`,
  );
}

function ropeScalingOf(
  cfg: Json,
  family: Family,
  headDim: number,
  maxPosition: number,
): RopeScaling | undefined {
  const rs = cfg.rope_scaling;
  if (rs === undefined || rs === null) return undefined;
  if (typeof rs !== "object" || Array.isArray(rs))
    throw new ModelConfigError("rope_scaling", `must be an object or null, got ${JSON.stringify(rs)}`);
  const o = rs as Json;
  // Older configs spell rope_type as "type"; Phi-3's first long-context configs called LongRoPE "su".
  const type = o.rope_type ?? o.type;
  if (type === "default") return undefined;
  if (type === "linear")
    return { kind: "linear", factor: posFloat(o, "factor", undefined, "rope_scaling.factor") };
  if (type === "llama3" && family !== "phi3") {
    const s: Llama3RopeScaling = {
      kind: "llama3",
      factor: posFloat(o, "factor", undefined, "rope_scaling.factor"),
      lowFreqFactor: posFloat(o, "low_freq_factor", undefined, "rope_scaling.low_freq_factor"),
      highFreqFactor: posFloat(o, "high_freq_factor", undefined, "rope_scaling.high_freq_factor"),
      originalMaxPosition: posInt(
        o,
        "original_max_position_embeddings",
        "rope_scaling.original_max_position_embeddings",
      ),
    };
    if (s.highFreqFactor <= s.lowFreqFactor)
      throw new ModelConfigError(
        "rope_scaling.high_freq_factor",
        `must exceed low_freq_factor (${s.lowFreqFactor}), got ${s.highFreqFactor}`,
      );
    return s;
  }
  if ((type === "longrope" || type === "su") && family === "phi3")
    return longRope(cfg, o, headDim, maxPosition);
  throw new ModelConfigError(
    "rope_scaling.rope_type",
    `${JSON.stringify(type)} is not supported for this architecture (supported: default, linear, ${family === "phi3" ? "longrope" : "llama3"})`,
  );
}

/**
 * transformers' _compute_longrope_parameters with Phi-3's top-level
 * original_max_position_embeddings (Phi3Config's default 4096):
 * factor = max_position / original; attention_factor as given, else
 * √(1 + ln factor / ln original) when factor > 1, else 1; the long factors
 * when max_position > original.
 */
function longRope(cfg: Json, o: Json, headDim: number, maxPosition: number): LongRopeScaling {
  const half = headDim / 2;
  const long = posFloats(o, "long_factor", half, "rope_scaling.long_factor");
  const short = posFloats(o, "short_factor", half, "rope_scaling.short_factor");
  const original = optPosInt(cfg, "original_max_position_embeddings", 4096);
  const factor = maxPosition / original;
  const attentionFactor = posFloat(
    o,
    "attention_factor",
    factor <= 1 ? 1 : Math.sqrt(1 + Math.log(factor) / Math.log(original)),
    "rope_scaling.attention_factor",
  );
  const useLong = maxPosition > original;
  return {
    kind: "longrope",
    factors: useLong ? long : short,
    set: useLong ? "long" : "short",
    attentionFactor,
  };
}

/**
 * Which layers slide: `layer_types` when the config lists them, else the
 * architecture's rule (the configuration_*.py that writes layer_types).
 */
function slidingLayers(cfg: Json, arch: Architecture, nLayers: number): boolean[] {
  const lt = cfg.layer_types;
  if (lt !== undefined && lt !== null) {
    if (!Array.isArray(lt) || lt.length !== nLayers)
      throw new ModelConfigError("layer_types", `must list the ${nLayers} layers' attention types`);
    return lt.map((t, i) => {
      if (t === "sliding_attention") return true;
      if (t === "full_attention") return false;
      throw new ModelConfigError(
        `layer_types[${i}]`,
        `${JSON.stringify(t)} is not supported (supported: sliding_attention, full_attention)`,
      );
    });
  }
  const layers = Array.from({ length: nLayers }, (_, i) => i);
  switch (arch) {
    case "LlamaForCausalLM":
      return layers.map(() => false);
    case "MistralForCausalLM":
    case "Phi3ForCausalLM":
      return layers.map(() => true);
    case "Qwen2ForCausalLM":
    case "Qwen3ForCausalLM": {
      // Layers from max_window_layers on slide, when use_sliding_window.
      const use = optBool(cfg, "use_sliding_window", false);
      const from = nonNegInt(cfg, "max_window_layers", 28);
      return layers.map((i) => use && i >= from);
    }
    case "Gemma2ForCausalLM":
      return layers.map((i) => (i + 1) % 2 !== 0);
    case "Gemma3ForCausalLM": {
      const pattern = optPosInt(cfg, "sliding_window_pattern", 6);
      return layers.map((i) => (i + 1) % pattern !== 0);
    }
  }
}

function layoutOf(cfg: Json, arch: Architecture, nLayers: number, maxPosition: number): AttentionLayout[] {
  const sliding = slidingLayers(cfg, arch, nLayers);
  const def = ARCHS[arch].slidingWindow;
  const window =
    cfg.sliding_window === undefined
      ? def
      : cfg.sliding_window === null
        ? null
        : posInt(cfg, "sliding_window");
  // A "sliding" layer without a window attends to everything (transformers passes sliding_window=None).
  return sliding.map((s) => (s && window !== null ? slidingLayer(window, maxPosition) : GLOBAL_LAYER));
}

function refuseUnsupported(cfg: Json, arch: Architecture, family: Family): void {
  for (const key of MOE_KEYS)
    if (cfg[key] !== undefined && cfg[key] !== null && cfg[key] !== 0)
      throw new ModelConfigError(key, "mixture-of-experts blocks are not supported");
  if (cfg.rope_parameters !== undefined && cfg.rope_parameters !== null)
    throw new ModelConfigError(
      "rope_parameters",
      "is not supported (transformers 5's form); give rope_theta and rope_scaling as transformers 4 writes them",
    );
  onlyValue(cfg, "partial_rotary_factor", 1, "RoPE rotates the whole head");
  onlyValue(cfg, "use_bidirectional_attention", false, "the engine is causal");
  if (arch !== "Qwen2ForCausalLM") onlyValue(cfg, "attention_bias", false, "bias on q/k/v/o");
  onlyValue(cfg, "mlp_bias", false, "bias on the MLP");
  if (family === "gemma2" || family === "gemma3") {
    // Gemma's MLP reads hidden_activation; transformers ignores hidden_act there.
    const act = optString(cfg, "hidden_activation", "gelu_pytorch_tanh");
    if (act !== "gelu_pytorch_tanh")
      throw new ModelConfigError(
        "hidden_activation",
        `${JSON.stringify(act)} is not supported (gelu_pytorch_tanh)`,
      );
  } else {
    const act = cfg.hidden_act ?? "silu";
    if (act !== "silu")
      throw new ModelConfigError(
        "hidden_act",
        `${JSON.stringify(act)} is not supported (the engine runs SwiGLU: silu)`,
      );
  }
  if (family !== "gemma2" && family !== "gemma3")
    for (const key of ["attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"] as const)
      onlyValue(cfg, key, null, "not part of this architecture");
}

/** Parses config.json's object. Throws ModelConfigError naming the first bad key. */
export function parseModelConfig(raw: unknown): ModelConfig {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw))
    throw new ModelConfigError("(root)", "must be a JSON object");
  const cfg = raw as Json;
  const architecture = architectureOf(cfg);
  const a = ARCHS[architecture];
  const family = a.family;
  refuseUnsupported(cfg, architecture, family);
  const gemma = family === "gemma2" || family === "gemma3";

  const hidden = posInt(cfg, "hidden_size");
  const nLayers = posInt(cfg, "num_hidden_layers");
  const nHeads = posInt(cfg, "num_attention_heads");
  const nKvHeads = optPosInt(cfg, "num_key_value_heads", nHeads);
  if (nHeads % nKvHeads !== 0)
    throw new ModelConfigError(
      "num_key_value_heads",
      `${nKvHeads} must divide num_attention_heads (${nHeads}) for grouped-query attention`,
    );
  let headDim: number;
  if ((cfg.head_dim === undefined || cfg.head_dim === null) && a.headDim === null) {
    if (hidden % nHeads !== 0)
      throw new ModelConfigError(
        "num_attention_heads",
        `${nHeads} must divide hidden_size (${hidden}) when head_dim is not given`,
      );
    headDim = hidden / nHeads;
  } else {
    headDim = optPosInt(cfg, "head_dim", a.headDim ?? 0);
  }
  if (headDim % 2 !== 0)
    throw new ModelConfigError("head_dim", `must be even for rotary embedding, got ${headDim}`);
  const ffn = posInt(cfg, "intermediate_size");
  const vocab = posInt(cfg, "vocab_size");
  const rmsEps = posFloat(cfg, "rms_norm_eps", a.rmsEps);
  const ropeTheta = posFloat(cfg, "rope_theta", a.ropeTheta);
  const maxPosition = optPosInt(cfg, "max_position_embeddings", a.maxPosition);
  const ropeScaling = ropeScalingOf(cfg, family, headDim, maxPosition);
  const layers = layoutOf(cfg, architecture, nLayers, maxPosition);

  const eos = tokenIds(cfg, "eos_token_id");
  const bos = tokenIds(cfg, "bos_token_id");
  if (bos.length > 1) throw new ModelConfigError("bos_token_id", "must be one token id");
  for (const [key, ids] of [
    ["bos_token_id", bos],
    ["eos_token_id", eos],
  ] as const) {
    for (const id of ids)
      if (id >= vocab) throw new ModelConfigError(key, `token id ${id} is outside vocab_size (${vocab})`);
  }
  const torchDtype = typeof cfg.torch_dtype === "string" ? cfg.torch_dtype : null;

  const spec: EngineSpec = {
    nLayers,
    hidden,
    nHeads,
    nKvHeads,
    headDim,
    vHeadDim: headDim,
    ffn,
    vocab,
    rmsEps,
    ropeTheta,
    ...(ropeScaling ? { ropeScaling } : {}),
    attentionBias: architecture === "Qwen2ForCausalLM",
    tiedEmbeddings: optBool(cfg, "tie_word_embeddings", a.tied),
    maxPosition,
    family,
    layers,
    normOffset: gemma,
    qkNorm: family === "qwen3" || family === "gemma3",
    sandwichNorms: gemma,
    activation: gemma ? "gelu_tanh" : "silu",
    scaleEmbeddings: gemma,
    attnScale: gemma ? posFloat(cfg, "query_pre_attn_scalar", 256) ** -0.5 : null,
    attnSoftcap: gemma ? posFloatOrOff(cfg, "attn_logit_softcapping", family === "gemma2" ? 50 : null) : null,
    finalSoftcap: gemma
      ? posFloatOrOff(cfg, "final_logit_softcapping", family === "gemma2" ? 30 : null)
      : null,
    ...(family === "gemma3" ? { localRopeTheta: posFloat(cfg, "rope_local_base_freq", 10000) } : {}),
    fusedProjections: family === "phi3",
  };
  return { architecture, spec, bosTokenId: bos[0] ?? null, eosTokenIds: eos, torchDtype };
}
