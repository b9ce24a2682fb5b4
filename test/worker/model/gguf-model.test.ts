import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Engine } from "../../../native/index.ts";
import { type Decoder, generate } from "../../../worker/model/decoder.ts";
import { ContiguousDecoder } from "../../../worker/model/decoder-contiguous.ts";
import { PageAllocator, PagedDecoder } from "../../../worker/model/decoder-paged.ts";
import { decodeValues, encodeValues } from "../../../worker/model/dtype.ts";
import { openEngine } from "../../../worker/model/engine.ts";
import { type QuantScheme, quantizeModelDir } from "../../../worker/model/gguf-quantize.ts";
import { type LoadedModel, loadModelDir, loadModelIdentity } from "../../../worker/model/model-dir.ts";
import { Rng, seedRng } from "../../../worker/model/prng.ts";
import { referenceForward } from "../../../worker/model/reference.ts";
import type { LoadedTensor } from "../../../worker/model/safetensors.ts";
import { initialSamplerState, samplingParams } from "../../../worker/model/sampling.ts";
import { assemble } from "../../../worker/model/weights.ts";
import { writeBlockModel } from "./gguf-fixture.ts";

/**
 * A quantized model end to end, for each scheme (q8_0, q4_0, q4_k_m: every
 * block type): quantize → GGUF → load → generate.
 *
 * Bounds:
 *  - against the f32 engine on the dequantized weights: bit-identical logits
 *    (the quantized GEMM is the f32 GEMM of the exact dequantized values);
 *  - paged vs contiguous, and a prompt alone vs in a batch: bit-identical;
 *  - against the float64 reference forward on the dequantized weights (K/V
 *    rounded to f16 as the pages hold them): the same greedy ids, logits
 *    within REF_BOUND = 1e-3 absolute, the bound of the f32 model tests
 *    (decoders.test.ts: f32 accumulation ≈ 2e-5, the rest f16 K/V rounding
 *    flips); quantization changes the weights, not the arithmetic on them.
 */
const REF_BOUND = 1e-3;
const VARIANT = "cpu-f32acc/v1";
const SCHEMES: QuantScheme[] = ["q8_0", "q4_0", "q4_k_m"];

let root: string;
let hfDir: string;
const models = new Map<QuantScheme, LoadedModel>();
const engines: Engine[] = [];

async function engineOf(m: LoadedModel, tensors = m.weights): Promise<Engine> {
  const e = await openEngine(m.config.spec, tensors, { threads: 2 });
  engines.push(e);
  return e;
}

/** The same model with every tensor dequantized to F32 (exactly). */
function dequantized(m: LoadedModel) {
  const tensors = new Map<string, LoadedTensor>();
  for (const [name, t] of m.weights.tensors)
    tensors.set(name, { ...t, dtype: "F32", data: encodeValues(decodeValues(t.data, t.dtype), "F32") });
  return assemble(tensors, m.config.spec);
}

function prompt(len: number, seed: number, vocab: number): number[] {
  const rng = new Rng(seedRng(seed, "gguf-prompt"));
  return Array.from({ length: len }, () => rng.nextU32() % vocab);
}

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
const GREEDY = (n: number) => initialSamplerState(samplingParams({ maxTokens: n }));

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-ggufm-"));
  hfDir = await writeBlockModel(join(root, "hf"));
  for (const s of SCHEMES) {
    const file = join(root, `m-${s}.gguf`);
    await quantizeModelDir(hfDir, file, s);
    models.set(s, await loadModelDir(file, { variant: VARIANT }));
  }
}, 180_000);
afterAll(async () => {
  for (const e of engines) e.free();
  await rm(root, { recursive: true, force: true });
});

describe("a quantized GGUF model", () => {
  it("stores the scheme's types, and its fingerprint names the format (and differs from the bf16 model's)", async () => {
    const bf16 = await loadModelIdentity(hfDir, { variant: VARIANT });
    expect(bf16.manifest.weightFormat).toBeUndefined();
    expect(models.get("q8_0")!.manifest.weightFormat).toBe("f32+q8_0");
    expect(models.get("q4_0")!.manifest.weightFormat).toBe("f32+q4_0+q6_k");
    expect(models.get("q4_k_m")!.manifest.weightFormat).toBe("f32+q4_k+q6_k");
    const fps = new Set([bf16.fingerprint, ...[...models.values()].map((m) => m.fingerprint)]);
    expect(fps.size).toBe(4);
    // The controller's streamed identity equals the worker's full load.
    for (const s of SCHEMES) {
      const id = await loadModelIdentity(join(root, `m-${s}.gguf`), { variant: VARIANT });
      expect(id.fingerprint).toBe(models.get(s)!.fingerprint);
    }
  });

  for (const s of SCHEMES) {
    it(`${s}: logits equal the f32 engine on the dequantized weights bit for bit; greedy ids and logits match the float64 reference`, async () => {
      const m = models.get(s)!;
      const spec = m.config.spec;
      const quant = new ContiguousDecoder(await engineOf(m), 4, 64);
      const f32 = new ContiguousDecoder(await engineOf(m, dequantized(m)), 4, 64);
      const p = prompt(11, 1, spec.vocab);
      const [a] = await generate(quant, [p], [GREEDY(6)]);
      const [b] = await generate(f32, [p], [GREEDY(6)]);
      expect(a!.tokens).toEqual(b!.tokens);
      for (let i = 0; i < a!.logits.length; i++)
        expect(bits(a!.logits[i]!).equals(bits(b!.logits[i]!))).toBe(true);
      const seqTokens = [...p, ...a!.tokens.slice(0, -1)];
      const ref = referenceForward(spec, m.weights, seqTokens, { roundKvToF16: true });
      let worst = 0;
      for (let i = 0; i < a!.tokens.length; i++) {
        const row = ref[p.length - 1 + i]!;
        let best = 0;
        for (let v = 1; v < row.length; v++) if (row[v]! > row[best]!) best = v;
        expect(a!.tokens[i]).toBe(best);
        for (let v = 0; v < row.length; v++) worst = Math.max(worst, Math.abs(row[v]! - a!.logits[i]![v]!));
      }
      expect(worst).toBeLessThan(REF_BOUND);
    }, 120_000);
  }

  it("q4_k_m: paged equals contiguous and a prompt gives the same bits alone or in a batch", async () => {
    const m = models.get("q4_k_m")!;
    const e = await engineOf(m);
    const decoders: Decoder[] = [
      new ContiguousDecoder(e, 4, 64),
      new PagedDecoder(e, new PageAllocator(64), 16, 4),
    ];
    const prompts = [
      prompt(17, 2, m.config.spec.vocab),
      prompt(5, 3, m.config.spec.vocab),
      prompt(33, 4, m.config.spec.vocab),
    ];
    const runs = [];
    for (const d of decoders) {
      const alone = await generate(d, [prompts[0]!], [GREEDY(5)]);
      const batch = await generate(
        d,
        prompts,
        prompts.map(() => GREEDY(5)),
      );
      runs.push(alone[0]!, batch[0]!);
    }
    for (const r of runs.slice(1)) {
      expect(r.tokens).toEqual(runs[0]!.tokens);
      for (let i = 0; i < r.logits.length; i++)
        expect(bits(r.logits[i]!).equals(bits(runs[0]!.logits[i]!))).toBe(true);
    }
  }, 120_000);

  it("its tokenizer, read from the GGUF metadata, encodes and decodes like the model's tokenizer.json", async () => {
    const hf = await loadModelIdentity(hfDir, { variant: VARIANT });
    const g = models.get("q8_0")!;
    const text = "Once upon a time, <|im_start|>user\nnaïve café 123 ünïcödé!<|im_end|>";
    expect(g.tokenizer.encode(text)).toEqual(hf.tokenizer.encode(text));
    expect(g.tokenizer.encode(text, { addSpecialTokens: true })).toEqual(
      hf.tokenizer.encode(text, { addSpecialTokens: true }),
    );
    const ids = hf.tokenizer.encode(text);
    expect(g.tokenizer.decode(ids)).toBe(hf.tokenizer.decode(ids));
    expect(g.tokenizer.chatFormat).toBe(hf.tokenizer.chatFormat);
    expect(g.eosTokenIds).toEqual(hf.eosTokenIds);
    expect(g.config.bosTokenId).toBe(hf.config.bosTokenId);
    expect(g.config.spec).toEqual(hf.config.spec);
  });
});
