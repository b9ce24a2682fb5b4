import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Engine } from "../../../native/engine.ts";
import { ropeInvFreq as nativeInvFreq } from "../../../native/model-spec.ts";
import { DecodeError, type Decoder, generate, type SequenceId } from "../../../worker/model/decoder.ts";
import { ContiguousDecoder } from "../../../worker/model/decoder-contiguous.ts";
import { PageAllocator, PagedDecoder } from "../../../worker/model/decoder-paged.ts";
import { nativeSpec, openEngine } from "../../../worker/model/engine.ts";
import { generateModel } from "../../../worker/model/generate.ts";
import { type LoadedModel, loadModelDir } from "../../../worker/model/model-dir.ts";
import { referenceForward } from "../../../worker/model/reference.ts";
import { specInvFreq } from "../../../worker/model/rope.ts";
import { argmax, initialSamplerState, samplingParams } from "../../../worker/model/sampling.ts";
import { CPU_VARIANT } from "../../../worker/model/variant.ts";
import { afterChunkedPrefill, allRows, maxDiff, promptOf, sameBits, shuffled } from "./model-helpers.ts";

/**
 * Exactness of the decoders on the generated tiny model (2 layers, GQA 4/2,
 * Llama-3 rope scaling).
 *
 * Bounds:
 *  - paged vs contiguous: identical greedy tokens; logits within PAGED_BOUND =
 *    1e-5 absolute (logits here are |x| < 16, so this is a few f32 ulps — the
 *    room a backend has to reorder a reduction; the CPU backend is in fact
 *    bit-identical).
 *  - batch composition and prefill chunking: bit-identical (the kernel
 *    contract's fixed reduction order).
 *  - float64 reference with K/V rounded to f16 as the pages hold them vs either
 *    decoder: REF_BOUND = 1e-3 absolute. f32 accumulation alone gives ≈ 2e-5
 *    here; the rest is f16 rounding flips: where the engine's f32 K/V and the
 *    reference's f64 K/V straddle a half-ulp boundary they round to adjacent
 *    f16 values (2^-11 relative apart), measured up to ≈ 2e-4 in the logits.
 */
const PAGED_BOUND = 1e-5;
const REF_BOUND = 1e-3;
const GREEDY = (n: number) => initialSamplerState(samplingParams({ maxTokens: n }));

let root: string;
let tiny: LoadedModel;
const engines: Engine[] = [];

async function engine(model: LoadedModel = tiny): Promise<Engine> {
  const e = await openEngine(model.config.spec, model.weights, { threads: 2 });
  engines.push(e);
  return e;
}

function prompt(len: number, seed: number): number[] {
  return promptOf(len, seed, tiny.config.spec.vocab);
}

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-dec-"));
  tiny = await loadModelDir((await generateModel({ preset: "tiny", out: join(root, "tiny") })).dir, {
    variant: CPU_VARIANT,
  });
});
afterAll(async () => {
  for (const e of engines) e.free();
  await rm(root, { recursive: true, force: true });
});

// Prompt lengths around both page sizes: mid-page, exactly on a boundary, one past.
const LENGTHS = [1, 5, 15, 16, 17, 31, 32, 33, 47, 64];

describe("paged decoder equals the contiguous oracle", () => {
  for (const pageSize of [16, 32]) {
    it(`page size ${pageSize}: same greedy tokens, logits within ${PAGED_BOUND}, batches 1..16, fragmented tables`, async () => {
      const contiguous = new ContiguousDecoder(await engine(), 16, 128);
      const alloc = new PageAllocator(256, shuffled(256, pageSize));
      const paged = new PagedDecoder(await engine(), alloc, pageSize, 16);
      let worst = 0;
      for (const batch of [1, 3, 16]) {
        const prompts = Array.from({ length: batch }, (_, i) =>
          prompt(LENGTHS[(i + batch) % LENGTHS.length]!, 100 * batch + i),
        );
        const samplers = prompts.map(() => GREEDY(6));
        const c = await generate(contiguous, prompts, samplers);
        const p = await generate(paged, prompts, samplers);
        for (let i = 0; i < batch; i++) {
          expect(p[i]!.tokens).toEqual(c[i]!.tokens);
          for (let k = 0; k < c[i]!.logits.length; k++)
            worst = Math.max(worst, maxDiff(p[i]!.logits[k]!, c[i]!.logits[k]!));
        }
      }
      expect(worst).toBeLessThanOrEqual(PAGED_BOUND);
      expect(alloc.freeCount).toBe(256);
    });
  }

  it("page tables really are fragmented and prompts end both mid-page and on a boundary", async () => {
    const paged = new PagedDecoder(await engine(), new PageAllocator(64, shuffled(64, 7)), 16, 4);
    const a = paged.open();
    const b = paged.open();
    await paged.step([
      { seq: a, tokens: prompt(32, 1) },
      { seq: b, tokens: prompt(17, 2) },
    ]);
    const ta = paged.pageTable(a);
    expect(ta).toHaveLength(2);
    expect(paged.pageTable(b)).toHaveLength(2);
    expect(Math.abs(ta[1]! - ta[0]!)).not.toBe(1);
    paged.close(a);
    paged.close(b);
  });
});

describe("batch invariance", () => {
  it("a request's logits are bit-identical alone or in any batch, on both decoders", async () => {
    const decoders: Decoder[] = [
      new ContiguousDecoder(await engine(), 16, 128),
      new PagedDecoder(await engine(), new PageAllocator(128, shuffled(128, 3)), 16, 16),
    ];
    const mine = prompt(21, 42);
    for (const d of decoders) {
      const [alone] = await generate(d, [mine], [GREEDY(5)]);
      for (const [batch, at] of [
        [4, 0],
        [9, 4],
        [16, 15],
      ] as const) {
        const prompts = Array.from({ length: batch }, (_, i) =>
          i === at ? mine : prompt(LENGTHS[i % LENGTHS.length]!, 900 + i),
        );
        const out = await generate(
          d,
          prompts,
          prompts.map(() => GREEDY(5)),
        );
        expect(out[at]!.tokens).toEqual(alone!.tokens);
        for (let k = 0; k < 5; k++) expect(sameBits(out[at]!.logits[k]!, alone!.logits[k]!)).toBe(true);
      }
    }
  });

  it("prefill chunk size does not change a bit of the result", async () => {
    const decoders: Decoder[] = [
      new ContiguousDecoder(await engine(), 4, 128),
      new PagedDecoder(await engine(), new PageAllocator(64, shuffled(64, 5)), 16, 4),
    ];
    const tokens = prompt(45, 77);
    for (const d of decoders) {
      const results = await afterChunkedPrefill(d, tokens, [45, 16, 7, 1]);
      for (const r of results.slice(1)) expect(sameBits(r, results[0]!)).toBe(true);
    }
  });
});

describe("float64 reference agreement", () => {
  it(`both decoders are within ${REF_BOUND} of the reference at every position`, async () => {
    const tokens = prompt(40, 11);
    const ref = referenceForward(tiny.config.spec, tiny.weights, tokens, { roundKvToF16: true });
    const decoders: Decoder[] = [
      new ContiguousDecoder(await engine(), 2, 64),
      new PagedDecoder(await engine(), new PageAllocator(8, shuffled(8, 9)), 16, 2),
    ];
    for (const d of decoders) {
      const rows = await allRows(d, tokens);
      let worst = 0;
      for (let t = 0; t < tokens.length; t++) {
        worst = Math.max(worst, maxDiff(rows[t]!, ref[t]!));
        expect(argmax(rows[t]!)).toBe(argmax(ref[t]!));
      }
      expect(worst).toBeLessThan(REF_BOUND);
    }
  });

  it("holds for Qwen2-style biases and a tied lm_head too", async () => {
    for (const opts of [{ arch: "qwen2" as const }, { tiedEmbeddings: true }]) {
      const name = Object.keys(opts)[0]!;
      const model = await loadModelDir(
        (await generateModel({ preset: "tiny", out: join(root, name), ...opts })).dir,
        {
          variant: "test",
        },
      );
      const tokens = prompt(20, 5);
      const ref = referenceForward(model.config.spec, model.weights, tokens, { roundKvToF16: true });
      const rows = await allRows(new PagedDecoder(await engine(model), new PageAllocator(4), 16, 1), tokens);
      for (let t = 0; t < tokens.length; t++) expect(maxDiff(rows[t]!, ref[t]!)).toBeLessThan(REF_BOUND);
    }
  });
});

describe("rope frequencies", () => {
  it("the engine's f32 inv_freq is the reference's f64 one rounded once, with Llama-3 scaling", () => {
    const spec = { ...tiny.config.spec, headDim: 128, ropeTheta: 500000 };
    for (const s of [spec, { ...spec, ropeScaling: undefined }, tiny.config.spec]) {
      const mine = specInvFreq(s);
      const theirs = nativeInvFreq(nativeSpec(s));
      expect([...theirs]).toEqual([...mine].map(Math.fround));
    }
  });
});

describe("bad work changes nothing", () => {
  it("rejects bad tokens, duplicate sequences and exhausted pages, leaving lengths and pages as they were", async () => {
    const alloc = new PageAllocator(2);
    const paged = new PagedDecoder(await engine(), alloc, 16, 4);
    const a = paged.open();
    await paged.step([{ seq: a, tokens: prompt(20, 1) }]);
    expect(alloc.freeCount).toBe(0);
    await expect(paged.step([{ seq: a, tokens: [tiny.config.spec.vocab] }])).rejects.toThrow(
      /outside the vocabulary/,
    );
    await expect(
      paged.step([
        { seq: a, tokens: [1] },
        { seq: a, tokens: [2] },
      ]),
    ).rejects.toThrow(/appears twice/);
    const b = paged.open();
    await expect(paged.step([{ seq: b, tokens: prompt(5, 2) }])).rejects.toThrow(DecodeError);
    expect(paged.length(a)).toBe(20);
    expect(paged.length(b)).toBe(0);
    expect(paged.pageTable(b)).toEqual([]);
    paged.close(b);
    paged.close(a);
    expect(alloc.freeCount).toBe(2);
    expect(() => paged.length(99 as SequenceId)).toThrow(/not open/);
  });
});
