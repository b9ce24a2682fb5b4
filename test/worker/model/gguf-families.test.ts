import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Engine } from "../../../native/index.ts";
import { generate } from "../../../worker/model/decoder.ts";
import { ContiguousDecoder } from "../../../worker/model/decoder-contiguous.ts";
import { decodeValues } from "../../../worker/model/dtype.ts";
import { openEngine } from "../../../worker/model/engine.ts";
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
