import { describe, expect, it } from "vitest";
import { parseModelConfig } from "../../../worker/model/config.ts";
import { ropeInvFreq } from "../../../worker/model/rope.ts";
import { configErrorOf } from "./model-helpers.ts";

// Shapes as published in the models' config.json files.
const llama32_1b = {
  architectures: ["LlamaForCausalLM"],
  model_type: "llama",
  hidden_size: 2048,
  intermediate_size: 8192,
  num_hidden_layers: 16,
  num_attention_heads: 32,
  num_key_value_heads: 8,
  head_dim: 64,
  hidden_act: "silu",
  max_position_embeddings: 131072,
  rms_norm_eps: 1e-5,
  rope_theta: 500000.0,
  rope_scaling: {
    factor: 32.0,
    high_freq_factor: 4.0,
    low_freq_factor: 1.0,
    original_max_position_embeddings: 8192,
    rope_type: "llama3",
  },
  tie_word_embeddings: true,
  vocab_size: 128256,
  bos_token_id: 128000,
  eos_token_id: [128001, 128008, 128009],
  torch_dtype: "bfloat16",
  attention_bias: false,
  mlp_bias: false,
};

const qwen2_05b = {
  architectures: ["Qwen2ForCausalLM"],
  hidden_size: 896,
  intermediate_size: 4864,
  num_hidden_layers: 24,
  num_attention_heads: 14,
  num_key_value_heads: 2,
  hidden_act: "silu",
  max_position_embeddings: 32768,
  max_window_layers: 24,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000.0,
  sliding_window: 32768,
  use_sliding_window: false,
  tie_word_embeddings: true,
  vocab_size: 151936,
  bos_token_id: 151643,
  eos_token_id: 151643,
};

const mistral7b_v01 = {
  architectures: ["MistralForCausalLM"],
  hidden_size: 4096,
  intermediate_size: 14336,
  num_hidden_layers: 32,
  num_attention_heads: 32,
  num_key_value_heads: 8,
  hidden_act: "silu",
  max_position_embeddings: 32768,
  rms_norm_eps: 1e-5,
  rope_theta: 10000.0,
  sliding_window: 4096,
  tie_word_embeddings: false,
  vocab_size: 32000,
  bos_token_id: 1,
  eos_token_id: 2,
};

describe("parseModelConfig", () => {
  it("reads a Llama 3.2 config with GQA, explicit head_dim, tied embeddings and llama3 rope scaling", () => {
    const c = parseModelConfig(llama32_1b);
    expect(c.architecture).toBe("LlamaForCausalLM");
    expect(c.spec).toEqual({
      nLayers: 16,
      hidden: 2048,
      nHeads: 32,
      nKvHeads: 8,
      headDim: 64,
      vHeadDim: 64,
      ffn: 8192,
      vocab: 128256,
      rmsEps: 1e-5,
      ropeTheta: 500000,
      ropeScaling: {
        kind: "llama3",
        factor: 32,
        lowFreqFactor: 1,
        highFreqFactor: 4,
        originalMaxPosition: 8192,
      },
      attentionBias: false,
      tiedEmbeddings: true,
      maxPosition: 131072,
      family: "llama",
      layers: Array.from({ length: 16 }, () => ({ kind: "global" })),
      normOffset: false,
      qkNorm: false,
      sandwichNorms: false,
      activation: "silu",
      scaleEmbeddings: false,
      attnScale: null,
      attnSoftcap: null,
      finalSoftcap: null,
      fusedProjections: false,
    });
    expect(c.bosTokenId).toBe(128000);
    expect(c.eosTokenIds).toEqual([128001, 128008, 128009]);
    expect(c.torchDtype).toBe("bfloat16");
  });

  it("reads Qwen2 with q/k/v bias, head_dim from hidden/heads, and its sliding window off", () => {
    const c = parseModelConfig(qwen2_05b);
    expect(c.architecture).toBe("Qwen2ForCausalLM");
    expect(c.spec.attentionBias).toBe(true);
    expect(c.spec.headDim).toBe(64);
    expect(c.spec.nKvHeads).toBe(2);
    expect(c.spec.tiedEmbeddings).toBe(true);
    expect(c.spec.ropeTheta).toBe(1e6);
    expect(c.spec.maxPosition).toBe(32768);
    expect(c.spec.ropeScaling).toBeUndefined();
    expect(c.eosTokenIds).toEqual([151643]);
  });

  it("gives a Mistral sliding-window model its window on every layer and its whole context", () => {
    const c = parseModelConfig(mistral7b_v01);
    expect(c.spec.maxPosition).toBe(32768);
    expect(c.spec.layers).toEqual(Array.from({ length: 32 }, () => ({ kind: "sliding", window: 4096 })));
    expect(c.spec.attentionBias).toBe(false);
    // null turns the window off; absent takes MistralConfig's default 4096.
    const off = parseModelConfig({ ...mistral7b_v01, sliding_window: null }).spec;
    expect(off.layers.every((l) => l.kind === "global")).toBe(true);
    expect(off.maxPosition).toBe(32768);
    expect(parseModelConfig({ ...mistral7b_v01, sliding_window: undefined }).spec.layers[0]).toEqual({
      kind: "sliding",
      window: 4096,
    });
    // A window covering the whole context is the global layout.
    const wide = parseModelConfig({ ...mistral7b_v01, sliding_window: 32768 }).spec;
    expect(wide.layers.every((l) => l.kind === "global")).toBe(true);
  });

  it("slides Qwen2's layers from max_window_layers on, only with use_sliding_window", () => {
    expect(parseModelConfig(qwen2_05b).spec.layers.every((l) => l.kind === "global")).toBe(true);
    const on = parseModelConfig({
      ...qwen2_05b,
      use_sliding_window: true,
      sliding_window: 1024,
      max_window_layers: 20,
    });
    expect(on.spec.layers.map((l) => l.kind)).toEqual([
      ...Array.from({ length: 20 }, () => "global"),
      ...Array.from({ length: 4 }, () => "sliding"),
    ]);
    expect(on.spec.layers[23]).toEqual({ kind: "sliding", window: 1024 });
    expect(on.spec.maxPosition).toBe(32768);
  });

  it("takes Hugging Face defaults for omitted optional keys", () => {
    const minimal = {
      model_type: "llama",
      hidden_size: 64,
      intermediate_size: 128,
      num_hidden_layers: 2,
      num_attention_heads: 4,
      vocab_size: 100,
    };
    const c = parseModelConfig(minimal);
    expect(c.architecture).toBe("LlamaForCausalLM");
    expect(c.spec.nKvHeads).toBe(4);
    expect(c.spec.rmsEps).toBe(1e-6);
    expect(c.spec.ropeTheta).toBe(10000);
    expect(c.spec.maxPosition).toBe(2048);
    expect(c.spec.tiedEmbeddings).toBe(false);
    expect(c.bosTokenId).toBeNull();
    expect(c.eosTokenIds).toEqual([]);
  });

  it("accepts the older 'type' spelling; 'default' means none", () => {
    const older = {
      type: "llama3",
      factor: 8,
      low_freq_factor: 1,
      high_freq_factor: 4,
      original_max_position_embeddings: 8192,
    };
    expect(parseModelConfig({ ...llama32_1b, rope_scaling: older }).spec.ropeScaling).toMatchObject({
      factor: 8,
    });
    expect(
      parseModelConfig({ ...llama32_1b, rope_scaling: { rope_type: "default" } }).spec.ropeScaling,
    ).toBeUndefined();
  });

  it.each([
    [
      { ...llama32_1b, architectures: ["GPT2LMHeadModel"] },
      "architectures",
      /GPT2LMHeadModel.*not supported/,
    ],
    [{ ...llama32_1b, architectures: undefined, model_type: "gpt2" }, "model_type", /gpt2/],
    [{ ...llama32_1b, num_key_value_heads: 7 }, "num_key_value_heads", /must divide/],
    [{ ...llama32_1b, hidden_act: "gelu" }, "hidden_act", /not supported/],
    [{ ...llama32_1b, hidden_size: undefined }, "hidden_size", /missing/],
    [{ ...llama32_1b, vocab_size: -3 }, "vocab_size", /positive integer/],
    [{ ...llama32_1b, rms_norm_eps: "small" }, "rms_norm_eps", /positive finite/],
    [{ ...llama32_1b, head_dim: 63 }, "head_dim", /even/],
    [{ ...llama32_1b, rope_scaling: { rope_type: "yarn", factor: 4 } }, "rope_scaling.rope_type", /yarn/],
    [
      { ...llama32_1b, rope_scaling: { rope_type: "dynamic", factor: 4 } },
      "rope_scaling.rope_type",
      /dynamic/,
    ],
    [
      { ...llama32_1b, rope_scaling: { rope_type: "llama3", factor: 8 } },
      "rope_scaling.low_freq_factor",
      /missing/,
    ],
    [{ ...llama32_1b, attention_bias: true }, "attention_bias", /not supported/],
    [{ ...llama32_1b, eos_token_id: [128001, 999999] }, "eos_token_id", /outside vocab_size/],
    [{ ...llama32_1b, tie_word_embeddings: "yes" }, "tie_word_embeddings", /true or false/],
  ])("rejects a bad config naming the key (%#)", (cfg, key, message) => {
    const err = configErrorOf(cfg);
    expect(err.key).toBe(key);
    expect(err.message).toContain(key);
    expect(err.message).toMatch(message);
  });

  it("rejects a non-object", () => {
    expect(configErrorOf([1, 2]).key).toBe("(root)");
  });
});

describe("ropeInvFreq", () => {
  it("is theta^(-2i/d) without scaling", () => {
    const f = ropeInvFreq(8, 10000);
    expect([...f]).toEqual([1, 10000 ** -0.25, 10000 ** -0.5, 10000 ** -0.75]);
  });

  // Llama 3.1 8B: head_dim 128, theta 500000, factor 8, low 1, high 4, original 8192.
  // Expected values computed by the published formula in float64 (Python).
  it("matches Llama 3.1's scaled frequencies in the high, medium and low bands", () => {
    const f = ropeInvFreq(128, 500000, {
      kind: "llama3",
      factor: 8,
      lowFreqFactor: 1,
      highFreqFactor: 4,
      originalMaxPosition: 8192,
    });
    const expected: [number, number][] = [
      [0, 1.0], // wavelength 2π < 2048: unchanged
      [1, 0.8146172338565447],
      [20, 0.016560440080994446],
      [30, 0.0013718935677611381], // 2048 < wavelength < 8192: blended
      [40, 3.428102195952591e-5], // wavelength > 8192: divided by 8
      [45, 1.2297638677963614e-5],
      [50, 4.411534674558404e-6],
      [63, 3.068925988914511e-7],
    ];
    for (const [i, v] of expected) expect(f[i]).toBeCloseTo(v, 15 - Math.ceil(-Math.log10(v)));
    // Blended band lies strictly between the unscaled and fully scaled values.
    const base = 500000 ** (-60 / 128);
    expect(f[30]!).toBeLessThan(base);
    expect(f[30]!).toBeGreaterThan(base / 8);
  });

  it("rejects an odd head_dim", () => {
    expect(() => ropeInvFreq(7, 10000)).toThrow(/even/);
  });
});
