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
}

export const GGUF_ARCHITECTURES: Readonly<Record<string, GgufArchitecture>> = {
  // Llama 2/3 and Mistral (llama.cpp writes Mistral as "llama").
  llama: { hf: "LlamaForCausalLM", modelType: "llama", permutedQK: true },
  qwen2: { hf: "Qwen2ForCausalLM", modelType: "qwen2", permutedQK: false },
  // Qwen3: Qwen2's layout without biases, with per-head q/k RMSNorms.
  qwen3: { hf: "Qwen3ForCausalLM", modelType: "qwen3", permutedQK: false },
};

/** The GGUF architecture a Hugging Face architecture is written as. */
export const HF_TO_GGUF: Readonly<Partial<Record<Architecture, string>>> = {
  LlamaForCausalLM: "llama",
  MistralForCausalLM: "llama",
  Qwen2ForCausalLM: "qwen2",
  Qwen3ForCausalLM: "qwen3",
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
const TO_HF = new Map(MODEL_NAMES);
const TO_GGUF = new Map(MODEL_NAMES.map(([g, h]) => [h, g]));
const LAYER_TO_HF = new Map(LAYER_NAMES);
const LAYER_TO_GGUF = new Map(LAYER_NAMES.map(([g, h]) => [h, g]));

/** llama.cpp's per-frequency RoPE factors (Llama 3.1 scaling), not a model weight. */
export const ROPE_FREQS = "rope_freqs.weight";

/** The Hugging Face name of a GGUF tensor, or undefined when it has none. */
export function hfTensorName(gguf: string): string | undefined {
  const m = /^blk\.(\d+)\.(.+)$/.exec(gguf);
  if (m) {
    const suffix = LAYER_TO_HF.get(m[2]!);
    return suffix === undefined ? undefined : `model.layers.${Number(m[1])}.${suffix}`;
  }
  return TO_HF.get(gguf);
}

export function ggufTensorName(hf: string): string {
  const m = /^model\.layers\.(\d+)\.(.+)$/.exec(hf);
  const suffix = m ? LAYER_TO_GGUF.get(m[2]!) : undefined;
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

/**
 * config.json's fields from the architecture's metadata (required keys
 * checked here, naming the GGUF key; the rest validated by
 * parseModelConfig). `vocab` is the embedding's rows.
 */
export function configFromGguf(
  meta: GgufMeta,
  arch: string,
  vocab: number,
  tied: boolean,
  ropeScaling: Llama3RopeScaling | undefined,
): ModelConfig {
  const a = GGUF_ARCHITECTURES[arch]!;
  const k = (s: string) => `${arch}.${s}`;
  const hidden = meta.posUint(k("embedding_length"));
  const heads = meta.posUint(k("attention.head_count"));
  const headDim = meta.posUint(k("attention.key_length"), Math.floor(hidden / heads));
  if (meta.posUint(k("attention.value_length"), headDim) !== headDim)
    throw new GgufError(
      `${meta.header.file}: metadata ${k("attention.value_length")} differs from key_length (not supported)`,
    );
  const ropeDims = meta.posUint(k("rope.dimension_count"), headDim);
  if (ropeDims !== headDim)
    throw new GgufError(
      `${meta.header.file}: metadata ${k("rope.dimension_count")} = ${ropeDims}: partial rotary embedding (head_dim ${headDim}) is not supported`,
    );
  const scaling = meta.string(k("rope.scaling.type"), "none");
  if (scaling !== "none")
    throw new GgufError(
      `${meta.header.file}: metadata ${k("rope.scaling.type")} = "${scaling}" is not supported (none)`,
    );
  if (meta.has(k("vocab_size")) && meta.posUint(k("vocab_size")) !== vocab)
    throw new GgufError(
      `${meta.header.file}: metadata ${k("vocab_size")} = ${meta.posUint(k("vocab_size"))} but token_embd.weight has ${vocab} rows`,
    );
  const bos = meta.has("tokenizer.ggml.bos_token_id") ? meta.uint("tokenizer.ggml.bos_token_id") : null;
  const eos = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
    .filter((key) => meta.has(key))
    .map((key) => meta.uint(key));
  const cfg: Record<string, unknown> = {
    architectures: [a.hf],
    model_type: a.modelType,
    hidden_size: hidden,
    num_hidden_layers: meta.posUint(k("block_count")),
    intermediate_size: meta.posUint(k("feed_forward_length")),
    num_attention_heads: heads,
    num_key_value_heads: meta.posUint(k("attention.head_count_kv"), heads),
    head_dim: headDim,
    rms_norm_eps: meta.posFloat(k("attention.layer_norm_rms_epsilon")),
    rope_theta: meta.posFloat(k("rope.freq_base"), 10000),
    max_position_embeddings: meta.posUint(k("context_length")),
    vocab_size: vocab,
    tie_word_embeddings: tied,
    bos_token_id: bos,
    eos_token_id: [...new Set(eos)],
    ...(ropeScaling
      ? {
          rope_scaling: {
            rope_type: "llama3",
            factor: ropeScaling.factor,
            low_freq_factor: ropeScaling.lowFreqFactor,
            high_freq_factor: ropeScaling.highFreqFactor,
            original_max_position_embeddings: ropeScaling.originalMaxPosition,
          },
        }
      : {}),
  };
  try {
    return parseModelConfig(cfg);
  } catch (err) {
    if (err instanceof ModelConfigError)
      throw new GgufError(`${meta.header.file}: the metadata makes an invalid config: ${err.message}`);
    throw err;
  }
}
