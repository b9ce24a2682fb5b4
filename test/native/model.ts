/**
 * A small random Llama-family model for engine tests, and a float64 forward
 * pass over it written from the architecture (not from the C++), keeping K/V
 * rounded to fp16 as the engine's pages do.
 */
import { type ModelSpec, ropeInvFreq } from "../../native/model-spec.ts";
import { type WeightTensor, weightNames } from "../../native/weights.ts";
import { encodeWeights, f16BitsRef, f16ValueRef, randomF32, rng } from "./reference.ts";

export interface TestModel {
  readonly spec: ModelSpec;
  readonly weights: Map<string, WeightTensor>;
  /** The values the engine sees (after storage rounding), as float64. */
  readonly decoded: Map<string, Float64Array>;
}

export function makeModel(spec: ModelSpec, seed: number): TestModel {
  const r = rng(seed);
  const dtypes = ["bf16", "f16", "f32"] as const;
  const weights = new Map<string, WeightTensor>();
  const decoded = new Map<string, Float64Array>();
  weightNames(spec).forEach(({ name, shape }, i) => {
    const n = shape.reduce((a, b) => a * b, 1);
    const isNorm = name.endsWith("norm.weight");
    const fan = shape[shape.length - 1]!;
    const vals = isNorm
      ? randomF32(r, n, 0.2).map((v) => 1 + v)
      : randomF32(r, n, shape.length === 1 ? 0.1 : 1.7 / Math.sqrt(fan));
    const dtype = dtypes[i % 3]!;
    const enc = encodeWeights(vals, dtype);
    weights.set(name, { dtype, shape, data: enc.bytes });
    decoded.set(name, enc.decoded);
  });
  return { spec, weights, decoded };
}

const f16round = (x: number) => f16ValueRef(f16BitsRef(x));

function linear(x: Float64Array, w: Float64Array, N: number, bias?: Float64Array): Float64Array {
  const K = x.length;
  const y = new Float64Array(N);
  for (let n = 0; n < N; n++) {
    let s = 0;
    for (let k = 0; k < K; k++) s += x[k]! * w[n * K + k]!;
    y[n] = s + (bias ? bias[n]! : 0);
  }
  return y;
}

function rms(x: Float64Array, w: Float64Array, eps: number): Float64Array {
  let ss = 0;
  for (const v of x) ss += v * v;
  const inv = 1 / Math.sqrt(ss / x.length + eps);
  return x.map((v, i) => v * inv * w[i]!);
}

function rotate(x: Float64Array, heads: number, hd: number, p: number, inv: Float32Array): void {
  const half = hd / 2;
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < half; i++) {
      const th = p * inv[i]!;
      const a = x[h * hd + i]!;
      const b = x[h * hd + i + half]!;
      x[h * hd + i] = a * Math.cos(th) - b * Math.sin(th);
      x[h * hd + i + half] = b * Math.cos(th) + a * Math.sin(th);
    }
  }
}

/** Logits [tokens.length, vocab] for one sequence starting at position 0. */
export function referenceLogits(m: TestModel, tokens: readonly number[]): Float64Array[] {
  const s = m.spec;
  const W = (n: string) => m.decoded.get(n)!;
  const hd = s.headDim;
  const vhd = s.vHeadDim ?? hd;
  const G = s.nHeads / s.nKvHeads;
  const inv = ropeInvFreq(s);
  const kCache: Float64Array[][] = Array.from({ length: s.nLayers }, () => []);
  const vCache: Float64Array[][] = Array.from({ length: s.nLayers }, () => []);
  const out: Float64Array[] = [];
  tokens.forEach((tok, p) => {
    let x = W("model.embed_tokens.weight").slice(tok * s.hidden, (tok + 1) * s.hidden);
    for (let l = 0; l < s.nLayers; l++) {
      const pre = `model.layers.${l}.`;
      const bias = (n: string) => (s.attentionBias ? W(`${pre}self_attn.${n}_proj.bias`) : undefined);
      const h = rms(x, W(`${pre}input_layernorm.weight`), s.rmsEps);
      const q = linear(h, W(`${pre}self_attn.q_proj.weight`), s.nHeads * hd, bias("q"));
      const k = linear(h, W(`${pre}self_attn.k_proj.weight`), s.nKvHeads * hd, bias("k"));
      const v = linear(h, W(`${pre}self_attn.v_proj.weight`), s.nKvHeads * vhd, bias("v"));
      rotate(q, s.nHeads, hd, p, inv);
      rotate(k, s.nKvHeads, hd, p, inv);
      kCache[l]!.push(k.map(f16round));
      vCache[l]!.push(v.map(f16round));
      const att = new Float64Array(s.nHeads * vhd);
      for (let hh = 0; hh < s.nHeads; hh++) {
        const kvh = Math.floor(hh / G);
        const sc = kCache[l]!.map((kr) => {
          let d = 0;
          for (let i = 0; i < hd; i++) d += q[hh * hd + i]! * kr[kvh * hd + i]!;
          return d / Math.sqrt(hd);
        });
        const mx = Math.max(...sc);
        const e = sc.map((z) => Math.exp(z - mx));
        const sum = e.reduce((a, b) => a + b, 0);
        for (let i = 0; i < vhd; i++) {
          let acc = 0;
          e.forEach((pj, j) => {
            acc += pj * vCache[l]![j]![kvh * vhd + i]!;
          });
          att[hh * vhd + i] = acc / sum;
        }
      }
      const o = linear(att, W(`${pre}self_attn.o_proj.weight`), s.hidden);
      x = x.map((xv, i) => xv + o[i]!);
      const h2 = rms(x, W(`${pre}post_attention_layernorm.weight`), s.rmsEps);
      const g = linear(h2, W(`${pre}mlp.gate_proj.weight`), s.ffn);
      const u = linear(h2, W(`${pre}mlp.up_proj.weight`), s.ffn);
      const a = g.map((gv, i) => (gv / (1 + Math.exp(-gv))) * u[i]!);
      const d = linear(a, W(`${pre}mlp.down_proj.weight`), s.hidden);
      x = x.map((xv, i) => xv + d[i]!);
    }
    const fin = rms(x, W("model.norm.weight"), s.rmsEps);
    out.push(linear(fin, W(s.tiedEmbeddings ? "model.embed_tokens.weight" : "lm_head.weight"), s.vocab));
  });
  return out;
}

export function argmax(xs: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < xs.length; i++) if (xs[i]! > xs[best]!) best = i;
  return best;
}
