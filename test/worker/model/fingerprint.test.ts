import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
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
    ["bf16, qwen2 biases", { dtype: "BF16" as const, qwen2: true }],
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
