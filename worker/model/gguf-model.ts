import { readdir, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import { modelFingerprint } from "../../schema/identity.ts";
import type { ModelConfig } from "./config.ts";
import { decodeValues, encodeValues } from "./dtype.ts";
import { manifestOf, readWeightsDigest, weightFormatOf, weightsDigest } from "./fingerprint.ts";
import { GgufError, type GgufHeader, GgufMeta, readGgufHeader, readGgufTensors } from "./gguf.ts";
import {
  configFromGguf,
  GGUF_ARCHITECTURES,
  hfTensorName,
  interleavedRows,
  llama3RopeJson,
  permuteRows,
  ROPE_FACTORS_LONG,
  ROPE_FACTORS_SHORT,
  ROPE_FREQS,
  ROPE_TENSORS,
  ropeScalingFromFactors,
  shortestF32,
} from "./gguf-arch.ts";
import { tokenizerFromGguf } from "./gguf-tokenizer.ts";
import type { LoadedModel, LoadModelOptions, ModelIdentity } from "./model-dir.ts";
import { progressFor } from "./progress.ts";
import type { LoadedTensor } from "./safetensors.ts";
import { ModelTokenizer } from "./tokenizer.ts";
import { assemble, expectedTensors } from "./weights.ts";

/**
 * A model in one GGUF file: the config from its metadata (gguf-arch.ts),
 * the tokenizer from `tokenizer.json` beside the file when there is one,
 * else from the metadata (gguf-tokenizer.ts), and the tensors under their
 * Hugging Face names and shapes, llama's q/k rows put back in Hugging Face
 * order, so everything after loading (engine, reference, fingerprint) treats
 * it like any model directory. Metadata that disagrees with the tensors is
 * refused, naming both.
 */

/** The GGUF file `path` names: itself when it ends in .gguf, else the one .gguf in a directory without config.json. */
export async function ggufPathOf(path: string): Promise<string | null> {
  let st: Awaited<ReturnType<typeof stat>>;
  try {
    st = await stat(path);
  } catch {
    return null;
  }
  if (st.isFile()) return path.endsWith(".gguf") ? path : null;
  if (!st.isDirectory()) return null;
  const files = await readdir(path);
  if (files.includes("config.json")) return null;
  const ggufs = files.filter((f) => f.endsWith(".gguf"));
  if (ggufs.length > 1) throw new GgufError(`${path}: several .gguf files (${ggufs.join(", ")}); name one`);
  return ggufs.length === 1 ? join(path, ggufs[0]!) : null;
}

interface GgufPlan {
  readonly header: GgufHeader;
  readonly config: ModelConfig;
  /** Hugging Face name → GGUF name, for every tensor the model uses. */
  readonly names: ReadonlyMap<string, string>;
  /** Hugging Face names whose rows are stored interleaved (llama's q/k), with the row map. */
  readonly permuted: ReadonlyMap<string, Int32Array>;
  /** Norm weights are stored as 1 + w (Gemma): loaded as w, in F32. */
  readonly normShift: boolean;
  readonly tokenizer: ModelTokenizer;
}

async function plan(file: string): Promise<GgufPlan> {
  const header = await readGgufHeader(file);
  const meta = new GgufMeta(header);
  const arch = meta.string("general.architecture");
  const a = GGUF_ARCHITECTURES[arch];
  if (a === undefined)
    throw new GgufError(
      `${file}: metadata general.architecture = "${arch}" is not supported (supported: ${Object.keys(GGUF_ARCHITECTURES).join(", ")})`,
    );
  const embed = header.tensors.get("token_embd.weight");
  if (embed === undefined || embed.dims.length !== 2)
    throw new GgufError(`${file}: missing tensor 'token_embd.weight' (a 2-D embedding)`);
  const rope = await ropeOf(header, meta, arch);
  const config = configFromGguf(meta, arch, embed.dims[1]!, !header.tensors.has("output.weight"), rope);
  const spec = config.spec;
  const expected = expectedTensors(spec);
  const names = new Map<string, string>();
  for (const t of header.tensors.values()) {
    if (ROPE_TENSORS.has(t.name)) continue;
    const hf = hfTensorName(t.name, arch);
    const shape = expected.get(hf ?? "");
    if (hf === undefined || shape === undefined)
      throw new GgufError(
        `${file}: unexpected tensor '${t.name}' for a ${arch} model of ${spec.nLayers} layers`,
      );
    const hfShape = [...t.dims].reverse();
    if (hfShape.length !== shape.length || hfShape.some((d, i) => d !== shape[i]))
      throw new GgufError(
        `${file}: tensor '${t.name}' has dimensions [${t.dims.join(", ")}], the metadata implies [${[...shape].reverse().join(", ")}]`,
      );
    names.set(hf, t.name);
  }
  for (const [hf, shape] of expected)
    if (!names.has(hf))
      throw new GgufError(
        `${file}: missing tensor for '${hf}' (dimensions [${[...shape].reverse().join(", ")}])`,
      );
  const permuted = new Map<string, Int32Array>();
  if (a.permutedQK)
    for (let l = 0; l < spec.nLayers; l++) {
      permuted.set(`model.layers.${l}.self_attn.q_proj.weight`, interleavedRows(spec.nHeads, spec.headDim));
      permuted.set(`model.layers.${l}.self_attn.k_proj.weight`, interleavedRows(spec.nKvHeads, spec.headDim));
    }
  return {
    header,
    config,
    names,
    permuted,
    normShift: a.normShift,
    tokenizer: await ggufTokenizer(file, meta, spec.vocab),
  };
}

/** A RoPE tensor's factors: F32, one per frequency. */
async function factorsOf(header: GgufHeader, name: string, half: number): Promise<number[]> {
  const info = header.tensors.get(name)!;
  if (info.format !== "F32")
    throw new GgufError(`${header.file}: tensor '${name}' must be F32, got ${info.format}`);
  const bytes = (await readGgufTensors(header, [name])).get(name)!;
  const f = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  if (f.length !== half)
    throw new GgufError(
      `${header.file}: tensor '${name}' has ${f.length} factors, head_dim ${2 * half} needs ${half}`,
    );
  return Array.from(f);
}

/** config.json's rope_scaling that the file's RoPE tensors encode (Llama 3's rope_freqs, Phi-3's LongRoPE lists). */
async function ropeOf(
  header: GgufHeader,
  meta: GgufMeta,
  arch: string,
): Promise<Record<string, unknown> | undefined> {
  const k = (s: string) => `${arch}.${s}`;
  const heads = meta.posUint(k("attention.head_count"));
  const headDim = meta.posUint(
    k("attention.key_length"),
    Math.floor(meta.posUint(k("embedding_length")) / heads),
  );
  const has = (n: string) => header.tensors.has(n);
  const longrope = has(ROPE_FACTORS_LONG) || has(ROPE_FACTORS_SHORT);
  if (has(ROPE_FREQS) && (arch !== "llama" || longrope))
    throw new GgufError(
      `${header.file}: tensor '${ROPE_FREQS}' is not supported for ${arch}${longrope ? " beside LongRoPE factors" : ""}`,
    );
  if (has(ROPE_FREQS)) {
    const f = Float32Array.from(await factorsOf(header, ROPE_FREQS, headDim / 2));
    return llama3RopeJson(
      ropeScalingFromFactors(meta, f, headDim, meta.posFloat(k("rope.freq_base"), 10000)),
    );
  }
  if (!longrope) return undefined;
  if (arch !== "phi3")
    throw new GgufError(`${header.file}: LongRoPE factor tensors are not supported for ${arch}`);
  for (const n of [ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT])
    if (!has(n))
      throw new GgufError(`${header.file}: missing tensor '${n}' (LongRoPE needs both factor lists)`);
  return {
    rope_type: "longrope",
    long_factor: (await factorsOf(header, ROPE_FACTORS_LONG, headDim / 2)).map(shortestF32),
    short_factor: (await factorsOf(header, ROPE_FACTORS_SHORT, headDim / 2)).map(shortestF32),
  };
}

/** tokenizer.json (+ tokenizer_config.json) beside the file when present, else the metadata's. */
async function ggufTokenizer(file: string, meta: GgufMeta, vocab: number): Promise<ModelTokenizer> {
  const dir = dirname(file);
  try {
    await stat(join(dir, "tokenizer.json"));
    return await ModelTokenizer.load(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  const t = tokenizerFromGguf(meta, vocab);
  return ModelTokenizer.fromJson(t.json, t.config);
}

function identityOf(p: GgufPlan, digest: string, variant: string): ModelIdentity {
  const formats = [...p.names.values()].map((g) => p.header.tensors.get(g)!.format);
  const manifest = manifestOf(p.config.spec, digest, variant, weightFormatOf(formats));
  return {
    dir: p.header.file,
    config: p.config,
    tokenizer: p.tokenizer,
    eosTokenIds: p.config.eosTokenIds,
    manifest,
    fingerprint: modelFingerprint(manifest),
  };
}

function tensorOf(p: GgufPlan, hf: string, data: Buffer): LoadedTensor {
  const info = p.header.tensors.get(p.names.get(hf)!)!;
  const perm = p.permuted.get(hf);
  if (p.normShift && hf.endsWith("norm.weight")) {
    // v - 1 is exact in f32 for v in [0.5, 2] (Sterbenz), so the engine's 1 + w is the file's v again.
    const w = Float32Array.from(decodeValues(data, info.format), (x) => x - 1);
    return {
      name: hf,
      dtype: "F32",
      shape: [...info.dims].reverse(),
      data: Buffer.from(encodeValues(w, "F32")),
    };
  }
  return {
    name: hf,
    dtype: info.format,
    shape: [...info.dims].reverse(),
    data: perm ? permuteRows(data, perm, true) : data,
  };
}

export async function loadGgufModel(file: string, opts: LoadModelOptions): Promise<LoadedModel> {
  const p = await plan(file);
  const byGguf = [...p.names.values()];
  const progress =
    opts.progress ??
    progressFor(
      "loading weights",
      byGguf.reduce((n, g) => n + p.header.tensors.get(g)!.byteLength, 0),
    );
  const raw = await readGgufTensors(p.header, byGguf, progress);
  const tensors = new Map<string, LoadedTensor>();
  for (const [hf, g] of p.names) tensors.set(hf, tensorOf(p, hf, raw.get(g)!));
  raw.clear();
  const weights = assemble(tensors, p.config.spec);
  return { ...identityOf(p, weightsDigest(tensors.values()), opts.variant), weights };
}

/** The identity (fingerprint equal to loadGgufModel's) with one tensor in memory at a time. */
export async function loadGgufIdentity(
  file: string,
  opts: { readonly variant: string },
): Promise<ModelIdentity> {
  const p = await plan(file);
  const heads = [...p.names].map(([hf, g]) => {
    const info = p.header.tensors.get(g)!;
    const shifted = p.normShift && hf.endsWith("norm.weight");
    return { name: hf, dtype: shifted ? "F32" : info.format, shape: [...info.dims].reverse() };
  });
  const digest = await readWeightsDigest(heads, async (hf) => {
    const g = p.names.get(hf)!;
    return tensorOf(p, hf, (await readGgufTensors(p.header, [g])).get(g)!).data;
  });
  return identityOf(p, digest, opts.variant);
}
