import type { EngineSpec } from "./config.ts";
import { decodeValues, roundToF16 } from "./dtype.ts";
import { specInvFreq } from "./rope.ts";
import type { LoadedTensor } from "./safetensors.ts";
import type { ModelWeights } from "./weights.ts";

/**
 * An independent float64 forward pass of the Llama family in plain
 * TypeScript, written from the Hugging Face modeling code, not from the
 * native kernels. Whole prompt at once, causal, no paging: the yardstick both
 * decoders are checked against on small models.
 *
 * Per layer, for rows t = 0..T-1 at positions p_t = startPos + t:
 *   h    = RMSNorm(x) ⊙ w_in,          RMSNorm(x) = x / sqrt(mean(x²) + eps)
 *   q,k,v = h·Wqᵀ (+bq), h·Wkᵀ (+bk), h·Wvᵀ (+bv)
 *   q,k  ← RoPE(q, p_t), RoPE(k, p_t)   (rotate_half pairs (i, i + d/2))
 *   a[t,h] = Σ_{j ≤ t} softmax_j(q[t,h]·k[j,h/g] / sqrt(d)) v[j,h/g],  g = nHeads / nKvHeads
 *   x    += a·Woᵀ
 *   h    = RMSNorm(x) ⊙ w_post
 *   x    += (silu(h·Wgᵀ) ⊙ h·Wuᵀ)·Wdᵀ,  silu(z) = z / (1 + e^(−z))
 * logits = (RMSNorm(x) ⊙ w_norm)·W_lmᵀ
 *
 * `roundKvToF16` rounds k (after RoPE) and v to f16 before attention, as the
 * engine's KV pages store them, so the reference can be compared tightly.
 */
export interface ReferenceOptions {
  readonly roundKvToF16?: boolean;
}

/** Weights widened to f64 once per tensor. */
const widened = new WeakMap<Buffer, Float64Array>();
function f64(t: LoadedTensor): Float64Array {
  let w = widened.get(t.data);
  if (!w) {
    w = decodeValues(t.data, t.dtype);
    widened.set(t.data, w);
  }
  return w;
}

/** y[T, N] = x[T, K] · W[N, K]ᵀ (+ b[N]). */
function linear(
  x: Float64Array,
  T: number,
  K: number,
  W: LoadedTensor,
  N: number,
  b?: LoadedTensor,
): Float64Array {
  const w = f64(W);
  const bias = b ? f64(b) : undefined;
  const y = new Float64Array(T * N);
  for (let t = 0; t < T; t++) {
    const xo = t * K;
    for (let n = 0; n < N; n++) {
      const wo = n * K;
      let s = 0;
      for (let k = 0; k < K; k++) s += x[xo + k]! * w[wo + k]!;
      y[t * N + n] = s + (bias ? bias[n]! : 0);
    }
  }
  return y;
}

function rmsnorm(x: Float64Array, T: number, D: number, w: LoadedTensor, eps: number): Float64Array {
  const g = f64(w);
  const y = new Float64Array(T * D);
  for (let t = 0; t < T; t++) {
    let ss = 0;
    for (let i = 0; i < D; i++) ss += x[t * D + i]! ** 2;
    const r = 1 / Math.sqrt(ss / D + eps);
    for (let i = 0; i < D; i++) y[t * D + i] = x[t * D + i]! * r * g[i]!;
  }
  return y;
}

/** In place: x [T, H, d], rotate_half convention. */
function rope(
  x: Float64Array,
  T: number,
  H: number,
  d: number,
  pos: (t: number) => number,
  invFreq: Float64Array,
) {
  const half = d / 2;
  for (let t = 0; t < T; t++) {
    const p = pos(t);
    for (let h = 0; h < H; h++) {
      const o = (t * H + h) * d;
      for (let i = 0; i < half; i++) {
        const th = p * invFreq[i]!;
        const c = Math.cos(th);
        const s = Math.sin(th);
        const a = x[o + i]!;
        const b = x[o + i + half]!;
        x[o + i] = a * c - b * s;
        x[o + i + half] = b * c + a * s;
      }
    }
  }
}

/**
 * Logits [T][vocab] for `tokens` at positions startPos.. (a fresh sequence:
 * startPos 0). Each row sees only the rows at or before it.
 */
export function referenceForward(
  spec: EngineSpec,
  weights: ModelWeights,
  tokens: readonly number[],
  opts: ReferenceOptions = {},
): Float64Array[] {
  const { hidden: D, nHeads: H, nKvHeads: KV, headDim: d, vHeadDim: dv, ffn: F, vocab: V } = spec;
  const T = tokens.length;
  if (T === 0) return [];
  for (const [i, tok] of tokens.entries())
    if (!Number.isInteger(tok) || tok < 0 || tok >= V)
      throw new RangeError(`tokens[${i}] = ${tok} is outside vocab ${V}`);
  const invFreq = specInvFreq(spec);
  const group = H / KV;
  const scale = 1 / Math.sqrt(d);
  const emb = f64(weights.embed);
  const x = new Float64Array(T * D);
  for (let t = 0; t < T; t++) x.set(emb.subarray(tokens[t]! * D, tokens[t]! * D + D), t * D);

  for (const L of weights.layers) {
    const h = rmsnorm(x, T, D, L.inputNorm, spec.rmsEps);
    const q = linear(h, T, D, L.q, H * d, L.qBias);
    const k = linear(h, T, D, L.k, KV * d, L.kBias);
    const v = linear(h, T, D, L.v, KV * dv, L.vBias);
    rope(q, T, H, d, (t) => t, invFreq);
    rope(k, T, KV, d, (t) => t, invFreq);
    if (opts.roundKvToF16) {
      for (let i = 0; i < k.length; i++) k[i] = roundToF16(k[i]!);
      for (let i = 0; i < v.length; i++) v[i] = roundToF16(v[i]!);
    }
    const a = new Float64Array(T * H * dv);
    const sc = new Float64Array(T);
    for (let t = 0; t < T; t++) {
      for (let hh = 0; hh < H; hh++) {
        const kvh = Math.floor(hh / group);
        const qo = (t * H + hh) * d;
        let max = Number.NEGATIVE_INFINITY;
        for (let j = 0; j <= t; j++) {
          const ko = (j * KV + kvh) * d;
          let s = 0;
          for (let i = 0; i < d; i++) s += q[qo + i]! * k[ko + i]!;
          sc[j] = s * scale;
          if (sc[j]! > max) max = sc[j]!;
        }
        let sum = 0;
        for (let j = 0; j <= t; j++) {
          sc[j] = Math.exp(sc[j]! - max);
          sum += sc[j]!;
        }
        const ao = (t * H + hh) * dv;
        for (let j = 0; j <= t; j++) {
          const p = sc[j]! / sum;
          const vo = (j * KV + kvh) * dv;
          for (let i = 0; i < dv; i++) a[ao + i] = a[ao + i]! + p * v[vo + i]!;
        }
      }
    }
    const o = linear(a, T, H * dv, L.o, D);
    for (let i = 0; i < x.length; i++) x[i] = x[i]! + o[i]!;
    const h2 = rmsnorm(x, T, D, L.postNorm, spec.rmsEps);
    const g = linear(h2, T, D, L.gate, F);
    const u = linear(h2, T, D, L.up, F);
    for (let i = 0; i < g.length; i++) g[i] = (g[i]! / (1 + Math.exp(-g[i]!))) * u[i]!;
    const m = linear(g, T, F, L.down, D);
    for (let i = 0; i < x.length; i++) x[i] = x[i]! + m[i]!;
  }
  const xn = rmsnorm(x, T, D, weights.norm, spec.rmsEps);
  const logits = linear(xn, T, D, weights.lmHead, V);
  const rows: Float64Array[] = [];
  for (let t = 0; t < T; t++) rows.push(logits.slice(t * V, (t + 1) * V));
  return rows;
}
