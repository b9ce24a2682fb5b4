import { readFile, stat } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import type { ModelConfig } from "./config.ts";
import { decodeValues, encodeValues, type WeightFormat } from "./dtype.ts";
import { GgufError } from "./gguf.ts";
import {
  CONTINUUM_KEYS,
  GEMMA3_PATTERN,
  GGUF_ARCHITECTURES,
  ggufTensorName,
  HF_TO_GGUF,
  interleavedRows,
  LLAMA3_KEYS,
  llama3RopeFactors,
  permuteRows,
  ROPE_FACTORS_LONG,
  ROPE_FACTORS_SHORT,
  ROPE_FREQS,
  slidingTypes,
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
 *   f32     every tensor F32 (lossless from any checkpoint dtype)
 *   bf16    every matrix BF16 (lossless from a bf16 checkpoint)
 *   q8_0    every matrix Q8_0
 *   q4_0    matrices Q4_0; the LM head (output, or the tied embedding) Q6_K
 *   q4_k_m  matrices Q4_K; the LM head, and attn_v and ffn_down in the
 *           layers llama.cpp gives more bits (the first and last eighth, every
 *           third between), Q6_K
 * Norms and biases stay F32. A K-quant needs rows of whole 256-element
 * super-blocks; a matrix whose rows are not falls back to Q8_0 (llama.cpp
 * falls back to other legacy types this reader does not implement).
 */
export type QuantScheme = "f32" | "bf16" | "q8_0" | "q4_0" | "q4_k_m";
export const QUANT_SCHEMES: readonly QuantScheme[] = ["f32", "bf16", "q8_0", "q4_0", "q4_k_m"];

/** general.file_type (llama_ftype) of each scheme. */
const FILE_TYPE: Record<QuantScheme, number> = { f32: 0, bf16: 32, q8_0: 7, q4_0: 2, q4_k_m: 15 };

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
  if (shape.length !== 2 || scheme === "f32") return "F32";
  if (scheme === "bf16") return "BF16";
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
  const raw = await readJsonFile(join(dir, "config.json"), false);
  for (const [key, v] of familyMetadata(arch, config)) meta.set(key, v);
  const rs = spec.ropeScaling;
  if (rs?.kind === "linear") {
    meta.set(k("rope.scaling.type"), { type: "string", value: "linear" });
    meta.set(k("rope.scaling.factor"), { type: "f32", value: rs.factor });
  } else if (rs?.kind === "longrope") {
    // llama.cpp keeps both lists and picks by context; the spec fixed one, the other comes from config.json.
    const o = raw.rope_scaling as Record<string, number[]>;
    meta.set(k("rope.scaling.attn_factor"), { type: "f32", value: rs.attentionFactor });
    for (const [name, list] of [
      [ROPE_FACTORS_LONG, o.long_factor!],
      [ROPE_FACTORS_SHORT, o.short_factor!],
    ] as const) {
      const f = Float32Array.from(list);
      tensors.push({ name, format: "F32", dims: [f.length], bytes: () => new Uint8Array(f.buffer) });
    }
  } else if (rs) {
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
  if (spec.family === "phi3")
    meta.set(k("rope.scaling.original_context_length"), {
      type: "u32",
      value:
        typeof raw.original_max_position_embeddings === "number"
          ? raw.original_max_position_embeddings
          : 4096,
    });
  const { permutedQK: permuted, normShift } = GGUF_ARCHITECTURES[arch]!;
  const formats: Record<string, number> = {};
  for (const [hf, shape] of expected) {
    const format = formatFor(scheme, hf, shape, config);
    formats[format] = (formats[format] ?? 0) + 1;
    tensors.push({
      name: ggufTensorName(hf, arch),
      format,
      dims: [...shape].reverse(),
      bytes: async () => {
        const t = (await ckpt.load([hf])).get(hf)!;
        // llama.cpp's Gemma files hold 1 + w for every norm (gguf-arch.ts).
        const shift = normShift && hf.endsWith("norm.weight") ? 1 : 0;
        const values = Float32Array.from(decodeValues(t.data, t.dtype), (x) => x + shift);
        let bytes: Uint8Array =
          format === "F32" || format === "BF16"
            ? encodeValues(values, format)
            : quantize(values, format as QuantType);
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

/**
 * The family's keys: the sliding window (which layers slide is the
 * architecture's fixed rule, so a layout it cannot say is refused), Gemma's
 * soft-caps and attention scalar, Gemma 3's pattern and local RoPE base.
 */
function familyMetadata(arch: string, config: ModelConfig): Map<string, GgufMetaValue> {
  const spec = config.spec;
  const k = (s: string) => `${arch}.${s}`;
  const meta = new Map<string, GgufMetaValue>();
  const windows = new Set(spec.layers.flatMap((l) => (l.kind === "sliding" ? [l.window] : [])));
  if (windows.size > 1)
    throw new GgufError(
      `model quantize: sliding windows of several sizes (${[...windows].join(", ")}) cannot be written as GGUF`,
    );
  const window = [...windows][0];
  let pattern = GEMMA3_PATTERN;
  if (arch === "gemma3") {
    // The smallest period whose rule gives the spec's layers (the file stores it when llama.cpp's 6 does not).
    const sliding = spec.layers.map((l) => l.kind === "sliding");
    const p = Array.from({ length: spec.nLayers + 1 }, (_, i) => i + 1).find((n) =>
      slidingTypes(arch, spec.nLayers, n).every((s, i) => s === sliding[i]),
    );
    if (p !== undefined) pattern = p;
    if (pattern !== GEMMA3_PATTERN) meta.set(CONTINUUM_KEYS.slidingPattern, { type: "u32", value: pattern });
  }
  if (window !== undefined) {
    const want = slidingTypes(arch, spec.nLayers, pattern);
    const bad = spec.layers.findIndex((l, i) => (l.kind === "sliding") !== want[i]);
    if (bad >= 0)
      throw new GgufError(
        `model quantize: layer ${bad} is ${spec.layers[bad]!.kind}, but a ${arch} GGUF file's window applies to ${arch === "gemma2" ? "alternate layers" : arch === "gemma3" ? `all but every ${pattern}th layer` : "every layer"}`,
      );
    meta.set(k("attention.sliding_window"), { type: "u32", value: window });
  }
  if (spec.normOffset) {
    meta.set(CONTINUUM_KEYS.queryPreAttnScalar, { type: "f32", value: spec.attnScale! ** -2 });
    if (spec.attnSoftcap !== null)
      meta.set(k("attn_logit_softcapping"), { type: "f32", value: spec.attnSoftcap });
    if (spec.finalSoftcap !== null)
      meta.set(k("final_logit_softcapping"), { type: "f32", value: spec.finalSoftcap });
    if (arch === "gemma2" && (spec.attnSoftcap === null || spec.finalSoftcap === null))
      throw new GgufError(
        "model quantize: a gemma2 GGUF file needs both soft-caps (llama.cpp's converter requires them)",
      );
    if (spec.localRopeTheta !== undefined)
      meta.set(CONTINUUM_KEYS.localFreqBase, { type: "f32", value: spec.localRopeTheta });
  }
  return meta;
}
