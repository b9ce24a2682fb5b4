import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { parseModelConfig } from "../../../worker/model/config.ts";
import { generatedTensors, presetFiles } from "../../../worker/model/generate.ts";
import { writeSafetensors } from "../../../worker/model/safetensors.ts";

/**
 * A small Hugging Face model directory whose rows are whole 256-element
 * super-blocks, so every GGUF type (the K-quants too) can hold it: the tiny
 * preset's tokenizer, Llama-3 rope scaling and GQA (4 heads / 2 kv), with
 * hidden 256 and ffn 512, bf16 weights from the generator's seeded streams.
 */
export async function writeBlockModel(
  dir: string,
  opts: { qwen2?: boolean; tied?: boolean } = {},
): Promise<string> {
  const files = presetFiles({
    preset: "tiny",
    out: dir,
    dtype: "BF16",
    arch: opts.qwen2 ? "qwen2" : "llama",
    tiedEmbeddings: opts.tied ?? false,
  });
  const config = {
    ...files.config,
    hidden_size: 256,
    intermediate_size: 512,
    head_dim: 64,
    torch_dtype: "bfloat16",
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
