import { readFile } from "node:fs/promises";
import { join } from "node:path";
import type { ModelManifest } from "../../schema/identity.ts";
import { modelFingerprint } from "../../schema/identity.ts";
import type { ModelFingerprint } from "../../schema/ids.ts";
import { type ModelConfig, parseModelConfig } from "./config.ts";
import { manifestOf, modelManifest, streamWeightsDigest, weightFormatOf } from "./fingerprint.ts";
import { ggufPathOf, loadGgufIdentity, loadGgufModel } from "./gguf-model.ts";
import type { ByteProgress } from "./progress.ts";
import { SafetensorsCheckpoint } from "./safetensors.ts";
import { ModelTokenizer } from "./tokenizer.ts";
import { checkCheckpoint, loadWeights, type ModelWeights } from "./weights.ts";

/**
 * A Hugging Face model directory, loaded: config.json, the safetensors
 * checkpoint (single or sharded), tokenizer.json (+ tokenizer_config.json),
 * and generation_config.json when present; or a GGUF file (a path ending in
 * .gguf, or a directory holding one .gguf and no config.json: gguf-model.ts).
 * The loader treats every directory alike; nothing here knows whether the
 * model was generated.
 */
export interface LoadedModel extends ModelIdentity {
  readonly weights: ModelWeights;
}

/**
 * What a process that tokenizes and routes but runs no model needs (the
 * fleet controller): config, tokenizer, end-of-sequence ids and the
 * fingerprint — the weights only streamed through the digest, never held.
 */
export interface ModelIdentity {
  readonly dir: string;
  readonly config: ModelConfig;
  readonly tokenizer: ModelTokenizer;
  /** Tokens that end generation: generation_config.json's eos ids, else config.json's. */
  readonly eosTokenIds: readonly number[];
  readonly manifest: ModelManifest;
  readonly fingerprint: ModelFingerprint;
}

export interface LoadModelOptions {
  /** The execution variant whose numerics the KV bytes depend on (e.g. "cpu-f32acc/v1"). */
  readonly variant: string;
  readonly progress?: ByteProgress;
}

export class ModelDirError extends Error {
  override readonly name = "ModelDirError";
}

async function readJson(path: string, optional: boolean): Promise<Record<string, unknown> | undefined> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (err) {
    if (optional && (err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new ModelDirError(`${path}: cannot read: ${(err as Error).message}`);
  }
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch (err) {
    throw new ModelDirError(`${path}: not JSON: ${(err as Error).message}`);
  }
}

/** Reads and validates DIR/config.json only. */
export async function readModelConfig(dir: string): Promise<ModelConfig> {
  return parseModelConfig(await readJson(join(dir, "config.json"), false));
}

/** config.json, generation_config.json's eos ids and the tokenizer: everything but the weights. */
export async function readTextSide(dir: string): Promise<{
  config: ModelConfig;
  eos: readonly number[];
  tokenizer: ModelTokenizer;
}> {
  const config = await readModelConfig(dir);
  const gen = await readJson(join(dir, "generation_config.json"), true);
  let eos = config.eosTokenIds;
  if (gen && gen.eos_token_id !== undefined && gen.eos_token_id !== null) {
    const v = gen.eos_token_id;
    const ids = Array.isArray(v) ? v : [v];
    for (const id of ids)
      if (!Number.isSafeInteger(id) || (id as number) < 0 || (id as number) >= config.spec.vocab)
        throw new ModelDirError(
          `${join(dir, "generation_config.json")}: eos_token_id: ${JSON.stringify(id)} is not a token id below vocab_size ${config.spec.vocab}`,
        );
    eos = ids as number[];
  }
  return { config, eos, tokenizer: await ModelTokenizer.load(dir) };
}

export async function loadModelDir(dir: string, opts: LoadModelOptions): Promise<LoadedModel> {
  const gguf = await ggufPathOf(dir);
  if (gguf !== null) return loadGgufModel(gguf, opts);
  const { config, eos, tokenizer } = await readTextSide(dir);
  const weights = await loadWeights(dir, config.spec, opts.progress ? { progress: opts.progress } : {});
  const manifest = modelManifest(config.spec, weights.tensors.values(), opts.variant);
  return {
    dir,
    config,
    weights,
    tokenizer,
    eosTokenIds: eos,
    manifest,
    fingerprint: modelFingerprint(manifest),
  };
}

/**
 * The model's identity without its weights in memory: the checkpoint's
 * headers are validated against the config exactly as a full load does, and
 * the weights digest is streamed (one bounded span at a time), so the
 * fingerprint equals loadModelDir's bit for bit.
 */
export async function loadModelIdentity(
  dir: string,
  opts: { readonly variant: string },
): Promise<ModelIdentity> {
  const gguf = await ggufPathOf(dir);
  if (gguf !== null) return loadGgufIdentity(gguf, opts);
  const { config, eos, tokenizer } = await readTextSide(dir);
  const ckpt = await SafetensorsCheckpoint.open(dir);
  const expected = checkCheckpoint(ckpt, config.spec);
  const formats = weightFormatOf([...expected.keys()].map((n) => ckpt.info(n).dtype));
  const manifest = manifestOf(
    config.spec,
    await streamWeightsDigest(ckpt, expected.keys()),
    opts.variant,
    formats,
  );
  return { dir, config, tokenizer, eosTokenIds: eos, manifest, fingerprint: modelFingerprint(manifest) };
}
