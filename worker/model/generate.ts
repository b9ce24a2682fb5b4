import { mkdir, readdir, rename, rm, stat, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { buildByteLevelBpe } from "./bpe.ts";
import { type ModelConfig, parseModelConfig } from "./config.ts";
import { BPE_CORPUS } from "./corpus.ts";
import { type DType, f32ToF16Bits } from "./dtype.ts";
import { type Arch, archConfig } from "./generate-arch.ts";
import { Rng, seedRng } from "./prng.ts";
import { type TensorToWrite, writeSafetensors, writeShardedSafetensors } from "./safetensors.ts";
import { expectedTensors } from "./weights.ts";

/**
 * Writes a deterministic model in Hugging Face format, for tests, demos and
 * benchmarks where no checkpoint can be downloaded: a preset's shape in any
 * supported architecture (generate-arch.ts: llama by default). Same preset,
 * arch, seed and dtype → byte-identical files (no timestamps, fixed key order).
 *
 * Presets:
 *   tiny   2 layers, hidden 64, 4 heads / 2 kv heads (head 16), ffn 128, vocab 512, f32,
 *          Llama-3 rope scaling (so every scaling branch is exercised); ~0.2 M params.
 *   small  about GPT-2 small: 12 layers, hidden 768, 12 heads / 4 kv (head 64), ffn 2048,
 *          vocab 8192, bf16; ~88 M params, ~176 MB.
 *   bench  TinyLlama-1.1B-like shape: 16 layers, hidden 2048, 16 heads / 8 kv (head 128),
 *          ffn 5632, vocab 32000, bf16, rope theta 500000 with Llama-3 scaling; ~0.89 B
 *          params, ~1.8 GB in 1 GiB shards (so the sharded path is exercised too).
 *
 * Initialisation (uniform with the stated standard deviation, so activations
 * keep their scale and logits are neither flat nor one-hot): q/k/v/gate/up
 * 1/sqrt(fan_in); o/down 1/sqrt(fan_in · 2 · layers) (residual growth stays
 * bounded); embeddings and lm_head 2/sqrt(hidden) (logit std ≈ 2 after the
 * final RMSNorm); norm weights 1 ± 0.1 (Gemma, whose norms scale by 1 + w:
 * 0 ± 0.1); q/k/v biases (Qwen2 style) std 0.1.
 * Each tensor draws from its own stream seeded by (seed, tensor name).
 */
export type Preset = "tiny" | "small" | "bench";
export const PRESETS: readonly Preset[] = ["tiny", "small", "bench"];

interface Shape {
  layers: number;
  hidden: number;
  heads: number;
  kvHeads: number;
  ffn: number;
  vocab: number;
  maxPosition: number;
  dtype: DType;
  ropeTheta: number;
  ropeScaling: Record<string, unknown> | null;
  /** The window of sliding layers (architectures that have them). */
  window: number;
  shardBytes: number | null;
}

const SHAPES: Record<Preset, Shape> = {
  tiny: {
    layers: 2,
    hidden: 64,
    heads: 4,
    kvHeads: 2,
    ffn: 128,
    vocab: 512,
    maxPosition: 2048,
    dtype: "F32",
    ropeTheta: 10000,
    ropeScaling: {
      rope_type: "llama3",
      factor: 4,
      low_freq_factor: 1,
      high_freq_factor: 4,
      original_max_position_embeddings: 512,
    },
    window: 24,
    shardBytes: null,
  },
  small: {
    layers: 12,
    hidden: 768,
    heads: 12,
    kvHeads: 4,
    ffn: 2048,
    vocab: 8192,
    maxPosition: 4096,
    dtype: "BF16",
    ropeTheta: 10000,
    ropeScaling: null,
    window: 256,
    shardBytes: null,
  },
  bench: {
    layers: 16,
    hidden: 2048,
    heads: 16,
    kvHeads: 8,
    ffn: 5632,
    vocab: 32000,
    maxPosition: 8192,
    dtype: "BF16",
    ropeTheta: 500000,
    ropeScaling: {
      rope_type: "llama3",
      factor: 8,
      low_freq_factor: 1,
      high_freq_factor: 4,
      original_max_position_embeddings: 2048,
    },
    window: 1024,
    shardBytes: 2 ** 30,
  },
};

/** Special tokens of generated tokenizers, in id order after the merges. */
export const SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"] as const;

/**
 * The generated models' chat template: ChatML, with Hermes-style tools (the
 * tool list in the system turn, calls as <tool_call>{json}</tool_call>,
 * results as <tool_response> user turns), the layout Qwen2.5 uses. Real
 * Jinja, rendered like any model's (worker/model/chat-template.ts).
 */
const CHATML_TEMPLATE = String.raw`{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls %}
{{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}`;

export interface GenerateOptions {
  readonly preset: Preset;
  readonly out: string;
  readonly seed?: number;
  /** Weight dtype; default per preset. */
  readonly dtype?: DType;
  /** Share lm_head with the embedding (no lm_head.weight written). */
  readonly tiedEmbeddings?: boolean;
  /** The architecture (generate-arch.ts); default "llama". */
  readonly arch?: Arch;
  /** Overwrite files in a non-empty `out`. */
  readonly force?: boolean;
}

export interface GeneratedModel {
  readonly dir: string;
  readonly config: ModelConfig;
  readonly files: readonly string[];
  readonly mergeCount: number;
}

const TORCH_DTYPE: Record<DType, string> = { F32: "float32", F16: "float16", BF16: "bfloat16" };

export class GenerateError extends Error {
  override readonly name = "GenerateError";
}

/** The files' JSON objects for a preset (no weights). */
export function presetFiles(opts: GenerateOptions) {
  const s = SHAPES[opts.preset];
  if (!s) throw new GenerateError(`unknown preset '${String(opts.preset)}' (known: ${PRESETS.join(", ")})`);
  const dtype = opts.dtype ?? s.dtype;
  const tok = buildByteLevelBpe({
    vocabSize: s.vocab,
    specials: SPECIAL_TOKENS,
    bosToken: "<|bos|>",
    corpus: BPE_CORPUS,
  });
  const id = (t: string) => tok.specialIds.get(t)!;
  const config = {
    ...archConfig(
      opts.arch ?? "llama",
      s,
      { bos: id("<|bos|>"), eos: id("<|eos|>"), pad: id("<|pad|>") },
      opts.tiedEmbeddings ?? false,
    ),
    torch_dtype: TORCH_DTYPE[dtype],
    use_cache: true,
  };
  const generationConfig = {
    bos_token_id: id("<|bos|>"),
    eos_token_id: [id("<|eos|>"), id("<|im_end|>")],
    pad_token_id: id("<|pad|>"),
    do_sample: false,
  };
  const tokenizerConfig = {
    tokenizer_class: "PreTrainedTokenizerFast",
    bos_token: "<|bos|>",
    eos_token: "<|eos|>",
    pad_token: "<|pad|>",
    add_bos_token: true,
    add_eos_token: false,
    clean_up_tokenization_spaces: false,
    model_max_length: s.maxPosition,
    chat_template: CHATML_TEMPLATE,
  };
  return { shape: s, dtype, config, generationConfig, tokenizerConfig, tokenizer: tok };
}

/** Fills `n` values uniform with standard deviation `std` around `mean`. */
function uniform(rng: Rng, n: number, mean: number, std: number): Float32Array {
  const out = new Float32Array(n);
  const a = std * Math.sqrt(3); // U(-a, a) has std a/sqrt(3)
  for (let i = 0; i < n; i++) out[i] = mean + a * (2 * rng.nextFloat() - 1);
  return out;
}

function toDtype(values: Float32Array, dtype: DType): Uint8Array {
  if (dtype === "F32") return new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  const out = new Uint16Array(values.length);
  if (dtype === "F16") {
    for (let i = 0; i < values.length; i++) out[i] = f32ToF16Bits(values[i]!);
  } else {
    // bf16: upper half of the f32 bits, round to nearest even (values here are finite).
    const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
    for (let i = 0; i < bits.length; i++) {
      const u = bits[i]!;
      out[i] = ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
    }
  }
  return new Uint8Array(out.buffer);
}

/** The init of one tensor, by its role (see the module comment). */
function initOf(
  name: string,
  shape: readonly number[],
  hidden: number,
  layers: number,
  normOffset: boolean,
): { mean: number; std: number } {
  const fanIn = shape[shape.length - 1]!;
  if (name.endsWith("norm.weight")) return { mean: normOffset ? 0 : 1, std: 0.1 / Math.sqrt(3) };
  if (name.endsWith(".bias")) return { mean: 0, std: 0.1 };
  if (name === "model.embed_tokens.weight" || name === "lm_head.weight")
    return { mean: 0, std: 2 / Math.sqrt(hidden) };
  if (name.endsWith("o_proj.weight") || name.endsWith("down_proj.weight"))
    return { mean: 0, std: 1 / Math.sqrt(fanIn * 2 * layers) };
  return { mean: 0, std: 1 / Math.sqrt(fanIn) };
}

/** The tensors of a generated model, each produced lazily from its own seeded stream. */
export function generatedTensors(config: ModelConfig, dtype: DType, seed: number): TensorToWrite[] {
  const spec = config.spec;
  return [...expectedTensors(spec)].map(([name, shape]) => ({
    name,
    // One dtype for every tensor, as Hugging Face checkpoints are saved.
    dtype,
    shape,
    bytes: () => {
      const { mean, std } = initOf(name, shape, spec.hidden, spec.nLayers, spec.normOffset);
      const n = shape.reduce((a, b) => a * b, 1);
      return toDtype(uniform(new Rng(seedRng(seed, name)), n, mean, std), dtype);
    },
  }));
}

async function isNonEmptyDir(path: string): Promise<boolean> {
  try {
    const st = await stat(path);
    if (!st.isDirectory()) throw new GenerateError(`${path} exists and is not a directory`);
    return (await readdir(path)).length > 0;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return false;
    throw err;
  }
}

/**
 * Writes the model into `out`. The files are written to a sibling
 * `out.partial` directory and moved into place at the end, so a failure or
 * interruption leaves `out` as it was.
 */
export async function generateModel(opts: GenerateOptions): Promise<GeneratedModel> {
  const seed = opts.seed ?? 0;
  if (!Number.isSafeInteger(seed) || seed < 0)
    throw new GenerateError(`seed must be a non-negative integer, got ${seed}`);
  const out = resolve(opts.out);
  if (!opts.force && (await isNonEmptyDir(out)))
    throw new GenerateError(`${out} is not empty; choose an empty directory or pass --force`);
  const files = presetFiles(opts);
  const config = parseModelConfig(files.config);
  const tmp = `${out}.partial`;
  await rm(tmp, { recursive: true, force: true });
  await mkdir(tmp, { recursive: true });
  try {
    const json = (v: unknown) => `${JSON.stringify(v, null, 2)}\n`;
    await writeFile(join(tmp, "config.json"), json(files.config));
    await writeFile(join(tmp, "generation_config.json"), json(files.generationConfig));
    await writeFile(join(tmp, "tokenizer_config.json"), json(files.tokenizerConfig));
    await writeFile(join(tmp, "tokenizer.json"), json(files.tokenizer.json));
    const tensors = generatedTensors(config, files.dtype, seed);
    if (files.shape.shardBytes === null)
      await writeSafetensors(join(tmp, "model.safetensors"), tensors, { format: "pt" });
    else await writeShardedSafetensors(tmp, tensors, files.shape.shardBytes);
    await mkdir(dirname(out), { recursive: true });
    if (await isNonEmptyDir(out)) {
      // --force: replace our files one by one, and drop stale checkpoint files
      // (an old index or shard would make the loader read the wrong weights).
      const written = new Set(await readdir(tmp));
      for (const f of await readdir(out))
        if (!written.has(f) && /^model.*\.safetensors(\.index\.json)?$/.test(f)) await rm(join(out, f));
      for (const f of written) await rename(join(tmp, f), join(out, f));
      await rm(tmp, { recursive: true, force: true });
    } else {
      await rm(out, { recursive: true, force: true });
      await rename(tmp, out);
    }
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    throw err;
  }
  return { dir: out, config, files: (await readdir(out)).sort(), mergeCount: files.tokenizer.mergeCount };
}
