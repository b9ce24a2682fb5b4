import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { expect } from "vitest";
import { type EngineSpec, parseModelConfig } from "../../../worker/model/config.ts";
import { decodeValues, encodeValues } from "../../../worker/model/dtype.ts";
import { generatedTensors, presetFiles } from "../../../worker/model/generate.ts";
import type { Arch } from "../../../worker/model/generate-arch.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { referenceForward } from "../../../worker/model/reference.ts";
import { type LoadedTensor, writeSafetensors } from "../../../worker/model/safetensors.ts";
import { assemble, type ModelWeights } from "../../../worker/model/weights.ts";

/**
 * A small Hugging Face model directory whose rows are whole 256-element
 * super-blocks, so every GGUF type (the K-quants too) can hold it: the tiny
 * preset's tokenizer, Llama-3 rope scaling and GQA (4 heads / 2 kv), with
 * hidden 256 and ffn 512, bf16 weights from the generator's seeded streams
 * (`arch`: the generator's config for that family instead of Llama's).
 */
export async function writeBlockModel(
  dir: string,
  opts: { arch?: Arch; tied?: boolean } = {},
): Promise<string> {
  const files = presetFiles({
    preset: "tiny",
    out: dir,
    dtype: "BF16",
    arch: opts.arch ?? "llama",
    tiedEmbeddings: opts.tied ?? false,
  });
  const config = {
    ...files.config,
    hidden_size: 256,
    intermediate_size: 512,
    head_dim: 64,
    torch_dtype: "bfloat16",
    ...longRopeFor((files.config as Record<string, unknown>).rope_scaling, 64),
  };
  await mkdir(dir, { recursive: true });
  const json = (v: unknown) => `${JSON.stringify(v, null, 2)}\n`;
  await writeFile(join(dir, "config.json"), json(config));
  await writeFile(join(dir, "generation_config.json"), json(files.generationConfig));
  await writeFile(join(dir, "tokenizer_config.json"), json(files.tokenizerConfig));
  await writeFile(join(dir, "tokenizer.json"), json(files.tokenizer.json));
  await writeSafetensors(
    join(dir, "model.safetensors"),
    generatedTensors(parseModelConfig(config), "BF16", 3),
  );
  return dir;
}

/** Phi-3's LongRoPE lists stretched to `headDim` / 2 factors on the generator's curve (same end values). */
function longRopeFor(rs: unknown, headDim: number): Record<string, unknown> {
  const o = rs as { long_factor?: number[]; short_factor?: number[] } | null;
  if (!o?.long_factor || !o.short_factor) return {};
  const half = headDim / 2;
  const curve = (list: number[]) => {
    const top = list[list.length - 1]!;
    return Array.from({ length: half }, (_, i) => Number((1 + (top - 1) * (i / (half - 1)) ** 2).toFixed(4)));
  };
  return { rope_scaling: { ...o, long_factor: curve(o.long_factor), short_factor: curve(o.short_factor) } };
}

/** The same model with every tensor dequantized to F32 (exactly). */
export function dequantized(m: LoadedModel): ModelWeights {
  const tensors = new Map<string, LoadedTensor>();
  for (const [name, t] of m.weights.tensors)
    tensors.set(name, { ...t, dtype: "F32", data: encodeValues(decodeValues(t.data, t.dtype), "F32") });
  return assemble(tensors, m.config.spec);
}

/**
 * A greedy generation of `out.tokens` after `prompt` against the float64
 * reference forward on the same weights (K/V rounded to f16 as the pages
 * hold them; `int8Activations`: the inputs of the Q8_0/Q4_0/Q6_K products on
 * the engine's int8 grid, reference.ts): the same argmax at every step,
 * every logit within `bound`. Returns the largest difference.
 */
export function expectReferenceGreedy(
  spec: EngineSpec,
  weights: ModelWeights,
  prompt: readonly number[],
  out: { tokens: readonly number[]; logits: readonly Float32Array[] },
  bound: number,
  opts: { int8Activations?: boolean } = {},
): number {
  const ref = referenceForward(spec, weights, [...prompt, ...out.tokens.slice(0, -1)], {
    roundKvToF16: true,
    ...opts,
  });
  let worst = 0;
  for (let i = 0; i < out.tokens.length; i++) {
    const row = ref[prompt.length - 1 + i]!;
    let best = 0;
    for (let v = 1; v < row.length; v++) if (row[v]! > row[best]!) best = v;
    expect(out.tokens[i]).toBe(best);
    for (let v = 0; v < row.length; v++) worst = Math.max(worst, Math.abs(row[v]! - out.logits[i]![v]!));
  }
  expect(worst).toBeLessThan(bound);
  return worst;
}
