import { join } from "node:path";
import { type GenerateOptions, generateModel } from "../worker/model/generate.ts";
import { type LoadedModel, loadModelDir } from "../worker/model/model-dir.ts";

/** Where the benches keep the models they generate: <CONTINUUM_DATA_DIR, else .continuum>/models. */
export const BENCH_MODELS = join(process.env.CONTINUUM_DATA_DIR ?? ".continuum", "models");
/** The `small` preset the decode, serve and prefix benches run. */
export const SMALL_MODEL_DIR = join(BENCH_MODELS, "small");

/**
 * The generated model `name` under BENCH_MODELS (seed 0, so every bench and
 * every run has the same bytes), written on first use and loaded under the
 * execution variant "bench".
 */
export async function benchModel(
  name: string,
  gen: Pick<GenerateOptions, "preset" | "arch">,
  log: (l: string) => void,
): Promise<LoadedModel> {
  const dir = join(BENCH_MODELS, name);
  try {
    return await loadModelDir(dir, { variant: "bench" });
  } catch {
    log(`generating the ${gen.preset} preset${gen.arch ? ` as ${gen.arch}` : ""} into ${dir} (once)`);
    await generateModel({ ...gen, out: dir, seed: 0, force: true });
    return loadModelDir(dir, { variant: "bench" });
  }
}

/** The `small` preset under SMALL_MODEL_DIR. */
export const smallModel = (log: (l: string) => void): Promise<LoadedModel> =>
  benchModel("small", { preset: "small" }, log);
