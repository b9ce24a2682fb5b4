import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CPU_VARIANT, engineMatchesVariant } from "../../../cli/embedded/model.ts";
import { streamWeightsDigest, weightsDigest } from "../../../worker/model/fingerprint.ts";
import { generateModel } from "../../../worker/model/generate.ts";
import { loadModelDir, loadModelIdentity } from "../../../worker/model/model-dir.ts";
import { SafetensorsCheckpoint } from "../../../worker/model/safetensors.ts";

/**
 * The controller's model identity (config, tokenizer, fingerprint) read
 * without holding the weights: the streamed digest must equal the loaded
 * one bit for bit, or controller and workers would disagree on every chunk.
 */

let root: string;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-identity-"));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

describe("the model identity without weights", () => {
  for (const [name, opts] of [
    ["f32", {}],
    ["f16, tied embeddings", { dtype: "F16" as const, tiedEmbeddings: true }],
    ["bf16, qwen2 biases", { dtype: "BF16" as const, arch: "qwen2" as const }],
  ] as const) {
    it(`has the full load's fingerprint and manifest (${name})`, async () => {
      const dir = (
        await generateModel({ preset: "tiny", out: join(root, name.replace(/\W+/g, "-")), ...opts })
      ).dir;
      const full = await loadModelDir(dir, { variant: "v" });
      const id = await loadModelIdentity(dir, { variant: "v" });
      expect(id.fingerprint).toBe(full.fingerprint);
      expect(id.manifest).toEqual(full.manifest);
      expect(id.eosTokenIds).toEqual(full.eosTokenIds);
      expect(id.tokenizer.encode("the river ran")).toEqual(full.tokenizer.encode("the river ran"));
      expect("weights" in id).toBe(false);
    });
  }

  it("streams in spans of any size, including spans that split tensors and elements", async () => {
    const dir = join(root, "f32");
    const full = await loadModelDir(dir, { variant: "v" });
    const ckpt = await SafetensorsCheckpoint.open(dir);
    const names = [...full.weights.tensors.keys()];
    const want = weightsDigest(full.weights.tensors.values());
    for (const span of [4093, 1000, 1 << 20]) expect(await streamWeightsDigest(ckpt, names, span)).toBe(want);
    await expect(streamWeightsDigest(ckpt, names, 0)).rejects.toThrow("span must be a positive");
  });

  it("checks the checkpoint against config.json like a full load", async () => {
    const dir = (await generateModel({ preset: "tiny", out: join(root, "bad") })).dir;
    const config = JSON.parse(await readFile(join(dir, "config.json"), "utf8"));
    await writeFile(
      join(dir, "config.json"),
      JSON.stringify({ ...config, intermediate_size: config.intermediate_size * 2 }),
    );
    await expect(loadModelIdentity(dir, { variant: "v" })).rejects.toThrow(
      /has shape .*config\.json implies/,
    );
  });
});

describe("durable reuse and the engine's numerics", () => {
  it("is allowed only where the engine computes the fingerprint's execution variant", async () => {
    const dir = (await generateModel({ preset: "tiny", out: join(root, "variant") })).dir;
    const m = await loadModelIdentity(dir, { variant: CPU_VARIANT });
    expect(engineMatchesVariant("cpu", m.manifest.variant)).toBe(true);
    // The CUDA engine's K/V are not the CPU's bit for bit: never published or restored as them.
    expect(engineMatchesVariant("cuda", m.manifest.variant)).toBe(false);
    expect(engineMatchesVariant("cpu", "cpu-f32acc/v0")).toBe(false);
    // The variant is part of the fingerprint: another variant names other chunks.
    const other = await loadModelIdentity(dir, { variant: "cuda-mma/v1" });
    expect(other.fingerprint).not.toBe(m.fingerprint);
  });
});
