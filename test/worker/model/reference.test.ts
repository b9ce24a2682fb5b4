import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateModel } from "../../../worker/model/generate.ts";
import { type LoadedModel, loadModelDir } from "../../../worker/model/model-dir.ts";
import { referenceForward } from "../../../worker/model/reference.ts";
import { argmax } from "../../../worker/model/sampling.ts";

let root: string;
let tiny: LoadedModel;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-ref-"));
  tiny = await loadModelDir((await generateModel({ preset: "tiny", out: join(root, "tiny") })).dir, {
    variant: "test",
  });
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});

describe("reference forward", () => {
  it("is causal: a prefix's rows are bit-identical however many tokens follow", () => {
    const ids = tiny.tokenizer.encode("The river starts as a thin line of water.", {
      addSpecialTokens: true,
    });
    const full = referenceForward(tiny.config.spec, tiny.weights, ids);
    for (const cut of [1, 3, ids.length - 1]) {
      const part = referenceForward(tiny.config.spec, tiny.weights, ids.slice(0, cut));
      for (let t = 0; t < cut; t++) expect(part[t]).toEqual(full[t]);
    }
    // And a later token does change later rows (attention is not ignoring context).
    const other = [...ids];
    other[1] = (other[1]! + 1) % 256;
    const changed = referenceForward(tiny.config.spec, tiny.weights, other);
    expect(changed[0]).toEqual(full[0]);
    expect(changed[ids.length - 1]).not.toEqual(full[ids.length - 1]);
  });

  it("gives finite, non-degenerate logits of vocab width", () => {
    const rows = referenceForward(tiny.config.spec, tiny.weights, [1, 2, 3, 4]);
    expect(rows).toHaveLength(4);
    for (const r of rows) {
      expect(r).toHaveLength(tiny.config.spec.vocab);
      expect(r.every(Number.isFinite)).toBe(true);
      const mean = r.reduce((a, b) => a + b, 0) / r.length;
      const sd = Math.sqrt(r.reduce((a, b) => a + (b - mean) ** 2, 0) / r.length);
      expect(sd).toBeGreaterThan(0.5);
      expect(sd).toBeLessThan(10);
    }
    expect(new Set(rows.map((r) => argmax(r))).size).toBeGreaterThan(1);
  });

  it("rounding K/V to fp16 moves logits only by fp16-sized amounts", () => {
    const ids = [5, 80, 300, 17, 42, 99];
    const exact = referenceForward(tiny.config.spec, tiny.weights, ids);
    const rounded = referenceForward(tiny.config.spec, tiny.weights, ids, { roundKvToF16: true });
    let maxDiff = 0;
    for (let t = 0; t < ids.length; t++)
      for (let i = 0; i < exact[t]!.length; i++)
        maxDiff = Math.max(maxDiff, Math.abs(exact[t]![i]! - rounded[t]![i]!));
    expect(maxDiff).toBeGreaterThan(0);
    expect(maxDiff).toBeLessThan(1e-2);
  });

  it("uses Qwen2's q/k/v biases and a tied lm_head", async () => {
    const qwen = await loadModelDir(
      (await generateModel({ preset: "tiny", out: join(root, "q"), arch: "qwen2" as const })).dir,
      {
        variant: "test",
      },
    );
    const ids = [3, 1, 4, 1, 5];
    const withBias = referenceForward(qwen.config.spec, qwen.weights, ids);
    const noBiasSpec = { ...qwen.config.spec, attentionBias: false };
    // The reference reads the checkpoint's tensors by name: without the bias tensors.
    const stripped = {
      ...qwen.weights,
      tensors: new Map([...qwen.weights.tensors].filter(([name]) => !name.endsWith(".bias"))),
    };
    expect(referenceForward(noBiasSpec, stripped, ids)[4]).not.toEqual(withBias[4]);
    const tied = await loadModelDir(
      (await generateModel({ preset: "tiny", out: join(root, "t"), tiedEmbeddings: true })).dir,
      { variant: "test" },
    );
    // With a tied head, logits are the final hidden state dotted with the embedding rows.
    expect(referenceForward(tied.config.spec, tied.weights, ids)[0]).toHaveLength(tied.config.spec.vocab);
  });

  it("rejects tokens outside the vocabulary", () => {
    expect(() => referenceForward(tiny.config.spec, tiny.weights, [0, 512])).toThrow(/tokens\[1\] = 512/);
  });
});
