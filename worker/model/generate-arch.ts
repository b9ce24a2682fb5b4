/**
 * The config.json of a generated model per architecture: the keys and
 * values that family's Hugging Face configuration writes, for a preset's
 * shape, so the loader reads a generated model exactly as it reads a
 * published one.
 *
 *   llama       LlamaForCausalLM (the default; the preset's own rope scaling)
 *   qwen2       Qwen2ForCausalLM: q/k/v bias, sliding window off
 *   mistral-sw  MistralForCausalLM with an active sliding window on every layer
 *   qwen3       Qwen3ForCausalLM: q/k norms, explicit head_dim, no bias
 *   gemma2      Gemma2ForCausalLM: sliding/global alternating, attention and
 *               final soft-capping, query_pre_attn_scalar, GeGLU, (1 + w)
 *               norms with pre/post feed-forward norms, tied, √hidden embeddings
 *   gemma3      Gemma3ForCausalLM (text): 5 sliding to 1 global layer by
 *               sliding_window_pattern, q/k norms, local/global RoPE bases,
 *               linear rope scaling on the global layers
 *   phi3        Phi3ForCausalLM: fused qkv_proj and gate_up_proj, LongRoPE
 *               (long factors and the attention factor), a sliding window
 *
 * The soft-caps and windows are small for the tiny shape so that they bend
 * the tiny model's scores and logits and a short test context already spans
 * several windows.
 */
export type Arch = "llama" | "qwen2" | "mistral-sw" | "qwen3" | "gemma2" | "gemma3" | "phi3";
export const ARCHS: readonly Arch[] = ["llama", "qwen2", "mistral-sw", "qwen3", "gemma2", "gemma3", "phi3"];

export interface ArchShape {
  readonly layers: number;
  readonly hidden: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly ffn: number;
  readonly vocab: number;
  readonly maxPosition: number;
  readonly ropeTheta: number;
  readonly ropeScaling: Record<string, unknown> | null;
  /** The sliding window of the sliding layers at this size. */
  readonly window: number;
}

export interface ArchTokens {
  readonly bos: number;
  readonly eos: number;
  readonly pad: number;
}

/** Gemma 3 alternates 5 sliding layers with 1 global one. */
const GEMMA3_PATTERN = 6;

/** Layers of a preset under `arch` (Gemma 3 needs a whole pattern for a global layer). */
export function archLayers(arch: Arch, layers: number): number {
  return arch === "gemma3" ? Math.max(layers, GEMMA3_PATTERN) : layers;
}

/** A config.json object: the keys every architecture writes, then its own. */
export type ArchConfigJson = Record<string, unknown> & {
  readonly vocab_size: number;
  readonly max_position_embeddings: number;
  readonly num_hidden_layers: number;
};

/** The config.json of `arch` at shape `s`. */
export function archConfig(arch: Arch, s: ArchShape, tok: ArchTokens, tied: boolean): ArchConfigJson {
  const headDim = s.hidden / s.heads;
  const common = {
    hidden_size: s.hidden,
    intermediate_size: s.ffn,
    num_hidden_layers: archLayers(arch, s.layers),
    num_attention_heads: s.heads,
    num_key_value_heads: s.kvHeads,
    head_dim: headDim,
    max_position_embeddings: s.maxPosition,
    vocab_size: s.vocab,
    bos_token_id: tok.bos,
    eos_token_id: tok.eos,
  };
  switch (arch) {
    case "llama":
      return {
        architectures: ["LlamaForCausalLM"],
        model_type: "llama",
        ...common,
        hidden_act: "silu",
        rms_norm_eps: 1e-5,
        rope_theta: s.ropeTheta,
        rope_scaling: s.ropeScaling,
        tie_word_embeddings: tied,
        attention_bias: false,
        mlp_bias: false,
      };
    case "qwen2":
      return {
        architectures: ["Qwen2ForCausalLM"],
        model_type: "qwen2",
        ...common,
        hidden_act: "silu",
        rms_norm_eps: 1e-5,
        rope_theta: s.ropeTheta,
        rope_scaling: s.ropeScaling,
        tie_word_embeddings: tied,
        use_sliding_window: false,
        sliding_window: s.maxPosition,
        max_window_layers: s.layers,
      };
    case "mistral-sw":
      return {
        architectures: ["MistralForCausalLM"],
        model_type: "mistral",
        ...common,
        hidden_act: "silu",
        rms_norm_eps: 1e-5,
        rope_theta: s.ropeTheta,
        sliding_window: s.window,
        tie_word_embeddings: tied,
      };
    case "qwen3":
      return {
        architectures: ["Qwen3ForCausalLM"],
        model_type: "qwen3",
        ...common,
        hidden_act: "silu",
        rms_norm_eps: 1e-6,
        rope_theta: 1000000,
        rope_scaling: null,
        attention_bias: false,
        use_sliding_window: false,
        sliding_window: null,
        max_window_layers: s.layers,
        tie_word_embeddings: tied,
      };
    case "gemma2":
      return {
        architectures: ["Gemma2ForCausalLM"],
        model_type: "gemma2",
        ...common,
        hidden_act: "gelu_pytorch_tanh",
        hidden_activation: "gelu_pytorch_tanh",
        rms_norm_eps: 1e-6,
        rope_theta: 10000,
        query_pre_attn_scalar: 2 * headDim,
        attn_logit_softcapping: 3.0,
        final_logit_softcapping: 6.0,
        sliding_window: s.window,
        layer_types: Array.from({ length: s.layers }, (_, i) =>
          (i + 1) % 2 !== 0 ? "sliding_attention" : "full_attention",
        ),
        cache_implementation: "hybrid",
        attention_bias: false,
        tie_word_embeddings: true,
        pad_token_id: tok.pad,
      };
    case "gemma3":
      return {
        architectures: ["Gemma3ForCausalLM"],
        model_type: "gemma3_text",
        ...common,
        hidden_activation: "gelu_pytorch_tanh",
        rms_norm_eps: 1e-6,
        rope_theta: 1000000,
        rope_local_base_freq: 10000,
        rope_scaling: { rope_type: "linear", factor: 8.0 },
        query_pre_attn_scalar: 2 * headDim,
        attn_logit_softcapping: null,
        final_logit_softcapping: null,
        sliding_window: s.window,
        sliding_window_pattern: GEMMA3_PATTERN,
        cache_implementation: "hybrid",
        attention_bias: false,
        tie_word_embeddings: true,
        pad_token_id: tok.pad,
      };
    case "phi3": {
      // Phi-3-mini-128k's shape of LongRoPE: short factors near 1, long ones
      // growing with the wavelength; a context 16x the original.
      const half = headDim / 2;
      const factors = (top: number) =>
        Array.from({ length: half }, (_, i) => Number((1 + (top - 1) * (i / (half - 1)) ** 2).toFixed(4)));
      return {
        architectures: ["Phi3ForCausalLM"],
        model_type: "phi3",
        ...common,
        hidden_act: "silu",
        rms_norm_eps: 1e-5,
        rope_theta: 10000,
        original_max_position_embeddings: s.maxPosition / 16,
        rope_scaling: { type: "longrope", short_factor: factors(1.25), long_factor: factors(24) },
        sliding_window: s.window,
        tie_word_embeddings: tied,
        attention_dropout: 0.0,
        embd_pdrop: 0.0,
        resid_pdrop: 0.0,
        pad_token_id: tok.pad,
      };
    }
  }
}
