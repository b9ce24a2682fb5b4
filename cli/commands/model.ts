import { parseArgs } from "node:util";
import type { DType } from "../../worker/model/dtype.ts";
import { generateModel, PRESETS, type Preset } from "../../worker/model/generate.ts";
import { ARCHS, type Arch } from "../../worker/model/generate-arch.ts";
import { QUANT_SCHEMES, type QuantScheme, quantizeModelDir } from "../../worker/model/gguf-quantize.ts";
import { loadModelDir } from "../../worker/model/model-dir.ts";
import { numel } from "../../worker/model/safetensors.ts";
import { chooseEngine } from "../../worker/runtime/engine-load.ts";
import { type Command, UsageError } from "../command.ts";

const DTYPES: Record<string, DType> = { f32: "F32", f16: "F16", bf16: "BF16" };
const MODEL_ERRORS = new Set([
  "GgufError",
  "ModelConfigError",
  "SafetensorsError",
  "WeightsError",
  "TokenizerError",
  "GenerateError",
  "ModelDirError",
]);

const usage = [
  "Usage:",
  "  continuum model init --preset tiny|small|bench --out DIR [--arch ARCH] [--seed N] [--dtype f32|f16|bf16] [--force]",
  "  continuum model info DIR|FILE.gguf [--variant NAME] [--json]",
  "  continuum model quantize DIR --to f32|bf16|q8_0|q4_0|q4_k_m --out FILE.gguf [--force]",
  "",
  "init   writes a deterministic model in Hugging Face format (config.json, model.safetensors or",
  "       shards, tokenizer.json with a byte-level BPE, tokenizer_config.json, generation_config.json).",
  "       Same preset, arch, seed and dtype give the same bytes.",
  "         tiny   2 layers (gemma3: 6), hidden 64, f32 (tests, seconds)",
  "         small  12 layers, hidden 768, bf16, ~88 M params (benchmarks)",
  "         bench  16 layers, hidden 2048, bf16, ~0.89 B params, 1 GiB shards (bandwidth benches)",
  `       --arch: ${ARCHS.join(", ")} (default llama), each with its family's real config keys;`,
  "       mistral-sw, gemma2, gemma3 and phi3 have sliding-window layers (24 positions at tiny).",
  "       An existing non-empty DIR is refused unless --force.",
  "info   loads a model directory (a Hugging Face Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 or",
  "       Phi-3 checkpoint) or a GGUF file and prints its config, tensor count and bytes, its",
  "       attention layout, and the model fingerprint for the execution variant NAME (default: the",
  "       variant of the engine a worker gets on this machine, cpu-f32acc/v1 or a CUDA one; the",
  "       value for model.variant of a fleet of such workers).",
  "quantize  writes the model directory DIR as one GGUF file (llama.cpp's format): q8_0 (every",
  "       matrix Q8_0), q4_0 (Q4_0, the LM head Q6_K) or q4_k_m (Q4_K, with Q6_K for the LM head and",
  "       llama.cpp's choice of attn_v/ffn_down layers); norms and biases stay F32. An existing",
  "       FILE is refused unless --force.",
].join("\n");

async function init(argv: readonly string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: [...argv],
    options: {
      preset: { type: "string" },
      arch: { type: "string" },
      out: { type: "string" },
      seed: { type: "string" },
      dtype: { type: "string" },
      force: { type: "boolean" },
    },
    allowPositionals: true,
    strict: true,
  });
  if (positionals.length > 0) throw new UsageError(`unexpected arguments: ${positionals.join(" ")}`);
  const preset = values.preset;
  if (preset === undefined) throw new UsageError("--preset is required");
  if (!PRESETS.includes(preset as Preset))
    throw new UsageError(`--preset must be one of ${PRESETS.join(", ")}, got '${preset}'`);
  if (values.arch !== undefined && !ARCHS.includes(values.arch as Arch))
    throw new UsageError(`--arch must be one of ${ARCHS.join(", ")}, got '${values.arch}'`);
  if (values.out === undefined) throw new UsageError("--out DIR is required");
  let seed = 0;
  if (values.seed !== undefined) {
    if (!/^\d+$/.test(values.seed) || !Number.isSafeInteger(Number(values.seed)))
      throw new UsageError(`--seed must be a non-negative integer, got '${values.seed}'`);
    seed = Number(values.seed);
  }
  let dtype: DType | undefined;
  if (values.dtype !== undefined) {
    dtype = DTYPES[values.dtype];
    if (!dtype) throw new UsageError(`--dtype must be one of f32, f16, bf16, got '${values.dtype}'`);
  }
  const g = await generateModel({
    preset: preset as Preset,
    ...(values.arch ? { arch: values.arch as Arch } : {}),
    out: values.out,
    seed,
    ...(dtype ? { dtype } : {}),
    force: values.force ?? false,
  });
  const s = g.config.spec;
  console.log(
    `wrote ${preset} ${g.config.architecture} to ${g.dir}: ${s.nLayers} layers, hidden ${s.hidden}, heads ${s.nHeads}/${s.nKvHeads}, ` +
      `ffn ${s.ffn}, vocab ${s.vocab} (${g.mergeCount} BPE merges), seed ${seed}`,
  );
  console.log(`files: ${g.files.join(", ")}`);
  return 0;
}

async function info(argv: readonly string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: [...argv],
    options: { variant: { type: "string" }, json: { type: "boolean" } },
    allowPositionals: true,
    strict: true,
  });
  const [dir, ...extra] = positionals;
  if (dir === undefined) throw new UsageError("missing model DIR");
  if (extra.length > 0) throw new UsageError(`unexpected arguments: ${extra.join(" ")}`);
  // A named variant is taken as given (what a worker elsewhere would fingerprint).
  const variant = values.variant ?? chooseEngine("auto", "auto").variant;
  const m = await loadModelDir(dir, { variant });
  let params = 0;
  let bytes = 0;
  const dtypes = new Set<string>();
  for (const t of m.weights.tensors.values()) {
    params += numel(t.shape);
    bytes += t.data.byteLength;
    dtypes.add(t.dtype);
  }
  const summary = {
    dir: m.dir,
    architecture: m.config.architecture,
    spec: m.config.spec,
    bosTokenId: m.config.bosTokenId,
    eosTokenIds: m.eosTokenIds,
    tokenizer: { size: m.tokenizer.size, chatTemplates: [...m.tokenizer.chatTemplates.keys()] },
    tensors: m.weights.tensors.size,
    params,
    bytes,
    dtypes: [...dtypes].sort(),
    manifest: m.manifest,
    fingerprint: m.fingerprint,
  };
  if (values.json) {
    console.log(JSON.stringify(summary));
    return 0;
  }
  console.log(`model        ${m.dir}`);
  console.log(`architecture ${m.config.architecture}`);
  for (const [k, v] of Object.entries(m.config.spec))
    if (k !== "layers") console.log(`  ${k.padEnd(15)} ${JSON.stringify(v)}`);
  const sliding = m.config.spec.layers.filter((l) => l.kind === "sliding").length;
  console.log(`  ${"layers".padEnd(15)} ${sliding} sliding, ${m.config.spec.nLayers - sliding} global`);
  console.log(`tokens       bos ${m.config.bosTokenId ?? "none"}, eos ${JSON.stringify(m.eosTokenIds)}`);
  console.log(
    `tokenizer    ${m.tokenizer.size} tokens, chat templates: ${summary.tokenizer.chatTemplates.join(", ") || "none"}`,
  );
  console.log(
    `weights      ${summary.tensors} tensors, ${params} params, ${bytes} bytes, ${summary.dtypes.join("+")}`,
  );
  console.log(`digest       ${m.manifest.weightsDigest}`);
  console.log(`variant      ${m.manifest.variant} (kv ${m.manifest.kvDtype}, layout ${m.manifest.layout})`);
  console.log(`fingerprint  ${m.fingerprint}`);
  return 0;
}

async function quantizeCmd(argv: readonly string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: [...argv],
    options: { to: { type: "string" }, out: { type: "string" }, force: { type: "boolean" } },
    allowPositionals: true,
    strict: true,
  });
  const [dir, ...extra] = positionals;
  if (dir === undefined) throw new UsageError("missing model DIR");
  if (extra.length > 0) throw new UsageError(`unexpected arguments: ${extra.join(" ")}`);
  if (values.to === undefined || !QUANT_SCHEMES.includes(values.to as QuantScheme))
    throw new UsageError(
      `--to must be one of ${QUANT_SCHEMES.join(", ")}${values.to ? `, got '${values.to}'` : ""}`,
    );
  if (values.out === undefined || !values.out.endsWith(".gguf"))
    throw new UsageError("--out FILE.gguf is required");
  const r = await quantizeModelDir(dir, values.out, values.to as QuantScheme, {
    force: values.force ?? false,
  });
  const types = Object.entries(r.formats)
    .map(([f, n]) => `${n} ${f}`)
    .join(", ");
  console.log(`wrote ${r.file}: ${r.tensors} tensors (${types}), ${r.bytes} bytes`);
  return 0;
}

const command: Command = {
  summary:
    "generate a deterministic test model, inspect a model directory or GGUF file, or quantize one to GGUF",
  usage,
  async run(argv) {
    const [sub, ...rest] = argv;
    if (sub !== "init" && sub !== "info" && sub !== "quantize")
      throw new UsageError(
        sub === undefined ? "missing subcommand (init, info or quantize)" : `unknown subcommand '${sub}'`,
      );
    try {
      return await (sub === "init" ? init(rest) : sub === "info" ? info(rest) : quantizeCmd(rest));
    } catch (err) {
      // Bad models and bad directories are the user's input: one clear line, exit 1.
      if (err instanceof Error && MODEL_ERRORS.has(err.name)) {
        console.error(`continuum model ${sub}: ${err.message}`);
        return 1;
      }
      throw err;
    }
  },
};
export default command;
