import { access } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import type { BackendName } from "../../native/index.ts";
import type { Config } from "../../schema/config.ts";
import type { Logger } from "../../schema/log.ts";
import { generateModel } from "../../worker/model/generate.ts";
import {
  type LoadedModel,
  loadModelDir,
  loadModelIdentity,
  type ModelIdentity,
} from "../../worker/model/model-dir.ts";

/** The execution variant of the CPU engine (part of the model fingerprint). */
export const CPU_VARIANT = "cpu-f32acc/v1";

/**
 * Whether the KV bytes an engine backend computes are the numerics the model
 * fingerprint's execution variant names. Every process loads the model with
 * CPU_VARIANT, and only the CPU engine computes it: the CUDA engine's K/V
 * agree with the CPU's to rounding, not bit for bit (98.6 % of fp16 values
 * equal on an H200, native/GPU_RESULTS.md). Its checkpoints would be
 * published under the CPU variant's fingerprint and restored by CPU workers
 * as exact, so a process whose engine does not match keeps durable reuse off
 * (it still reuses its own resident pages) until the CUDA engine's numerics
 * have a variant, and a fingerprint, of their own.
 */
export function engineMatchesVariant(backend: BackendName, variant: string): boolean {
  return backend === "cpu" && variant === CPU_VARIANT;
}

/**
 * Whether a process may checkpoint and restore: durable reuse is `wanted` and
 * the engine computes the fingerprint's numerics (engineMatchesVariant). A
 * refusal of what was wanted is logged with the engine and the variant.
 */
export function durableReuseAllowed(
  wanted: boolean,
  backend: BackendName,
  variant: string,
  log: Logger,
): boolean {
  const exact = engineMatchesVariant(backend, variant);
  if (wanted && !exact)
    log.log("warn", "durable_reuse.off", {
      engine: backend,
      variant,
      reason: "the engine's KV numerics are not the model fingerprint's execution variant",
    });
  return wanted && exact;
}

/**
 * The model a process serves: `model.dir` when set, else the generated preset
 * under the data dir, written on first use (same seed, same bytes, so every
 * process of a local fleet generates the same fingerprint).
 */
export async function ensureModel(config: Config, log: Logger): Promise<{ model: LoadedModel; id: string }> {
  const dir = await modelDir(config, log);
  const model = await loadModelDir(dir, { variant: CPU_VARIANT });
  log.log("info", "model.loaded", { dir, fingerprint: model.fingerprint, layers: model.config.spec.nLayers });
  return { model, id: modelId(dir) };
}

/**
 * The same model's identity (config, tokenizer, fingerprint) without holding
 * its weights: for the fleet controller, which tokenizes and routes but runs
 * no model. The fingerprint is the workers' (the weights are streamed through
 * the digest one bounded span at a time).
 */
export async function ensureModelIdentity(
  config: Config,
  log: Logger,
): Promise<{ model: ModelIdentity; id: string }> {
  const dir = await modelDir(config, log);
  const model = await loadModelIdentity(dir, { variant: CPU_VARIANT });
  log.log("info", "model.identified", { dir, fingerprint: model.fingerprint });
  return { model, id: modelId(dir) };
}

/** The served model's name: its directory's, or its GGUF file's without the extension. */
function modelId(dir: string): string {
  return basename(resolve(dir)).replace(/\.gguf$/, "");
}

/** model.dir, or the preset's directory under the data dir (generated on first use). */
async function modelDir(config: Config, log: Logger): Promise<string> {
  let dir = config.model.dir;
  if (dir === "") {
    dir = resolve(config.store.dataDir, "models", config.model.preset);
    const exists = await access(join(dir, "config.json")).then(
      () => true,
      () => false,
    );
    if (!exists) {
      log.log("info", "model.generating", { preset: config.model.preset, dir });
      await generateModel({ preset: config.model.preset, out: dir, seed: 1 });
    }
  }
  return dir;
}
