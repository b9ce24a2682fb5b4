import type { Architecture, Llama3RopeScaling, ModelConfig } from "./config.ts";
import { ModelConfigError, parseModelConfig } from "./config.ts";
import { GgufError, type GgufMeta } from "./gguf.ts";
import { ropeInvFreq } from "./rope.ts";

/**
 * How a GGUF architecture maps onto the engine: its Hugging Face
 * architecture, its metadata keys (`ARCH.embedding_length`, …) and its tensor
 * names (`blk.N.attn_q.weight`, …). To add a family, add a row to
 * GGUF_ARCHITECTURES (and HF_TO_GGUF for writing) once config.ts knows the
 * family's config.json; tensors outside the names below are refused.
 */
export interface GgufArchitecture {
  /** config.json's `architectures[0]` for the same model. */
  readonly hf: Architecture;
  readonly modelType: string;
  /**
   * llama.cpp's converter stores q/k rows permuted for its interleaved RoPE
   * (pairs (2i, 2i+1)); the engine rotates Hugging Face's halves (i, i + d/2),
   * so the rows are put back on load and permuted again on write.
   */
  readonly permutedQK: boolean;
  /**
   * llama.cpp's Gemma converters store every `*norm.weight` as 1 + w (its
   * RMSNorm multiplies by the weight); the engine's Gemma norm adds the 1
   * itself, so 1 is subtracted on load and added on write.
   */
  readonly normShift: boolean;
  /** Which layers slide when the file has a window (llama.cpp fixes the pattern per architecture). */
  readonly sliding: "all" | "alternate" | "pattern";
}

const row = (
  hf: Architecture,
  modelType: string,
  permutedQK: boolean,
  normShift: boolean,
  sliding: GgufArchitecture["sliding"],
): GgufArchitecture => ({ hf, modelType, permutedQK, normShift, sliding });

export const GGUF_ARCHITECTURES: Readonly<Record<string, GgufArchitecture>> = {
  // Llama 2/3 and Mistral (llama.cpp writes Mistral as "llama").
  llama: row("LlamaForCausalLM", "llama", true, false, "all"),
  qwen2: row("Qwen2ForCausalLM", "qwen2", false, false, "all"),
  // Qwen3: Qwen2's layout without biases, with per-head q/k RMSNorms.
  qwen3: row("Qwen3ForCausalLM", "qwen3", false, false, "all"),
  // Gemma 2: sliding and global layers alternate (llama.cpp's swa pattern 2).
  gemma2: row("Gemma2ForCausalLM", "gemma2", false, true, "alternate"),
  // Gemma 3 (text): pattern-1 sliding layers to 1 global (llama.cpp fixes 6).
  gemma3: row("Gemma3ForCausalLM", "gemma3_text", false, true, "pattern"),
  // Phi-3: fused qkv and gate_up, LongRoPE factors as tensors.
  phi3: row("Phi3ForCausalLM", "phi3", false, false, "all"),
};

/** The GGUF architecture a Hugging Face architecture is written as. */
export const HF_TO_GGUF: Readonly<Partial<Record<Architecture, string>>> = {
  LlamaForCausalLM: "llama",
  MistralForCausalLM: "llama",
  Qwen2ForCausalLM: "qwen2",
  Qwen3ForCausalLM: "qwen3",
  Gemma2ForCausalLM: "gemma2",
  Gemma3ForCausalLM: "gemma3",
  Phi3ForCausalLM: "phi3",
};

/** GGUF tensor name → Hugging Face name (per layer: `blk.N.` ↔ `model.layers.N.`). */
const MODEL_NAMES: readonly (readonly [string, string])[] = [
  ["token_embd.weight", "model.embed_tokens.weight"],
  ["output_norm.weight", "model.norm.weight"],
  ["output.weight", "lm_head.weight"],
];
const LAYER_NAMES: readonly (readonly [string, string])[] = [
  ["attn_norm.weight", "input_layernorm.weight"],
  ["attn_q.weight", "self_attn.q_proj.weight"],
  ["attn_k.weight", "self_attn.k_proj.weight"],
  ["attn_v.weight", "self_attn.v_proj.weight"],
  ["attn_q.bias", "self_attn.q_proj.bias"],
  ["attn_k.bias", "self_attn.k_proj.bias"],
  ["attn_v.bias", "self_attn.v_proj.bias"],
  ["attn_q_norm.weight", "self_attn.q_norm.weight"],
  ["attn_k_norm.weight", "self_attn.k_norm.weight"],
  ["attn_output.weight", "self_attn.o_proj.weight"],
  ["ffn_norm.weight", "post_attention_layernorm.weight"],
  ["ffn_gate.weight", "mlp.gate_proj.weight"],
  ["ffn_up.weight", "mlp.up_proj.weight"],
  ["ffn_down.weight", "mlp.down_proj.weight"],
];
// Gemma's four norms per layer (llama.cpp: attn_norm, post_attention_norm, ffn_norm, post_ffw_norm).
const SANDWICH_NAMES: readonly (readonly [string, string])[] = [
  ["post_attention_norm.weight", "post_attention_layernorm.weight"],
  ["ffn_norm.weight", "pre_feedforward_layernorm.weight"],
  ["post_ffw_norm.weight", "post_feedforward_layernorm.weight"],
];
// Phi-3's fused projections (llama.cpp keeps gate_up as one ffn_up of 2·ffn rows, gate first).
const FUSED_NAMES: readonly (readonly [string, string])[] = [
  ["attn_qkv.weight", "self_attn.qkv_proj.weight"],
  ["ffn_up.weight", "mlp.gate_up_proj.weight"],
];

interface NameMaps {
  readonly layerToHf: ReadonlyMap<string, string>;
  readonly layerToGguf: ReadonlyMap<string, string>;
}

function nameMaps(arch: string): NameMaps {
  const a = GGUF_ARCHITECTURES[arch];
  if (a === undefined) throw new GgufError(`unknown GGUF architecture '${arch}'`);
  const extra = a.normShift ? SANDWICH_NAMES : a.hf === "Phi3ForCausalLM" ? FUSED_NAMES : [];
  const taken = new Set(extra.map(([g]) => g));
  const rows = [...LAYER_NAMES.filter(([g]) => !taken.has(g)), ...extra];
  return {
    layerToHf: new Map(rows),
    layerToGguf: new Map(rows.map(([g, h]) => [h, g])),
  };
}
const NAME_MAPS = new Map(Object.keys(GGUF_ARCHITECTURES).map((a) => [a, nameMaps(a)]));
const mapsOf = (arch: string) => NAME_MAPS.get(arch) ?? nameMaps(arch);
const TO_HF = new Map(MODEL_NAMES);
const TO_GGUF = new Map(MODEL_NAMES.map(([g, h]) => [h, g]));

/** llama.cpp's per-frequency RoPE factors (Llama 3.1 scaling), not a model weight. */
export const ROPE_FREQS = "rope_freqs.weight";
/** Phi-3's LongRoPE factors (llama.cpp picks one list per context at run time). */
export const ROPE_FACTORS_LONG = "rope_factors_long.weight";
export const ROPE_FACTORS_SHORT = "rope_factors_short.weight";
/** Tensors that carry RoPE parameters rather than weights. */
export const ROPE_TENSORS: ReadonlySet<string> = new Set([ROPE_FREQS, ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT]);

/** The Hugging Face name of a GGUF tensor, or undefined when it has none. */
export function hfTensorName(gguf: string, arch: string): string | undefined {
  const m = /^blk\.(\d+)\.(.+)$/.exec(gguf);
  if (m) {
    const suffix = mapsOf(arch).layerToHf.get(m[2]!);
    return suffix === undefined ? undefined : `model.layers.${Number(m[1])}.${suffix}`;
  }
  return TO_HF.get(gguf);
}

export function ggufTensorName(hf: string, arch: string): string {
  const m = /^model\.layers\.(\d+)\.(.+)$/.exec(hf);
  const suffix = m ? mapsOf(arch).layerToGguf.get(m[2]!) : undefined;
  const name = m ? suffix && `blk.${m[1]}.${suffix}` : TO_GGUF.get(hf);
  if (name === undefined) throw new GgufError(`tensor '${hf}' has no GGUF name`);
  return name;
}

/**
 * Row order of a q or k projection [nHeads·headDim, K] in the file: GGUF row
 * h·d + 2r + j holds Hugging Face row h·d + j·d/2 + r (r < d/2, j < 2).
 * Returns, for each GGUF row, its Hugging Face row.
 */
export function interleavedRows(nHeads: number, headDim: number): Int32Array {
  const rows = new Int32Array(nHeads * headDim);
  const half = headDim / 2;
  for (let h = 0; h < nHeads; h++)
    for (let r = 0; r < half; r++)
      for (let j = 0; j < 2; j++) rows[h * headDim + 2 * r + j] = h * headDim + j * half + r;
  return rows;
}

/** Moves whole rows: out[perm[i]] = in[i] (toHf) or out[i] = in[perm[i]] (toGguf). */
export function permuteRows(data: Uint8Array, perm: Int32Array, toHf: boolean): Buffer {
  const rowBytes = data.byteLength / perm.length;
  const out = Buffer.allocUnsafeSlow(data.byteLength);
  for (let i = 0; i < perm.length; i++) {
    const [dst, src] = toHf ? [perm[i]!, i] : [i, perm[i]!];
    out.set(data.subarray(src * rowBytes, (src + 1) * rowBytes), dst * rowBytes);
  }
  return out;
}

/** llama.cpp's rope_freqs for a Llama-3 scaling: factor_i = inv_freq_i / scaled inv_freq_i. */
export function llama3RopeFactors(headDim: number, theta: number, s: Llama3RopeScaling): Float32Array {
  const plain = ropeInvFreq(headDim, theta);
  const scaled = ropeInvFreq(headDim, theta, s);
  return Float32Array.from(plain, (f, i) => f / scaled[i]!);
}

/** The Llama-3 scalings of published checkpoints, tried when a file has rope_freqs but no continuum.rope keys. */
const KNOWN_LLAMA3: readonly Omit<Llama3RopeScaling, "kind">[] = [
  { factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPosition: 8192 }, // Llama 3.1
  { factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPosition: 8192 }, // Llama 3.2
];

/** Keys this project writes beside rope_freqs, naming the scaling the factors came from. */
export const LLAMA3_KEYS = {
  factor: "continuum.rope.llama3.factor",
  lowFreqFactor: "continuum.rope.llama3.low_freq_factor",
  highFreqFactor: "continuum.rope.llama3.high_freq_factor",
  originalMaxPosition: "continuum.rope.llama3.original_context_length",
} as const;

/** config.json's rope_scaling of a Llama-3 scaling. */
export function llama3RopeJson(s: Llama3RopeScaling): Record<string, unknown> {
  return {
    rope_type: "llama3",
    factor: s.factor,
    low_freq_factor: s.lowFreqFactor,
    high_freq_factor: s.highFreqFactor,
    original_max_position_embeddings: s.originalMaxPosition,
  };
}

/**
 * The Llama-3 scaling that rope_freqs encodes: the continuum.rope.llama3.*
 * keys when present, else a published checkpoint's whose factors equal the
 * tensor's (to f32 rounding). Anything else is refused: the engine takes a
 * scaling rule, not arbitrary factors.
 */
export function ropeScalingFromFactors(
  meta: GgufMeta,
  factors: Float32Array,
  headDim: number,
  theta: number,
): Llama3RopeScaling {
  const file = meta.header.file;
  const candidates = meta.has(LLAMA3_KEYS.factor)
    ? [
        {
          factor: meta.posFloat(LLAMA3_KEYS.factor),
          lowFreqFactor: meta.posFloat(LLAMA3_KEYS.lowFreqFactor),
          highFreqFactor: meta.posFloat(LLAMA3_KEYS.highFreqFactor),
          originalMaxPosition: meta.posUint(LLAMA3_KEYS.originalMaxPosition),
        },
      ]
    : KNOWN_LLAMA3;
  if (factors.length !== headDim / 2)
    throw new GgufError(
      `${file}: tensor '${ROPE_FREQS}' has ${factors.length} factors, head_dim ${headDim} needs ${headDim / 2}`,
    );
  for (const c of candidates) {
    const s: Llama3RopeScaling = { kind: "llama3", ...c };
    const want = llama3RopeFactors(headDim, theta, s);
    if (want.every((w, i) => Math.abs(w - factors[i]!) <= 1e-6 * Math.abs(w))) return s;
  }
  throw new GgufError(
    `${file}: tensor '${ROPE_FREQS}' holds RoPE factors that match no Llama-3 scaling the engine knows (${meta.has(LLAMA3_KEYS.factor) ? "the continuum.rope.llama3.* keys disagree with it" : "no continuum.rope.llama3.* keys, and not a published Llama 3.1/3.2 scaling"})`,
  );
}

/** Keys this project writes for what llama.cpp derives instead of storing (so a file's model equals its source). */
export const CONTINUUM_KEYS = {
  /** Gemma's query_pre_attn_scalar; llama.cpp: head_dim, or hidden / heads for the 27B models. */
  queryPreAttnScalar: "continuum.attention.query_pre_attn_scalar",
  /** Gemma 3's sliding_window_pattern; llama.cpp fixes 6. */
  slidingPattern: "continuum.attention.sliding_window_pattern",
  /** Gemma 3's rope_local_base_freq; llama.cpp fixes 10000. */
  localFreqBase: "continuum.rope.local_freq_base",
} as const;

/** Gemma 3's sliding_window_pattern when the file does not say (llama.cpp's fixed value). */
export const GEMMA3_PATTERN = 6;

/** The shortest decimal that rounds to f32 `n` (what the config.json it came from said). */
export function shortestF32(n: number): number {
  if (Math.fround(n) !== n) return n;
  for (let p = 1; p < 9; p++) {
    const d = Number(n.toPrecision(p));
    if (Math.fround(d) === n) return d;
  }
  return n;
}

/** Per layer, whether it slides (given a window), by the architecture's fixed rule. */
export function slidingTypes(arch: string, nLayers: number, pattern: number): boolean[] {
  const rule = GGUF_ARCHITECTURES[arch]!.sliding;
  return Array.from({ length: nLayers }, (_, i) =>
    rule === "all" ? true : rule === "alternate" ? (i + 1) % 2 !== 0 : (i + 1) % pattern !== 0,
  );
}

/** llama.cpp's Gemma attention scale: 1/√(hidden/heads) for the 27B models (by layer count), else 1/√head_dim. */
function llamaCppQueryScalar(arch: string, layers: number, hidden: number, heads: number, headDim: number) {
  const big = (arch === "gemma2" && layers === 46) || (arch === "gemma3" && layers === 62);
  return big ? hidden / heads : headDim;
}

/** Gemma's keys of config.json from the metadata. */
function gemmaFields(
  meta: GgufMeta,
  arch: string,
  shape: { layers: number; hidden: number; heads: number; headDim: number },
) {
  const k = (s: string) => `${arch}.${s}`;
  const out: Record<string, unknown> = {
    hidden_activation: "gelu_pytorch_tanh",
    query_pre_attn_scalar: meta.posFloat(
      CONTINUUM_KEYS.queryPreAttnScalar,
      llamaCppQueryScalar(arch, shape.layers, shape.hidden, shape.heads, shape.headDim),
    ),
  };
  if (arch === "gemma2") {
    // llama.cpp's converter always writes both caps; a file without them was not made from a Gemma 2 config.
    out.attn_logit_softcapping = meta.posFloat(k("attn_logit_softcapping"));
    out.final_logit_softcapping = meta.posFloat(k("final_logit_softcapping"));
  } else {
    out.attn_logit_softcapping = meta.has(k("attn_logit_softcapping"))
      ? meta.posFloat(k("attn_logit_softcapping"))
      : null;
    out.final_logit_softcapping = meta.has(k("final_logit_softcapping"))
      ? meta.posFloat(k("final_logit_softcapping"))
      : null;
    out.rope_local_base_freq = meta.posFloat(CONTINUUM_KEYS.localFreqBase, 10000);
  }
  return out;
}

/**
 * config.json's fields from the architecture's metadata (required keys
 * checked here, naming the GGUF key; the rest validated by
 * parseModelConfig). `vocab` is the embedding's rows; `ropeScaling` the
 * config.json rope_scaling that the file's RoPE tensors encode.
 */
export function configFromGguf(
  meta: GgufMeta,
  arch: string,
  vocab: number,
  tied: boolean,
  ropeScaling: Record<string, unknown> | undefined,
): ModelConfig {
  const a = GGUF_ARCHITECTURES[arch]!;
  const file = meta.header.file;
  const k = (s: string) => `${arch}.${s}`;
  const hidden = meta.posUint(k("embedding_length"));
  const heads = meta.posUint(k("attention.head_count"));
  const layers = meta.posUint(k("block_count"));
  const headDim = meta.posUint(k("attention.key_length"), Math.floor(hidden / heads));
  if (meta.posUint(k("attention.value_length"), headDim) !== headDim)
    throw new GgufError(
      `${file}: metadata ${k("attention.value_length")} differs from key_length (not supported)`,
    );
  const ropeDims = meta.posUint(k("rope.dimension_count"), headDim);
  if (ropeDims !== headDim)
    throw new GgufError(
      `${file}: metadata ${k("rope.dimension_count")} = ${ropeDims}: partial rotary embedding (head_dim ${headDim}) is not supported`,
    );
  const scaling = meta.string(k("rope.scaling.type"), "none");
  if (scaling !== "none" && scaling !== "linear")
    throw new GgufError(
      `${file}: metadata ${k("rope.scaling.type")} = "${scaling}" is not supported (none, linear)`,
    );
  if (scaling === "linear" && ropeScaling)
    throw new GgufError(
      `${file}: metadata ${k("rope.scaling.type")} = "linear" and RoPE factor tensors: choose one`,
    );
  const rope =
    scaling === "linear"
      ? { rope_type: "linear", factor: meta.posFloat(k("rope.scaling.factor")) }
      : ropeScaling;
  if (meta.has(k("vocab_size")) && meta.posUint(k("vocab_size")) !== vocab)
    throw new GgufError(
      `${file}: metadata ${k("vocab_size")} = ${meta.posUint(k("vocab_size"))} but token_embd.weight has ${vocab} rows`,
    );
  const window = meta.uint(k("attention.sliding_window"), 0);
  const pattern = a.sliding === "pattern" ? meta.posUint(CONTINUUM_KEYS.slidingPattern, GEMMA3_PATTERN) : 0;
  const maxPosition = meta.posUint(k("context_length"));
  const bos = meta.has("tokenizer.ggml.bos_token_id") ? meta.uint("tokenizer.ggml.bos_token_id") : null;
  const eos = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
    .filter((key) => meta.has(key))
    .map((key) => meta.uint(key));
  const cfg: Record<string, unknown> = {
    architectures: [a.hf],
    model_type: a.modelType,
    hidden_size: hidden,
    num_hidden_layers: layers,
    intermediate_size: meta.posUint(k("feed_forward_length")),
    num_attention_heads: heads,
    num_key_value_heads: meta.posUint(k("attention.head_count_kv"), heads),
    head_dim: headDim,
    rms_norm_eps: meta.posFloat(k("attention.layer_norm_rms_epsilon")),
    rope_theta: meta.posFloat(k("rope.freq_base"), 10000),
    max_position_embeddings: maxPosition,
    vocab_size: vocab,
    tie_word_embeddings: tied,
    bos_token_id: bos,
    eos_token_id: [...new Set(eos)],
    // The window and which layers slide, spelled out so every architecture reads them the same way.
    sliding_window: window === 0 ? null : window,
    layer_types: slidingTypes(arch, layers, pattern).map((s) =>
      s && window > 0 ? "sliding_attention" : "full_attention",
    ),
    ...(a.normShift ? gemmaFields(meta, arch, { layers, hidden, heads, headDim }) : {}),
    ...(a.hf === "Phi3ForCausalLM"
      ? phi3Fields(meta, maxPosition, rope)
      : rope
        ? { rope_scaling: rope }
        : {}),
  };
  try {
    return parseModelConfig(cfg);
  } catch (err) {
    if (err instanceof ModelConfigError)
      throw new GgufError(`${file}: the metadata makes an invalid config: ${err.message}`);
    throw err;
  }
}

/**
 * Phi-3's original context and LongRoPE: the attention factor is left to
 * its default when the file's f32 is that default rounded (the converter
 * writes the default), so the spec equals the source's to the bit.
 */
function phi3Fields(meta: GgufMeta, maxPosition: number, rope: Record<string, unknown> | undefined) {
  const original = meta.posUint("phi3.rope.scaling.original_context_length", 4096);
  const out: Record<string, unknown> = { original_max_position_embeddings: original };
  if (rope === undefined) return out;
  if (rope.rope_type !== "longrope") return { ...out, rope_scaling: rope };
  const key = "phi3.rope.scaling.attn_factor";
  const factor = maxPosition / original;
  const def = factor <= 1 ? 1 : Math.sqrt(1 + Math.log(factor) / Math.log(original));
  const given = meta.has(key) ? meta.posFloat(key) : def;
  const attention = Math.fround(given) === Math.fround(def) ? {} : { attention_factor: given };
  return { ...out, rope_scaling: { ...rope, ...attention } };
}
