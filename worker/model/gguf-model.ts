import { readdir, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import { modelFingerprint } from "../../schema/identity.ts";
import type { Llama3RopeScaling, ModelConfig } from "./config.ts";
import { manifestOf, readWeightsDigest, weightFormatOf, weightsDigest } from "./fingerprint.ts";
import { GgufError, type GgufHeader, GgufMeta, readGgufHeader, readGgufTensors } from "./gguf.ts";
import {
  configFromGguf,
  GGUF_ARCHITECTURES,
  hfTensorName,
  interleavedRows,
  permuteRows,
  ROPE_FREQS,
  ropeScalingFromFactors,
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
  let rope: Llama3RopeScaling | undefined;
  const freqs = header.tensors.get(ROPE_FREQS);
  if (freqs !== undefined) {
    if (freqs.format !== "F32")
      throw new GgufError(`${file}: tensor '${ROPE_FREQS}' must be F32, got ${freqs.format}`);
    const bytes = (await readGgufTensors(header, [ROPE_FREQS])).get(ROPE_FREQS)!;
    const f = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
    const k = (s: string) => `${arch}.${s}`;
    const heads = meta.posUint(k("attention.head_count"));
    const headDim = meta.posUint(
      k("attention.key_length"),
      Math.floor(meta.posUint(k("embedding_length")) / heads),
    );
    rope = ropeScalingFromFactors(meta, f, headDim, meta.posFloat(k("rope.freq_base"), 10000));
  }
  const config = configFromGguf(meta, arch, embed.dims[1]!, !header.tensors.has("output.weight"), rope);
  const spec = config.spec;
  const expected = expectedTensors(spec);
  const names = new Map<string, string>();
  for (const t of header.tensors.values()) {
    if (t.name === ROPE_FREQS) continue;
    const hf = hfTensorName(t.name);
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
  return { header, config, names, permuted, tokenizer: await ggufTokenizer(file, meta, spec.vocab) };
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
    return { name: hf, dtype: info.format, shape: [...info.dims].reverse() };
  });
  const digest = await readWeightsDigest(heads, async (hf) => {
    const g = p.names.get(hf)!;
    return tensorOf(p, hf, (await readGgufTensors(p.header, [g])).get(g)!).data;
  });
  return identityOf(p, digest, opts.variant);
}
