import { readFile, stat } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import type { ModelConfig } from "./config.ts";
import { decodeValues, encodeValues, type WeightFormat } from "./dtype.ts";
import { GgufError } from "./gguf.ts";
import {
  GGUF_ARCHITECTURES,
  ggufTensorName,
  HF_TO_GGUF,
  interleavedRows,
  LLAMA3_KEYS,
  llama3RopeFactors,
  permuteRows,
  ROPE_FREQS,
} from "./gguf-arch.ts";
import { ggufTokenizerMetadata } from "./gguf-tokenizer.ts";
import { type GgufMetaValue, type GgufTensorToWrite, writeGguf } from "./gguf-write.ts";
import { readTextSide } from "./model-dir.ts";
import { QUANT_BLOCKS, type QuantType, quantize } from "./quant.ts";
import { SafetensorsCheckpoint } from "./safetensors.ts";
import { checkCheckpoint } from "./weights.ts";

/**
 * `continuum model quantize`: a Hugging Face model directory to one GGUF
 * file llama.cpp's reader accepts (gguf-write.ts), tensors quantized one at a
 * time (memory: one tensor). Schemes, as llama.cpp's file types of the same
 * names choose per tensor:
 *   q8_0    every matrix Q8_0
 *   q4_0    matrices Q4_0; the LM head (output, or the tied embedding) Q6_K
 *   q4_k_m  matrices Q4_K; the LM head, and attn_v and ffn_down in the
 *           layers llama.cpp gives more bits (the first and last eighth, every
 *           third between), Q6_K
 * Norms and biases stay F32. A K-quant needs rows of whole 256-element
 * super-blocks; a matrix whose rows are not falls back to Q8_0 (llama.cpp
 * falls back to other legacy types this reader does not implement).
 */
export type QuantScheme = "q8_0" | "q4_0" | "q4_k_m";
export const QUANT_SCHEMES: readonly QuantScheme[] = ["q8_0", "q4_0", "q4_k_m"];

/** general.file_type (llama_ftype) of each scheme. */
const FILE_TYPE: Record<QuantScheme, number> = { q8_0: 7, q4_0: 2, q4_k_m: 15 };

export interface QuantizeResult {
  readonly file: string;
  readonly tensors: number;
  readonly bytes: number;
  /** Tensors per stored type. */
  readonly formats: Readonly<Record<string, number>>;
}

/** llama.cpp's use_more_bits: the layers whose attn_v / ffn_down a Q4_K_M keeps in Q6_K. */
function moreBits(layer: number, layers: number): boolean {
  const e = Math.floor(layers / 8);
  return layer < e || layer >= Math.floor((7 * layers) / 8) || (layer - e) % 3 === 2;
}

/** The stored type of one tensor of the scheme. */
export function formatFor(
  scheme: QuantScheme,
  hf: string,
  shape: readonly number[],
  config: ModelConfig,
): WeightFormat {
  if (shape.length !== 2) return "F32";
  const head = hf === "lm_head.weight" || (config.spec.tiedEmbeddings && hf === "model.embed_tokens.weight");
  const layer = /^model\.layers\.(\d+)\.(self_attn\.v_proj|mlp\.down_proj)\.weight$/.exec(hf);
  let t: QuantType;
  if (scheme === "q8_0") t = "Q8_0";
  else if (head) t = "Q6_K";
  else if (scheme === "q4_0") t = "Q4_0";
  else t = layer && moreBits(Number(layer[1]), config.spec.nLayers) ? "Q6_K" : "Q4_K";
  return shape[1]! % QUANT_BLOCKS[t].elems === 0 ? t : "Q8_0";
}

async function readJsonFile(path: string, optional: boolean): Promise<Record<string, unknown>> {
  try {
    return JSON.parse(await readFile(path, "utf8")) as Record<string, unknown>;
  } catch (err) {
    if (optional && (err as NodeJS.ErrnoException).code === "ENOENT") return {};
    throw new GgufError(`${path}: ${(err as Error).message}`);
  }
}

export async function quantizeModelDir(
  dir: string,
  out: string,
  scheme: QuantScheme,
  opts: { readonly force?: boolean } = {},
): Promise<QuantizeResult> {
  if (!QUANT_SCHEMES.includes(scheme))
    throw new GgufError(`unknown quantization '${String(scheme)}' (known: ${QUANT_SCHEMES.join(", ")})`);
  if (
    !opts.force &&
    (await stat(out).then(
      () => true,
      () => false,
    ))
  )
    throw new GgufError(`${out} exists; choose another file or pass --force`);
  const { config, eos } = await readTextSide(dir);
  const spec = config.spec;
  const arch = HF_TO_GGUF[config.architecture];
  if (arch === undefined)
    throw new GgufError(
      `model quantize: ${config.architecture} cannot be written as GGUF yet (supported: ${Object.keys(HF_TO_GGUF).join(", ")})`,
    );
  const ckpt = await SafetensorsCheckpoint.open(dir);
  const expected = checkCheckpoint(ckpt, spec);
  const tokJson = await readJsonFile(join(dir, "tokenizer.json"), false);
  const tokConfig = await readJsonFile(join(dir, "tokenizer_config.json"), true);
  const k = (s: string) => `${arch}.${s}`;
  const meta = new Map<string, GgufMetaValue>([
    ["general.architecture", { type: "string", value: arch }],
    ["general.name", { type: "string", value: basename(resolve(dir)) }],
    ["general.file_type", { type: "u32", value: FILE_TYPE[scheme] }],
    ["general.quantization_version", { type: "u32", value: 2 }],
    [k("context_length"), { type: "u32", value: spec.maxPosition }],
    [k("embedding_length"), { type: "u32", value: spec.hidden }],
    [k("block_count"), { type: "u32", value: spec.nLayers }],
    [k("feed_forward_length"), { type: "u32", value: spec.ffn }],
    [k("attention.head_count"), { type: "u32", value: spec.nHeads }],
    [k("attention.head_count_kv"), { type: "u32", value: spec.nKvHeads }],
    [k("attention.key_length"), { type: "u32", value: spec.headDim }],
    [k("attention.value_length"), { type: "u32", value: spec.vHeadDim }],
    [k("attention.layer_norm_rms_epsilon"), { type: "f32", value: spec.rmsEps }],
    [k("rope.dimension_count"), { type: "u32", value: spec.headDim }],
    [k("rope.freq_base"), { type: "f32", value: spec.ropeTheta }],
    [k("vocab_size"), { type: "u32", value: spec.vocab }],
    ...ggufTokenizerMetadata(tokJson, tokConfig, spec.vocab, eos, config.bosTokenId),
  ]);
  const tensors: GgufTensorToWrite[] = [];
  const rs = spec.ropeScaling;
  if (rs) {
    if (rs.kind !== "llama3")
      throw new GgufError(`model quantize: rope_scaling type ${rs.kind} cannot be written as GGUF yet`);
    // llama.cpp applies Llama-3 scaling as per-frequency factors; the keys say which rule made them.
    meta.set(LLAMA3_KEYS.factor, { type: "f32", value: rs.factor });
    meta.set(LLAMA3_KEYS.lowFreqFactor, { type: "f32", value: rs.lowFreqFactor });
    meta.set(LLAMA3_KEYS.highFreqFactor, { type: "f32", value: rs.highFreqFactor });
    meta.set(LLAMA3_KEYS.originalMaxPosition, { type: "u32", value: rs.originalMaxPosition });
    const factors = llama3RopeFactors(spec.headDim, spec.ropeTheta, rs);
    tensors.push({
      name: ROPE_FREQS,
      format: "F32",
      dims: [factors.length],
      bytes: () => new Uint8Array(factors.buffer),
    });
  }
  const permuted = GGUF_ARCHITECTURES[arch]!.permutedQK;
  const formats: Record<string, number> = {};
  for (const [hf, shape] of expected) {
    const format = formatFor(scheme, hf, shape, config);
    formats[format] = (formats[format] ?? 0) + 1;
    tensors.push({
      name: ggufTensorName(hf),
      format,
      dims: [...shape].reverse(),
      bytes: async () => {
        const t = (await ckpt.load([hf])).get(hf)!;
        const values = Float32Array.from(decodeValues(t.data, t.dtype));
        let bytes: Uint8Array =
          format === "F32" ? encodeValues(values, "F32") : quantize(values, format as QuantType);
        const heads = /self_attn\.q_proj\.weight$/.test(hf)
          ? spec.nHeads
          : /self_attn\.k_proj\.weight$/.test(hf)
            ? spec.nKvHeads
            : 0;
        if (permuted && heads > 0) bytes = permuteRows(bytes, interleavedRows(heads, spec.headDim), false);
        return bytes;
      },
    });
  }
  await writeGguf(out, meta, tensors);
  return { file: out, tensors: tensors.length, bytes: (await stat(out)).size, formats };
}
