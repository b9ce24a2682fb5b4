import { execFile } from "node:child_process";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateModel } from "../../../worker/model/generate.ts";
import { ARCHS } from "../../../worker/model/generate-arch.ts";
import { loadModelDir } from "../../../worker/model/model-dir.ts";
import { CPU_VARIANT } from "../../../worker/model/variant.ts";

const run = promisify(execFile);
const VARIANT = CPU_VARIANT;
let root: string;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-gen-"));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

async function filesOf(dir: string): Promise<Map<string, Buffer>> {
  const out = new Map<string, Buffer>();
  for (const f of (await readdir(dir)).sort()) out.set(f, await readFile(join(dir, f)));
  return out;
}

describe("generated models", () => {
  it("are byte-identical for the same seed and differ in weights (only) for another seed", async () => {
    const a = await generateModel({ preset: "tiny", out: join(root, "a"), seed: 7 });
    const b = await generateModel({ preset: "tiny", out: join(root, "b"), seed: 7 });
    const c = await generateModel({ preset: "tiny", out: join(root, "c"), seed: 8 });
    const fa = await filesOf(a.dir);
    const fb = await filesOf(b.dir);
    const fc = await filesOf(c.dir);
    expect([...fa.keys()]).toEqual([
      "config.json",
      "generation_config.json",
      "model.safetensors",
      "tokenizer.json",
      "tokenizer_config.json",
    ]);
    for (const [f, bytes] of fa) expect(Buffer.compare(bytes, fb.get(f)!), f).toBe(0);
    expect(Buffer.compare(fa.get("model.safetensors")!, fc.get("model.safetensors")!)).not.toBe(0);
    expect(Buffer.compare(fa.get("tokenizer.json")!, fc.get("tokenizer.json")!)).toBe(0);
    const [ma, mb, mc] = await Promise.all([a, b, c].map((g) => loadModelDir(g.dir, { variant: VARIANT })));
    expect(ma!.fingerprint).toBe(mb!.fingerprint);
    expect(mc!.fingerprint).not.toBe(ma!.fingerprint);
    expect(mc!.manifest.architecture).toEqual(ma!.manifest.architecture);
    // The variant is part of the identity.
    expect((await loadModelDir(a.dir, { variant: "cuda/v1" })).fingerprint).not.toBe(ma!.fingerprint);
  });

  it("load like any Hugging Face checkpoint in each dtype, tied or Qwen2-style", async () => {
    for (const dtype of ["F16", "BF16"] as const) {
      const g = await generateModel({ preset: "tiny", out: join(root, `d-${dtype}`), dtype });
      const m = await loadModelDir(g.dir, { variant: VARIANT });
      expect(new Set([...m.weights.tensors.values()].map((t) => t.dtype))).toEqual(new Set([dtype]));
      expect(m.config.torchDtype).toBe(dtype === "F16" ? "float16" : "bfloat16");
    }
    const tied = await loadModelDir(
      (await generateModel({ preset: "tiny", out: join(root, "tied"), tiedEmbeddings: true })).dir,
      { variant: VARIANT },
    );
    expect(tied.weights.tensors.has("lm_head.weight")).toBe(false);
    expect(tied.weights.lmHead).toBe(tied.weights.embed);
    const qwen = await loadModelDir(
      (await generateModel({ preset: "tiny", out: join(root, "qwen"), arch: "qwen2" as const })).dir,
      { variant: VARIANT },
    );
    expect(qwen.config.architecture).toBe("Qwen2ForCausalLM");
    expect(qwen.weights.layers[0]!.qBias?.shape).toEqual([64]);
    expect(qwen.eosTokenIds).toHaveLength(2);
  });

  it("write every architecture with its family's config keys and checkpoint names, deterministically", async () => {
    const archOf = {
      llama: "LlamaForCausalLM",
      qwen2: "Qwen2ForCausalLM",
      "mistral-sw": "MistralForCausalLM",
      qwen3: "Qwen3ForCausalLM",
      gemma2: "Gemma2ForCausalLM",
      gemma3: "Gemma3ForCausalLM",
      phi3: "Phi3ForCausalLM",
    } as const;
    for (const arch of ARCHS) {
      const a = await generateModel({ preset: "tiny", arch, out: join(root, `arch-${arch}`), seed: 2 });
      const b = await generateModel({ preset: "tiny", arch, out: join(root, `arch-${arch}-again`), seed: 2 });
      const fa = await filesOf(a.dir);
      for (const [f, bytes] of await filesOf(b.dir))
        expect(Buffer.compare(bytes, fa.get(f)!), `${arch} ${f}`).toBe(0);
      const cfg = JSON.parse(fa.get("config.json")!.toString("utf8"));
      expect(cfg.architectures).toEqual([archOf[arch]]);
      const m = await loadModelDir(a.dir, { variant: VARIANT });
      const names = [...m.weights.tensors.keys()];
      const has = (suffix: string) => names.some((n) => n.endsWith(suffix));
      expect(has("self_attn.qkv_proj.weight") && has("mlp.gate_up_proj.weight"), arch).toBe(arch === "phi3");
      expect(has("self_attn.q_proj.weight"), arch).toBe(arch !== "phi3");
      expect(has("self_attn.q_norm.weight"), arch).toBe(arch === "qwen3" || arch === "gemma3");
      expect(has("pre_feedforward_layernorm.weight"), arch).toBe(arch.startsWith("gemma"));
      expect(
        m.config.spec.layers.some((l) => l.kind === "sliding"),
        arch,
      ).toBe(["mistral-sw", "gemma2", "gemma3", "phi3"].includes(arch));
    }
    const phi = JSON.parse(await readFile(join(root, "arch-phi3", "config.json"), "utf8"));
    expect(phi.rope_scaling.type).toBe("longrope");
    expect(phi.original_max_position_embeddings).toBe(128);
  });

  it("refuse a non-empty directory and leave it untouched", async () => {
    const dir = join(root, "occupied");
    await generateModel({ preset: "tiny", out: dir });
    await writeFile(join(dir, "notes.txt"), "mine");
    const before = await filesOf(dir);
    await expect(generateModel({ preset: "tiny", out: dir, seed: 3 })).rejects.toThrow(/not empty/);
    expect(await filesOf(dir)).toEqual(before);
    await generateModel({ preset: "tiny", out: dir, seed: 3, force: true });
    expect(await readFile(join(dir, "notes.txt"), "utf8")).toBe("mine");
    expect(
      Buffer.compare((await filesOf(dir)).get("model.safetensors")!, before.get("model.safetensors")!),
    ).not.toBe(0);
  });

  it("reject a checkpoint that disagrees with its config, naming the tensor", async () => {
    const dir = (await generateModel({ preset: "tiny", out: join(root, "bad") })).dir;
    const cfg = JSON.parse(await readFile(join(dir, "config.json"), "utf8"));
    await writeFile(join(dir, "config.json"), JSON.stringify({ ...cfg, intermediate_size: 96 }));
    await expect(loadModelDir(dir, { variant: VARIANT })).rejects.toThrow(
      /model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[128, 64\], config\.json implies \[96, 64\]/,
    );
    await writeFile(join(dir, "config.json"), JSON.stringify({ ...cfg, num_hidden_layers: 3 }));
    await expect(loadModelDir(dir, { variant: VARIANT })).rejects.toThrow(
      /missing tensor 'model\.layers\.2\./,
    );
    await writeFile(join(dir, "config.json"), JSON.stringify({ ...cfg, num_hidden_layers: 1 }));
    await expect(loadModelDir(dir, { variant: VARIANT })).rejects.toThrow(
      /unexpected tensor 'model\.layers\.1\./,
    );
  });

  it("come from the real `continuum model init` and `model info` commands", async () => {
    const dir = join(root, "cli");
    const bin = join(process.cwd(), "bin", "continuum.mjs");
    await run(process.execPath, [bin, "model", "init", "--preset", "tiny", "--out", dir, "--seed", "5"]);
    const g3 = join(root, "cli-gemma3");
    await run(process.execPath, [bin, "model", "init", "--preset", "tiny", "--arch", "gemma3", "--out", g3]);
    const g3info = JSON.parse((await run(process.execPath, [bin, "model", "info", g3, "--json"])).stdout);
    expect(g3info.architecture).toBe("Gemma3ForCausalLM");
    expect(g3info.manifest.layout).toBe("kv-gqa/v2;layers=s24x5,g");
    const { stdout } = await run(process.execPath, [bin, "model", "info", dir, "--json"]);
    const info = JSON.parse(stdout.trim().split("\n").at(-1)!);
    const m = await loadModelDir(dir, { variant: VARIANT });
    expect(info.fingerprint).toBe(m.fingerprint);
    expect(info.spec.nLayers).toBe(2);
    const bad = await run(process.execPath, [bin, "model", "init", "--preset", "huge", "--out", dir]).catch(
      (e: { code: number; stderr: string }) => e,
    );
    expect(bad).toMatchObject({ code: 2 });
    expect((bad as { stderr: string }).stderr).toMatch(/--preset must be one of tiny, small, bench/);
  });
});
