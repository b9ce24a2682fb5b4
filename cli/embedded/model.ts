import { access } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import { Effect, type Scope } from "effect";
import type { Engine } from "../../native/engine.ts";
import type { Config } from "../../schema/config.ts";
import type { Logger } from "../../schema/log.ts";
import { resource } from "../../schema/scope.ts";
import { generateModel } from "../../worker/model/generate.ts";
import {
  type LoadedModel,
  loadModelDir,
  loadModelIdentity,
  type ModelIdentity,
} from "../../worker/model/model-dir.ts";
import { routedVariant } from "../../worker/model/variant.ts";
import { chooseEngine, loadEngine } from "../../worker/runtime/engine-load.ts";
import { explainStartupError } from "./startup.ts";

/**
 * The model a process serves: `model.dir` when set, else the generated preset
 * under the data dir, written on first use (same seed, same bytes, so every
 * process of a local fleet generates the same fingerprint), fingerprinted
 * under `variant`, the execution variant of the engine that will run it
 * (worker/runtime/engine-load.ts chooseEngine).
 */
export async function ensureModel(
  config: Config,
  log: Logger,
  variant: string,
): Promise<{ model: LoadedModel; id: string }> {
  const dir = await modelDir(config, log);
  const model = await loadModelDir(dir, { variant });
  log.log("info", "model.loaded", {
    dir,
    fingerprint: model.fingerprint,
    variant,
    layers: model.config.spec.nLayers,
  });
  return { model, id: modelId(dir) };
}

/**
 * A role's model and the engine that runs it, acquired in the role's scope
 * (the engine freed when it closes). The engine's execution variant is chosen
 * first: it names the model's fingerprint, so the role's chunks are restored
 * as exact only by engines computing the same bits. A failure to get the
 * model reads as explainStartupError(err, dataDir) says.
 */
export function openModelEngine(
  config: Config,
  log: Logger,
  dataDir: string,
): Effect.Effect<{ model: LoadedModel; id: string; engine: Engine; variant: string }, unknown, Scope.Scope> {
  return Effect.gen(function* () {
    const choice = chooseEngine(config.worker.backend, config.model.variant);
    const { model, id } = yield* Effect.promise(() =>
      ensureModel(config, log, choice.variant).catch((err: unknown) => {
        throw explainStartupError(err, dataDir);
      }),
    );
    const engine = yield* resource(
      () =>
        loadEngine(model, config.pages, {
          ...(config.worker.threads ? { threads: config.worker.threads } : {}),
          backend: choice.backend,
        }),
      (e) => e.free(),
    );
    return { model, id, engine, variant: choice.variant };
  });
}

/**
 * The same model's identity (config, tokenizer, fingerprint) without holding
 * its weights: for the fleet controller, which tokenizes and routes but runs
 * no model. The fingerprint is that of the workers it routes to, of variant
 * model.variant (routedVariant; the weights are streamed through the digest
 * one bounded span at a time).
 */
export async function ensureModelIdentity(
  config: Config,
  log: Logger,
): Promise<{ model: ModelIdentity; id: string }> {
  const dir = await modelDir(config, log);
  const variant = routedVariant(config.model.variant);
  const model = await loadModelIdentity(dir, { variant });
  log.log("info", "model.identified", { dir, fingerprint: model.fingerprint, variant });
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
