import { describe, expect, it } from "vitest";
import { parseModelConfig } from "../../../worker/model/config.ts";
import { layerWindows, layoutName } from "../../../worker/model/layout.ts";
import { layerInvFreq, ropeAttentionFactor, ropeInvFreq } from "../../../worker/model/rope.ts";
import { configErrorOf } from "./model-helpers.ts";

// Configs as published on the Hugging Face hub (config.json), trimmed of keys
// that do not shape the computation.
const gemma2_2b = {
  architectures: ["Gemma2ForCausalLM"],
  attention_bias: false,
  attn_logit_softcapping: 50.0,
  bos_token_id: 2,
  cache_implementation: "hybrid",
  eos_token_id: 1,
  final_logit_softcapping: 30.0,
  head_dim: 256,
  hidden_act: "gelu_pytorch_tanh",
  hidden_activation: "gelu_pytorch_tanh",
  hidden_size: 2304,
  intermediate_size: 9216,
  max_position_embeddings: 8192,
  model_type: "gemma2",
  num_attention_heads: 8,
  num_hidden_layers: 26,
  num_key_value_heads: 4,
  pad_token_id: 0,
  query_pre_attn_scalar: 256,
  rms_norm_eps: 1e-6,
  rope_theta: 10000.0,
  sliding_window: 4096,
  torch_dtype: "float32",
  vocab_size: 256000,
};

const gemma3_1b = {
  architectures: ["Gemma3ForCausalLM"],
  attention_bias: false,
  attn_logit_softcapping: null,
  bos_token_id: 2,
  cache_implementation: "hybrid",
  eos_token_id: [1, 106],
  final_logit_softcapping: null,
  head_dim: 256,
  hidden_activation: "gelu_pytorch_tanh",
  hidden_size: 1152,
  intermediate_size: 6912,
  max_position_embeddings: 32768,
  model_type: "gemma3_text",
  num_attention_heads: 4,
  num_hidden_layers: 26,
  num_key_value_heads: 1,
  pad_token_id: 0,
  query_pre_attn_scalar: 256,
  rms_norm_eps: 1e-6,
  rope_local_base_freq: 10000,
  rope_scaling: null,
  rope_theta: 1000000,
  sliding_window: 512,
  sliding_window_pattern: 6,
  torch_dtype: "bfloat16",
  vocab_size: 262144,
};

const qwen3_06b = {
  architectures: ["Qwen3ForCausalLM"],
  attention_bias: false,
  bos_token_id: 151643,
  eos_token_id: 151645,
  head_dim: 128,
  hidden_act: "silu",
  hidden_size: 1024,
  intermediate_size: 3072,
  max_position_embeddings: 40960,
  max_window_layers: 28,
  model_type: "qwen3",
  num_attention_heads: 16,
  num_hidden_layers: 28,
  num_key_value_heads: 8,
  rms_norm_eps: 1e-6,
  rope_scaling: null,
  rope_theta: 1000000,
  sliding_window: null,
  tie_word_embeddings: true,
  use_sliding_window: false,
  vocab_size: 151936,
};

const phi3_mini_4k = {
  architectures: ["Phi3ForCausalLM"],
  attention_bias: false,
  bos_token_id: 1,
  embd_pdrop: 0.0,
  eos_token_id: 32000,
  hidden_act: "silu",
  hidden_size: 3072,
  intermediate_size: 8192,
  max_position_embeddings: 4096,
  model_type: "phi3",
  num_attention_heads: 32,
  num_hidden_layers: 32,
  num_key_value_heads: 32,
  original_max_position_embeddings: 4096,
  pad_token_id: 32000,
  resid_pdrop: 0.0,
  rms_norm_eps: 1e-5,
  rope_scaling: null,
  rope_theta: 10000.0,
  sliding_window: 2047,
  tie_word_embeddings: false,
  vocab_size: 32064,
};

const long48 = Array.from({ length: 48 }, (_, i) => 1 + i / 2);
const short48 = Array.from({ length: 48 }, (_, i) => 1 + i / 100);
const phi3_mini_128k = {
  ...phi3_mini_4k,
  max_position_embeddings: 131072,
  rope_scaling: { long_factor: long48, short_factor: short48, type: "longrope" },
  sliding_window: 262144,
};

const kinds = (layers: readonly { kind: string }[]) =>
  layers.map((l) => (l.kind === "global" ? "g" : "s")).join("");

describe("Gemma 2", () => {
  it("reads sliding/global alternation, both soft-caps, query_pre_attn_scalar and Gemma's norms", () => {
    const c = parseModelConfig(gemma2_2b);
    expect(c.architecture).toBe("Gemma2ForCausalLM");
    const s = c.spec;
    expect(s.family).toBe("gemma2");
    // transformers: layer i slides when (i + 1) % 2 != 0, so layer 0 slides.
    expect(kinds(s.layers)).toBe("sg".repeat(13));
    expect(s.layers[0]).toEqual({ kind: "sliding", window: 4096 });
    expect(s.attnSoftcap).toBe(50);
    expect(s.finalSoftcap).toBe(30);
    expect(s.attnScale).toBe(1 / 16);
    expect(s).toMatchObject({
      headDim: 256,
      normOffset: true,
      sandwichNorms: true,
      qkNorm: false,
      activation: "gelu_tanh",
      scaleEmbeddings: true,
      tiedEmbeddings: true,
      maxPosition: 8192,
      fusedProjections: false,
    });
  });

  it("takes Gemma2Config's default soft-caps when absent and none when null; layer_types wins over the rule", () => {
    const absent = parseModelConfig({
      ...gemma2_2b,
      attn_logit_softcapping: undefined,
      final_logit_softcapping: undefined,
    }).spec;
    expect([absent.attnSoftcap, absent.finalSoftcap]).toEqual([50, 30]);
    const off = parseModelConfig({
      ...gemma2_2b,
      attn_logit_softcapping: null,
      final_logit_softcapping: null,
    }).spec;
    expect([off.attnSoftcap, off.finalSoftcap]).toEqual([null, null]);
    const types = Array.from({ length: 26 }, (_, i) => (i < 2 ? "full_attention" : "sliding_attention"));
    expect(kinds(parseModelConfig({ ...gemma2_2b, layer_types: types }).spec.layers)).toBe(
      `gg${"s".repeat(24)}`,
    );
  });
});

describe("Gemma 3", () => {
  it("reads 5 sliding to 1 global by sliding_window_pattern, q/k norms and the local RoPE base", () => {
    const c = parseModelConfig(gemma3_1b);
    const s = c.spec;
    expect(c.architecture).toBe("Gemma3ForCausalLM");
    expect(kinds(s.layers)).toBe("sssssg".repeat(4) + "ss");
    expect(s.layers[0]).toEqual({ kind: "sliding", window: 512 });
    expect(s).toMatchObject({
      family: "gemma3",
      qkNorm: true,
      normOffset: true,
      sandwichNorms: true,
      ropeTheta: 1e6,
      localRopeTheta: 10000,
      attnSoftcap: null,
      finalSoftcap: null,
      attnScale: 1 / 16,
      nKvHeads: 1,
    });
    expect(c.eosTokenIds).toEqual([1, 106]);
    expect(kinds(parseModelConfig({ ...gemma3_1b, sliding_window_pattern: 2 }).spec.layers)).toBe(
      "sg".repeat(13),
    );
  });

  it("scales only the global layers' RoPE: sliding layers keep rope_local_base_freq unscaled", () => {
    const s = parseModelConfig({ ...gemma3_1b, rope_scaling: { rope_type: "linear", factor: 8.0 } }).spec;
    const local = layerInvFreq(s, 0);
    const global = layerInvFreq(s, 5);
    expect([...local]).toEqual([...ropeInvFreq(256, 10000)]);
    expect([...global]).toEqual([...ropeInvFreq(256, 1e6)].map((f) => f / 8));
  });

  it("refuses the multimodal Gemma3ForConditionalGeneration, pointing at the text model", () => {
    const err = configErrorOf({
      ...gemma3_1b,
      architectures: ["Gemma3ForConditionalGeneration"],
      model_type: "gemma3",
    });
    expect(err.key).toBe("architectures");
    expect(err.message).toMatch(/Gemma3ForCausalLM/);
  });
});

describe("Qwen3", () => {
  it("reads q/k norms, explicit head_dim, no bias, dense layers", () => {
    const s = parseModelConfig(qwen3_06b).spec;
    expect(s).toMatchObject({
      family: "qwen3",
      qkNorm: true,
      normOffset: false,
      sandwichNorms: false,
      attentionBias: false,
      headDim: 128,
      nHeads: 16,
      hidden: 1024,
      tiedEmbeddings: true,
      activation: "silu",
    });
    expect(kinds(s.layers)).toBe("g".repeat(28));
    const sw = parseModelConfig({
      ...qwen3_06b,
      use_sliding_window: true,
      sliding_window: 4096,
      max_window_layers: 26,
    });
    expect(kinds(sw.spec.layers)).toBe(`${"g".repeat(26)}ss`);
  });
});

describe("Phi-3", () => {
  it("mini-4k: fused projections and its sliding window of 2047 on every layer", () => {
    const s = parseModelConfig(phi3_mini_4k).spec;
    expect(s.fusedProjections).toBe(true);
    expect(s.headDim).toBe(96);
    expect(s.layers.every((l) => l.kind === "sliding" && l.window === 2047)).toBe(true);
    expect(s.ropeScaling).toBeUndefined();
    expect(s.maxPosition).toBe(4096);
  });

  it("mini-128k: LongRoPE's long factors and attention factor; a window beyond the context is global", () => {
    const s = parseModelConfig(phi3_mini_128k).spec;
    const af = Math.sqrt(1 + Math.log(131072 / 4096) / Math.log(4096));
    expect(s.ropeScaling).toEqual({ kind: "longrope", factors: long48, set: "long", attentionFactor: af });
    expect(ropeAttentionFactor(s)).toBe(af);
    const inv = ropeInvFreq(96, 10000, s.ropeScaling);
    for (const i of [0, 1, 20, 47])
      expect(inv[i]).toBeCloseTo(1 / (long48[i]! * 10000 ** ((2 * i) / 96)), 15);
    expect(s.layers.every((l) => l.kind === "global")).toBe(true);
    // Served no longer than its original context, it takes the short factors and no attention factor.
    const short = parseModelConfig({ ...phi3_mini_128k, max_position_embeddings: 4096 }).spec;
    expect(short.ropeScaling).toEqual({
      kind: "longrope",
      factors: short48,
      set: "short",
      attentionFactor: 1,
    });
    // "su" is LongRoPE's older name; an explicit attention_factor wins.
    const su = parseModelConfig({
      ...phi3_mini_128k,
      rope_scaling: { ...phi3_mini_128k.rope_scaling, type: "su", attention_factor: 1.5 },
    }).spec;
    expect(su.ropeScaling).toMatchObject({ set: "long", attentionFactor: 1.5 });
  });
});

describe("what is refused, naming the key", () => {
  it.each([
    [{ ...qwen3_06b, architectures: ["Qwen3MoeForCausalLM"] }, "architectures", /Qwen3MoeForCausalLM/],
    [{ ...qwen3_06b, num_experts: 128, moe_intermediate_size: 768 }, "num_experts", /mixture-of-experts/],
    [{ ...phi3_mini_4k, num_local_experts: 16 }, "num_local_experts", /mixture-of-experts/],
    [{ ...phi3_mini_4k, partial_rotary_factor: 0.75 }, "partial_rotary_factor", /0\.75/],
    [{ ...phi3_mini_128k, rope_scaling: { type: "yarn", factor: 4 } }, "rope_scaling.rope_type", /yarn/],
    [
      { ...phi3_mini_128k, rope_scaling: { type: "longrope", long_factor: [1, 2], short_factor: short48 } },
      "rope_scaling.long_factor",
      /48 entries/,
    ],
    [
      { ...qwen3_06b, rope_scaling: { rope_type: "dynamic", factor: 2 } },
      "rope_scaling.rope_type",
      /dynamic/,
    ],
    [{ ...gemma2_2b, hidden_activation: "gelu" }, "hidden_activation", /gelu/],
    [{ ...gemma2_2b, layer_types: ["sliding_attention"] }, "layer_types", /26 layers/],
    [
      { ...gemma3_1b, layer_types: Array.from({ length: 26 }, () => "chunked_attention") },
      "layer_types[0]",
      /chunked_attention/,
    ],
    [{ ...gemma3_1b, use_bidirectional_attention: true }, "use_bidirectional_attention", /causal/],
    [{ ...gemma2_2b, attention_bias: true }, "attention_bias", /not supported/],
    [{ ...qwen3_06b, attention_bias: true }, "attention_bias", /not supported/],
    [{ ...qwen3_06b, attn_logit_softcapping: 50 }, "attn_logit_softcapping", /not part of this architecture/],
    [{ ...qwen3_06b, rope_parameters: { rope_theta: 1e6 } }, "rope_parameters", /rope_theta/],
    [{ ...gemma2_2b, query_pre_attn_scalar: -1 }, "query_pre_attn_scalar", /positive/],
    [{ ...gemma2_2b, sliding_window: 0 }, "sliding_window", /positive integer/],
  ])("%#: %s", (cfg, key, message) => {
    const err = configErrorOf(cfg);
    expect(err.key).toBe(key);
    expect(err.message).toContain(key);
    expect(err.message).toMatch(message);
  });
});

describe("the attention layout's name (the fingerprint's layout field)", () => {
  it("keeps the all-global name, and names sliding layers in runs", () => {
    expect(layoutName(parseModelConfig(qwen3_06b).spec.layers)).toBe("kv-gqa/v2");
    expect(layoutName(parseModelConfig(gemma3_1b).spec.layers)).toBe(
      "kv-gqa/v2;layers=s512x5,g,s512x5,g,s512x5,g,s512x5,g,s512x2",
    );
    expect(layoutName(parseModelConfig(phi3_mini_4k).spec.layers)).toBe("kv-gqa/v2;layers=s2047x32");
    expect([...layerWindows(parseModelConfig(gemma2_2b).spec.layers).slice(0, 4)]).toEqual([
      4096, 0, 4096, 0,
    ]);
  });
});
