import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Engine } from "../../../native/engine.ts";
import { generate } from "../../../worker/model/decoder.ts";
import { ContiguousDecoder } from "../../../worker/model/decoder-contiguous.ts";
import { decodeValues } from "../../../worker/model/dtype.ts";
import { openEngine } from "../../../worker/model/engine.ts";
import { readGgufHeader, readGgufTensors } from "../../../worker/model/gguf.ts";
import { ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT } from "../../../worker/model/gguf-arch.ts";
import { quantizeModelDir } from "../../../worker/model/gguf-quantize.ts";
import { type LoadedModel, loadModelDir } from "../../../worker/model/model-dir.ts";
import { Rng, seedRng } from "../../../worker/model/prng.ts";
import { initialSamplerState, samplingParams } from "../../../worker/model/sampling.ts";
import { dequantized, expectReferenceGreedy, writeBlockModel } from "./gguf-fixture.ts";

/**
 * GGUF rows of the families beyond llama/qwen2: a Qwen3 model (per-head q/k
 * RMSNorms, explicit head_dim, no biases) quantized to Q8_0, loaded back:
 * the same config as its config.json, its q/k norm weights bit for bit, and
 * greedy ids and logits within GRID_BOUND of the float64 reference on the
 * same int8 activation grid, the first logits within ACT_BOUND of the f32
 * engine on the dequantized weights (the bounds of gguf-model.test.ts, which
 * says why).
 */
const GRID_BOUND = 0.25;
const ACT_BOUND = 0.25;
const VARIANT = "cpu-f32acc/v1";

let root: string;
let hf: LoadedModel;
let gguf: LoadedModel;
const engines: Engine[] = [];

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-ggufq3-"));
  const dir = await writeBlockModel(join(root, "hf"), { arch: "qwen3" });
  const file = join(root, "m.gguf");
  await quantizeModelDir(dir, file, "q8_0");
  hf = await loadModelDir(dir, { variant: VARIANT });
  gguf = await loadModelDir(file, { variant: VARIANT });
}, 120_000);
afterAll(async () => {
  for (const e of engines) e.free();
  await rm(root, { recursive: true, force: true });
});

describe("GGUF qwen3", () => {
  it("loads with the config and q/k norms of the Hugging Face model", () => {
    expect(gguf.config.architecture).toBe("Qwen3ForCausalLM");
    expect(gguf.config.spec.qkNorm).toBe(true);
    const { vocab: _v, ...want } = hf.config.spec;
    const { vocab: _g, ...got } = gguf.config.spec;
    expect(got).toEqual(want);
    for (const name of ["model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"]) {
      const a = hf.weights.tensors.get(name)!;
      const b = gguf.weights.tensors.get(name)!;
      expect(b.dtype).toBe("F32");
      expect(decodeValues(b.data, b.dtype)).toEqual(decodeValues(a.data, a.dtype));
    }
  });

  it("generates: greedy ids and logits match the float64 reference on its int8 activations, and the f32 engine on the dequantized weights within the activation rounding", async () => {
    const spec = gguf.config.spec;
    const open = async (t = gguf.weights) => {
      const e = await openEngine(spec, t, { threads: 2 });
      engines.push(e);
      return new ContiguousDecoder(e, 2, 64);
    };
    const rng = new Rng(seedRng(3, "gguf-qwen3"));
    const p = Array.from({ length: 9 }, () => rng.nextU32() % spec.vocab);
    const greedy = initialSamplerState(samplingParams({ maxTokens: 5 }));
    const [a] = await generate(await open(), [p], [greedy]);
    const [b] = await generate(await open(dequantized(gguf)), [p], [greedy]);
    let worst = 0;
    for (let v = 0; v < spec.vocab; v++)
      worst = Math.max(worst, Math.abs(a!.logits[0]![v]! - b!.logits[0]![v]!));
    expect(worst).toBeLessThan(ACT_BOUND);
    expect(worst).toBeGreaterThan(0);
    expectReferenceGreedy(spec, gguf.weights, p, a!, GRID_BOUND, { int8Activations: true });
  }, 120_000);
});

/**
 * Gemma 2, Gemma 3 (text) and Phi-3 through GGUF with llama.cpp's names and
 * keys: written BF16 (lossless from the bf16 checkpoint) the loaded model
 * has the Hugging Face config and generates the same ids and logits to the
 * bit; written Q8_0 it matches the float64 reference on its int8 grid and
 * the f32 engine on its dequantized weights, within the bounds above.
 * Gemma's norms are stored as 1 + w, as llama.cpp's converter writes them;
 * Mistral is written as llama, its window in llama.attention.sliding_window.
 */
const FAMILIES = ["gemma2", "gemma3", "phi3", "mistral-sw"] as const;

/** Per family, a name in the file renamed away (from → to) and the error that must name it. */
const MISSING: Record<(typeof FAMILIES)[number], readonly [string, string, RegExp]> = {
  gemma2: [
    "gemma2.attn_logit_softcapping",
    "gemma2.attn_logit_softcappinX",
    /metadata gemma2\.attn_logit_softcapping: missing/,
  ],
  gemma3: [
    "gemma3.attention.head_count",
    "gemma3.attention.head_counX",
    /metadata gemma3\.attention\.head_count: missing/,
  ],
  phi3: [
    "rope_factors_short.weight",
    "rope_factors_shorX.weight",
    /missing tensor 'rope_factors_short\.weight'/,
  ],
  "mistral-sw": ["llama.block_count", "llama.block_counX", /metadata llama\.block_count: missing/],
};

describe.each(FAMILIES)("GGUF %s", (arch) => {
  let dir: string;
  let base: LoadedModel;
  let exact: LoadedModel;
  let q8: LoadedModel;
  let q8File: string;
  const prompt = (spec: { vocab: number }) => {
    const rng = new Rng(seedRng(5, `gguf-${arch}`));
    return Array.from({ length: 11 }, () => rng.nextU32() % spec.vocab);
  };
  const run = async (m: LoadedModel, t = m.weights) => {
    const e = await openEngine(m.config.spec, t, { threads: 2 });
    engines.push(e);
    const greedy = initialSamplerState(samplingParams({ maxTokens: 6 }));
    return (await generate(new ContiguousDecoder(e, 2, 64), [prompt(m.config.spec)], [greedy]))[0]!;
  };

  beforeAll(async () => {
    dir = await writeBlockModel(join(root, `hf-${arch}`), { arch });
    const bf16 = join(root, `${arch}-bf16.gguf`);
    q8File = join(root, `${arch}-q8.gguf`);
    await quantizeModelDir(dir, bf16, "bf16");
    await quantizeModelDir(dir, q8File, "q8_0");
    base = await loadModelDir(dir, { variant: VARIANT });
    exact = await loadModelDir(bf16, { variant: VARIANT });
    q8 = await loadModelDir(q8File, { variant: VARIANT });
  }, 120_000);

  it("loads with the Hugging Face config, llama.cpp's names and (for Gemma) 1 + w norms", async () => {
    const hfArch = base.config.architecture;
    expect(exact.config.architecture).toBe(hfArch === "MistralForCausalLM" ? "LlamaForCausalLM" : hfArch);
    expect(base.config.spec.layers.some((l) => l.kind === "sliding")).toBe(true);
    expect(exact.config.spec).toEqual(base.config.spec);
    expect(q8.config.spec).toEqual(base.config.spec);
    const header = await readGgufHeader(q8File);
    const names = [...header.tensors.keys()];
    if (arch === "mistral-sw") {
      expect(names).toContain("blk.0.ffn_norm.weight");
      expect(header.metadata.get("llama.attention.sliding_window")).toBeDefined();
    } else if (arch === "phi3") {
      expect(names).toEqual(
        expect.arrayContaining([
          "blk.0.attn_qkv.weight",
          "blk.0.ffn_up.weight",
          ROPE_FACTORS_LONG,
          ROPE_FACTORS_SHORT,
        ]),
      );
      expect(header.metadata.get("phi3.rope.scaling.original_context_length")).toBeDefined();
    } else {
      expect(names).toEqual(
        expect.arrayContaining([
          "blk.0.post_attention_norm.weight",
          "blk.0.ffn_norm.weight",
          "blk.0.post_ffw_norm.weight",
        ]),
      );
      expect(names).not.toContain("output.weight");
      expect(header.metadata.get(`${arch}.attention.sliding_window`)).toBeDefined();
      const name = "model.layers.0.post_feedforward_layernorm.weight";
      const file = await readGgufTensors(header, ["blk.0.post_ffw_norm.weight"]);
      const stored = decodeValues(file.get("blk.0.post_ffw_norm.weight")!, "F32");
      const t = base.weights.tensors.get(name)!;
      const w = decodeValues(t.data, t.dtype);
      expect(Array.from(stored)).toEqual(Array.from(w, (x) => Math.fround(x + 1)));
    }
    if (arch === "gemma2") expect(header.metadata.get("gemma2.attn_logit_softcapping")).toBeCloseTo(3);
  });

  it("bf16 file: the same greedy ids and logits as the safetensors model, to the bit", async () => {
    const a = await run(base);
    const b = await run(exact);
    expect(b.tokens).toEqual(a.tokens);
    for (let i = 0; i < a.logits.length; i++)
      expect(Array.from(b.logits[i]!)).toEqual(Array.from(a.logits[i]!));
  }, 120_000);

  it("q8_0 file: greedy ids match the float64 reference on its int8 activations, logits the f32 engine on the dequantized weights", async () => {
    const a = await run(q8);
    const b = await run(q8, dequantized(q8));
    let worst = 0;
    for (let v = 0; v < q8.config.spec.vocab; v++)
      worst = Math.max(worst, Math.abs(a.logits[0]![v]! - b.logits[0]![v]!));
    expect(worst).toBeLessThan(ACT_BOUND);
    expectReferenceGreedy(q8.config.spec, q8.weights, prompt(q8.config.spec), a, GRID_BOUND, {
      int8Activations: true,
    });
  }, 120_000);

  it("refuses a file whose required metadata is missing, naming it", async () => {
    const [from, to, err] = MISSING[arch];
    const bytes = await readFile(q8File);
    const at = bytes.indexOf(Buffer.from(from));
    expect(at).toBeGreaterThan(0);
    bytes.set(Buffer.from(to), at);
    const bad = join(root, `${arch}-bad.gguf`);
    await writeFile(bad, bytes);
    await expect(loadModelDir(bad, { variant: VARIANT })).rejects.toThrow(err);
  });
});

describe("GGUF writing refuses what llama.cpp's keys cannot say", () => {
  const edit = async (arch: "gemma2" | "qwen2", change: Record<string, unknown>) => {
    const dir = await writeBlockModel(join(root, `refuse-${arch}`), { arch });
    const path = join(dir, "config.json");
    await writeFile(path, JSON.stringify({ ...JSON.parse(await readFile(path, "utf8")), ...change }));
    return dir;
  };

  it("a Gemma 2 model without its attention soft-cap", async () => {
    const dir = await edit("gemma2", { attn_logit_softcapping: null });
    await expect(quantizeModelDir(dir, join(root, "g2.gguf"), "q8_0")).rejects.toThrow(
      /gemma2 GGUF file needs both soft-caps/,
    );
  });

  it("a Qwen2 model whose window covers only its last layers", async () => {
    const dir = await edit("qwen2", { use_sliding_window: true, max_window_layers: 1, sliding_window: 8 });
    await expect(quantizeModelDir(dir, join(root, "q2.gguf"), "q8_0")).rejects.toThrow(
      /layer 0 is global, but a qwen2 GGUF file's window applies to every layer/,
    );
  });
});
