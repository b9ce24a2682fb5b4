import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fingerprintOf, streamWeightsDigest, weightsDigest } from "../../../worker/model/fingerprint.ts";
import { generateModel } from "../../../worker/model/generate.ts";
import type { Arch } from "../../../worker/model/generate-arch.ts";
import { GLOBAL_LAYER } from "../../../worker/model/layout.ts";
import { loadModelDir, loadModelIdentity } from "../../../worker/model/model-dir.ts";
import { SafetensorsCheckpoint } from "../../../worker/model/safetensors.ts";
import { CPU_VARIANT } from "../../../worker/model/variant.ts";

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

describe("families and layouts in the fingerprint", () => {
  // Fingerprints of generated tiny models (seed 0, cpu-f32acc/v1), recorded at
  // kv-gqa/v2 (chunk format v2): families and layouts leave an all-global
  // model's identity alone, so it changes only when the layout version does.
  it.each([
    ["llama", {}, "cfdd1a055b1ab8a88990096d4b7fe01aef4d2c282cafc4b2284cf86f1de5ac6c"],
    ["qwen2", { arch: "qwen2" as Arch }, "f14eebf92043cf1e7c8f1f860846e6dbdaa85b6ab1361287537bbf36ed8a0304"],
    [
      "tied f16",
      { tiedEmbeddings: true, dtype: "F16" as const },
      "0374d29658f5f5136f45b944c4359be09427220319f13c94c2e419f1db57fea0",
    ],
  ])("an all-global %s model keeps its recorded fingerprint", async (name, opts, golden) => {
    const dir = (await generateModel({ preset: "tiny", out: join(root, `golden-${name}`), seed: 0, ...opts }))
      .dir;
    const m = await loadModelIdentity(dir, { variant: CPU_VARIANT });
    expect(m.manifest.layout).toBe("kv-gqa/v2");
    expect(m.fingerprint).toBe(golden);
  });

  it("names the sliding layers in the layout, and the layout and family fields change the fingerprint", async () => {
    const dir = (await generateModel({ preset: "tiny", out: join(root, "gemma2"), arch: "gemma2" })).dir;
    const m = await loadModelDir(dir, { variant: CPU_VARIANT });
    expect(m.manifest.layout).toBe("kv-gqa/v2;layers=s24,g");
    expect(m.manifest.architecture).toMatchObject({
      family: "gemma2",
      normOffset: true,
      sandwichNorms: true,
      activation: "gelu_tanh",
      attnSoftcap: 3,
      finalSoftcap: 6,
    });
    const spec = m.config.spec;
    const tensors = [...m.weights.tensors.values()];
    const fp = (s: typeof spec) => fingerprintOf(s, tensors, CPU_VARIANT);
    expect(fp(spec)).toBe(m.fingerprint);
    // The same weights attending globally, or with another window, or another soft-cap: other models.
    const others = [
      { ...spec, layers: spec.layers.map(() => GLOBAL_LAYER) },
      { ...spec, layers: [{ kind: "sliding" as const, window: 25 }, GLOBAL_LAYER] },
      { ...spec, attnSoftcap: 4 },
      { ...spec, finalSoftcap: null },
    ];
    expect(new Set([m.fingerprint, ...others.map(fp)]).size).toBe(others.length + 1);
  });
});
