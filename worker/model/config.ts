/**
 * Parses a Hugging Face `config.json` of the Llama family into the engine's
 * spec. Supported: LlamaForCausalLM (Llama 2 and 3, including Llama-3 rope
 * scaling), MistralForCausalLM and Qwen2ForCausalLM (bias on q/k/v). Missing
 * optional keys take the Hugging Face defaults of that architecture; a key
 * that is present but wrong, or a feature the engine does not implement, is an
 * error naming the key — never a silent fallback.
 */

/** Llama-3 frequency-dependent RoPE scaling (rope_type "llama3"). */
export interface Llama3RopeScaling {
  readonly kind: "llama3";
  readonly factor: number;
  readonly lowFreqFactor: number;
  readonly highFreqFactor: number;
  readonly originalMaxPosition: number;
}

export type RopeScaling = Llama3RopeScaling;

/**
 * What the native engine needs to shape its computation. Heads: q has
 * `nHeads` heads, k/v have `nKvHeads` (GQA: head h reads kv head
 * h / (nHeads / nKvHeads)); `headDim` for q/k, `vHeadDim` for v.
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
  readonly ropeScaling?: RopeScaling;
  /** q/k/v projections carry a bias (Qwen2). o_proj never does. */
  readonly attentionBias: boolean;
  /** lm_head shares model.embed_tokens.weight. */
  readonly tiedEmbeddings: boolean;
  /** Longest context (positions 0..maxPosition-1) the model supports exactly. */
  readonly maxPosition: number;
}

export type Architecture = "LlamaForCausalLM" | "MistralForCausalLM" | "Qwen2ForCausalLM";

export interface ModelConfig {
  readonly architecture: Architecture;
  readonly spec: EngineSpec;
  readonly bosTokenId: number | null;
  /** Every token id that ends generation (eos_token_id may be a list). */
  readonly eosTokenIds: readonly number[];
  /** torch_dtype as written, for information only. */
  readonly torchDtype: string | null;
}

export class ModelConfigError extends Error {
  override readonly name = "ModelConfigError";
  constructor(
    readonly key: string,
    message: string,
  ) {
    super(`config.json: ${key}: ${message}`);
  }
}

const ARCH_BY_MODEL_TYPE: Record<string, Architecture> = {
  llama: "LlamaForCausalLM",
  mistral: "MistralForCausalLM",
  qwen2: "Qwen2ForCausalLM",
};

/** Per-architecture Hugging Face defaults for keys a config may omit. */
const DEFAULTS: Record<Architecture, { maxPosition: number; tied: boolean; ropeTheta: number }> = {
  LlamaForCausalLM: { maxPosition: 2048, tied: false, ropeTheta: 10000 },
  MistralForCausalLM: { maxPosition: 4096 * 32, tied: false, ropeTheta: 10000 },
  Qwen2ForCausalLM: { maxPosition: 32768, tied: false, ropeTheta: 10000 },
};

type Json = Record<string, unknown>;

function posInt(obj: Json, key: string, path = key): number {
  const v = obj[key];
  if (v === undefined || v === null) throw new ModelConfigError(path, "missing (a positive integer)");
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v <= 0)
    throw new ModelConfigError(path, `must be a positive integer, got ${JSON.stringify(v)}`);
  return v;
}

function optPosInt(obj: Json, key: string, fallback: number, path = key): number {
  return obj[key] === undefined || obj[key] === null ? fallback : posInt(obj, key, path);
}

function posFloat(obj: Json, key: string, fallback: number | undefined, path = key): number {
  const v = obj[key];
  if (v === undefined || v === null) {
    if (fallback === undefined) throw new ModelConfigError(path, "missing (a positive number)");
    return fallback;
  }
  if (typeof v !== "number" || !Number.isFinite(v) || v <= 0)
    throw new ModelConfigError(path, `must be a positive finite number, got ${JSON.stringify(v)}`);
  return v;
}

function optBool(obj: Json, key: string, fallback: boolean): boolean {
  const v = obj[key];
  if (v === undefined || v === null) return fallback;
  if (typeof v !== "boolean")
    throw new ModelConfigError(key, `must be true or false, got ${JSON.stringify(v)}`);
  return v;
}

function tokenId(v: unknown, key: string): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0)
    throw new ModelConfigError(key, `must be a token id (a non-negative integer), got ${JSON.stringify(v)}`);
  return v;
}

function architectureOf(cfg: Json): Architecture {
  const archs = cfg.architectures;
  if (archs !== undefined && archs !== null) {
    if (!Array.isArray(archs) || archs.length !== 1 || typeof archs[0] !== "string")
      throw new ModelConfigError("architectures", `must be a list of one name, got ${JSON.stringify(archs)}`);
    const name = archs[0];
    if (name in DEFAULTS) return name as Architecture;
    throw new ModelConfigError(
      "architectures",
      `'${name}' is not supported (supported: ${Object.keys(DEFAULTS).join(", ")})`,
    );
  }
  const mt = cfg.model_type;
  if (typeof mt === "string" && mt in ARCH_BY_MODEL_TYPE) return ARCH_BY_MODEL_TYPE[mt]!;
  if (mt === undefined)
    throw new ModelConfigError("architectures", "missing (and no model_type to infer it)");
  throw new ModelConfigError(
    "model_type",
    `'${String(mt)}' is not supported (supported: ${Object.keys(ARCH_BY_MODEL_TYPE).join(", ")})`,
  );
}

function ropeScalingOf(cfg: Json): RopeScaling | undefined {
  const rs = cfg.rope_scaling;
  if (rs === undefined || rs === null) return undefined;
  if (typeof rs !== "object" || Array.isArray(rs))
    throw new ModelConfigError("rope_scaling", `must be an object or null, got ${JSON.stringify(rs)}`);
  const o = rs as Json;
  // Older configs spell rope_type as "type".
  const type = o.rope_type ?? o.type;
  if (type === "default") return undefined;
  if (type === "llama3") {
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
  throw new ModelConfigError(
    "rope_scaling.rope_type",
    `${JSON.stringify(type)} is not supported (supported: default, llama3)`,
  );
}

function tokenIds(cfg: Json, key: string): number[] {
  const v = cfg[key];
  if (v === undefined || v === null) return [];
  if (Array.isArray(v)) return v.map((x, i) => tokenId(x, `${key}[${i}]`));
  return [tokenId(v, key)];
}

/** Parses config.json's object. Throws ModelConfigError naming the first bad key. */
export function parseModelConfig(raw: unknown): ModelConfig {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw))
    throw new ModelConfigError("(root)", "must be a JSON object");
  const cfg = raw as Json;
  const architecture = architectureOf(cfg);
  const d = DEFAULTS[architecture];

  const act = cfg.hidden_act ?? "silu";
  if (act !== "silu")
    throw new ModelConfigError(
      "hidden_act",
      `${JSON.stringify(act)} is not supported (the engine runs SwiGLU: silu)`,
    );
  if (architecture !== "Qwen2ForCausalLM" && optBool(cfg, "attention_bias", false))
    throw new ModelConfigError(
      "attention_bias",
      "true is not supported for this architecture (bias on q/k/v/o)",
    );
  if (optBool(cfg, "mlp_bias", false)) throw new ModelConfigError("mlp_bias", "true is not supported");

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
  if (cfg.head_dim === undefined || cfg.head_dim === null) {
    if (hidden % nHeads !== 0)
      throw new ModelConfigError(
        "num_attention_heads",
        `${nHeads} must divide hidden_size (${hidden}) when head_dim is not given`,
      );
    headDim = hidden / nHeads;
  } else {
    headDim = posInt(cfg, "head_dim");
  }
  if (headDim % 2 !== 0)
    throw new ModelConfigError("head_dim", `must be even for rotary embedding, got ${headDim}`);
  const ffn = posInt(cfg, "intermediate_size");
  const vocab = posInt(cfg, "vocab_size");
  const rmsEps = posFloat(cfg, "rms_norm_eps", 1e-6);
  const ropeTheta = posFloat(cfg, "rope_theta", d.ropeTheta);
  const ropeScaling = ropeScalingOf(cfg);
  let maxPosition = optPosInt(cfg, "max_position_embeddings", d.maxPosition);

  // Sliding-window attention equals full attention while the context fits in
  // the window, so such a model runs exactly with its context capped there.
  const slidingActive =
    architecture === "MistralForCausalLM" ||
    (architecture === "Qwen2ForCausalLM" && optBool(cfg, "use_sliding_window", false));
  if (slidingActive && cfg.sliding_window !== undefined && cfg.sliding_window !== null)
    maxPosition = Math.min(maxPosition, posInt(cfg, "sliding_window"));

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
    tiedEmbeddings: optBool(cfg, "tie_word_embeddings", d.tied),
    maxPosition,
  };
  return { architecture, spec, bosTokenId: bos[0] ?? null, eosTokenIds: eos, torchDtype };
}
