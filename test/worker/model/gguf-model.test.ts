import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Engine } from "../../../native/engine.ts";
import { type Decoder, generate } from "../../../worker/model/decoder.ts";
import { ContiguousDecoder } from "../../../worker/model/decoder-contiguous.ts";
import { PageAllocator, PagedDecoder } from "../../../worker/model/decoder-paged.ts";
import { openEngine } from "../../../worker/model/engine.ts";
import { type QuantScheme, quantizeModelDir } from "../../../worker/model/gguf-quantize.ts";
import { type LoadedModel, loadModelDir, loadModelIdentity } from "../../../worker/model/model-dir.ts";
import { Rng, seedRng } from "../../../worker/model/prng.ts";
import { initialSamplerState, samplingParams } from "../../../worker/model/sampling.ts";
import { dequantized, expectReferenceGreedy, writeBlockModel } from "./gguf-fixture.ts";

/**
 * A quantized model end to end, for each scheme (q8_0, q4_0, q4_k_m: every
 * block type): quantize → GGUF → load → generate.
 *
 * Bounds (every block-format product rounds its inputs to int8 blocks,
 * native/src/quant_dot.h):
 *  - against the float64 reference forward on the dequantized weights with
 *    the same int8 activation grid (reference.ts int8Activations; K/V
 *    rounded to f16 as the pages hold them): the same greedy ids, logits
 *    within GRID_BOUND = 0.25 absolute over the 6 steps (measured 0.043
 *    q8_0, 0.13 q4_0, 0.076 q4_k_m, on logits up to ~6; at the prompt's
 *    last row alone 8e-7 for q8_0). Not the f32 models' 1e-3: the grid is
 *    a step function, and the last-ulp differences between the f32 engine
 *    and the f64 reference round some inputs to the neighbouring step
 *    (each a whole d = amax/127 of their block), most where a block holds
 *    few distinct levels (q4_0's 16-level embedding rows after the norm);
 *  - against the f32 engine on the dequantized weights: first logits within
 *    ACT_BOUND = 0.25 and not equal (the activation rounding, ≤ d/2 per
 *    value; measured 0.09–0.11);
 *  - paged vs contiguous, and a prompt alone vs in a batch: bit-identical.
 */
const GRID_BOUND = 0.25;
const ACT_BOUND = 0.25;
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
    expect(models.get("q8_0")!.manifest.weightFormat).toBe("f32+q8_0/int8-dot");
    expect(models.get("q4_0")!.manifest.weightFormat).toBe("f32+q4_0+q6_k/int8-dot");
    expect(models.get("q4_k_m")!.manifest.weightFormat).toBe("f32+q4_k+q6_k/int8-dot");
    const fps = new Set([bf16.fingerprint, ...[...models.values()].map((m) => m.fingerprint)]);
    expect(fps.size).toBe(4);
    // The controller's streamed identity equals the worker's full load.
    for (const s of SCHEMES) {
      const id = await loadModelIdentity(join(root, `m-${s}.gguf`), { variant: VARIANT });
      expect(id.fingerprint).toBe(models.get(s)!.fingerprint);
    }
  });

  for (const s of SCHEMES) {
    it(`${s}: greedy ids and logits match the float64 reference of its int8 activations, and the f32 engine on the dequantized weights within the activation rounding`, async () => {
      const m = models.get(s)!;
      const spec = m.config.spec;
      const quant = new ContiguousDecoder(await engineOf(m), 4, 64);
      const f32 = new ContiguousDecoder(await engineOf(m, dequantized(m)), 4, 64);
      const p = prompt(11, 1, spec.vocab);
      const [a] = await generate(quant, [p], [GREEDY(6)]);
      const [b] = await generate(f32, [p], [GREEDY(6)]);
      expectReferenceGreedy(spec, m.weights, p, a!, GRID_BOUND, {
        int8Activations: true,
      });
      // The f32 engine on the same weights: the first logits within
      // ACT_BOUND, and not equal (the activation rounding is real).
      let worst = 0;
      for (let v = 0; v < spec.vocab; v++)
        worst = Math.max(worst, Math.abs(a!.logits[0]![v]! - b!.logits[0]![v]!));
      expect(worst).toBeLessThan(ACT_BOUND);
      expect(worst).toBeGreaterThan(0);
    }, 120_000);
  }

  for (const s of ["q4_0", "q4_k_m"] as const)
    it(`${s}: paged equals contiguous and a prompt gives the same bits alone or in a batch`, async () => {
      const m = models.get(s)!;
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
    expect(g.tokenizer.chatTemplates).toEqual(hf.tokenizer.chatTemplates);
    expect(g.eosTokenIds).toEqual(hf.eosTokenIds);
    expect(g.config.bosTokenId).toBe(hf.config.bosTokenId);
    expect(g.config.spec).toEqual(hf.config.spec);
  });
});
