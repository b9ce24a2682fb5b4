import { parseArgs } from "node:util";
import type { DType } from "../../worker/model/dtype.ts";
import { generateModel, PRESETS, type Preset } from "../../worker/model/generate.ts";
import { loadModelDir } from "../../worker/model/model-dir.ts";
import { numel } from "../../worker/model/safetensors.ts";
import { chooseEngine } from "../../worker/runtime/engine-load.ts";
import { type Command, UsageError } from "../command.ts";

const DTYPES: Record<string, DType> = { f32: "F32", f16: "F16", bf16: "BF16" };
const MODEL_ERRORS = new Set([
  "ModelConfigError",
  "SafetensorsError",
  "WeightsError",
  "TokenizerError",
  "GenerateError",
  "ModelDirError",
]);

const usage = [
  "Usage:",
  "  continuum model init --preset tiny|small|bench --out DIR [--seed N] [--dtype f32|f16|bf16] [--force]",
  "  continuum model info DIR [--variant NAME] [--json]",
  "",
  "init   writes a deterministic Llama-family model in Hugging Face format (config.json,",
  "       model.safetensors or shards, tokenizer.json with a byte-level BPE, tokenizer_config.json,",
  "       generation_config.json). Same preset, seed and dtype give the same bytes.",
  "         tiny   2 layers, hidden 64, f32 (tests, seconds)",
  "         small  12 layers, hidden 768, bf16, ~88 M params (benchmarks)",
  "         bench  16 layers, hidden 2048, bf16, ~0.89 B params, 1 GiB shards (bandwidth benches)",
  "       An existing non-empty DIR is refused unless --force.",
  "info   loads a model directory (any Hugging Face Llama/Mistral/Qwen2 checkpoint) and prints",
  "       its config, tensor count and bytes, and the model fingerprint for the execution",
  "       variant NAME (default: the variant of the engine a worker gets on this machine,",
  "       cpu-f32acc/v1 or a CUDA one; the value for model.variant of a fleet of such workers).",
].join("\n");

async function init(argv: readonly string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args: [...argv],
    options: {
      preset: { type: "string" },
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
    out: values.out,
    seed,
    ...(dtype ? { dtype } : {}),
    force: values.force ?? false,
  });
  const s = g.config.spec;
  console.log(
    `wrote ${preset} model to ${g.dir}: ${s.nLayers} layers, hidden ${s.hidden}, heads ${s.nHeads}/${s.nKvHeads}, ` +
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
    tokenizer: { size: m.tokenizer.size, chatFormat: m.tokenizer.chatFormat },
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
  for (const [k, v] of Object.entries(m.config.spec)) console.log(`  ${k.padEnd(15)} ${JSON.stringify(v)}`);
  console.log(`tokens       bos ${m.config.bosTokenId ?? "none"}, eos ${JSON.stringify(m.eosTokenIds)}`);
  console.log(`tokenizer    ${m.tokenizer.size} tokens, chat format ${m.tokenizer.chatFormat}`);
  console.log(
    `weights      ${summary.tensors} tensors, ${params} params, ${bytes} bytes, ${summary.dtypes.join("+")}`,
  );
  console.log(`digest       ${m.manifest.weightsDigest}`);
  console.log(`variant      ${m.manifest.variant} (kv ${m.manifest.kvDtype}, layout ${m.manifest.layout})`);
  console.log(`fingerprint  ${m.fingerprint}`);
  return 0;
}

const command: Command = {
  summary: "generate a deterministic test model, or inspect a Hugging Face model directory",
  usage,
  async run(argv) {
    const [sub, ...rest] = argv;
    if (sub !== "init" && sub !== "info")
      throw new UsageError(
        sub === undefined ? "missing subcommand (init or info)" : `unknown subcommand '${sub}'`,
      );
    try {
      return await (sub === "init" ? init(rest) : info(rest));
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
