import type { EngineSpec } from "./config.ts";
import { bf16BitsToF32, decodeValues, f32ToBf16Bits, roundToF16 } from "./dtype.ts";
import type { LoadedTensor } from "./safetensors.ts";
import type { ModelWeights } from "./weights.ts";

/**
 * An independent float64 forward pass in plain TypeScript, written from the
 * Hugging Face modelling code of each family (modeling_llama, _mistral,
 * _qwen2, _qwen3, _gemma2, _gemma3, _phi3), not from the native kernels, and
 * reading the checkpoint's tensors by their Hugging Face names (so a fused
 * Phi-3 projection is split here, on its own). Whole prompt at once, causal,
 * no paging: the yardstick both decoders are checked against on small models.
 *
 * Per layer, for rows t = 0..T-1 at positions t:
 *   h     = norm(x, input_layernorm)
 *   q,k,v = h·Wqᵀ (+bq), h·Wkᵀ (+bk), h·Wvᵀ (+bv)    Phi-3: one qkv_proj, split by rows
 *   q,k   ← norm(q, q_norm), norm(k, k_norm) per head (Qwen3, Gemma 3)
 *   q,k   ← q·cos + rotate_half(q)·sin (and k), cos/sin of the layer's inv_freq
 *           times LongRoPE's attention_factor
 *   s_tj  = q_t·k_j · scaling,  scaling = query_pre_attn_scalar^-½ (Gemma) or head_dim^-½
 *   s_tj  ← cap · tanh(s_tj / cap)                   (attn_logit_softcapping)
 *   a_t   = Σ_j softmax_j(s_tj) v_j over j ≤ t, and j > t − W on a sliding layer
 *   o     = a·Woᵀ;  o ← norm(o, post_attention_layernorm) (Gemma)
 *   x    += o
 *   h     = norm(x, post_attention_layernorm), Gemma: pre_feedforward_layernorm
 *   m     = (act(h·Wgᵀ) ⊙ h·Wuᵀ)·Wdᵀ, act = silu, Gemma: gelu_pytorch_tanh
 *           (Phi-3: gate and up are the two halves of gate_up_proj)
 *   m    ← norm(m, post_feedforward_layernorm) (Gemma)
 *   x    += m
 * logits = norm(x, model.norm)·W_lmᵀ, then cap · tanh(logits / cap) (final_logit_softcapping)
 * norm(x, w) = x / √(mean(x²) + eps) · w (Gemma: · (1 + w)); x starts as the
 * embedding row, Gemma's times √hidden in the embedding's dtype.
 *
 * `roundKvToF16` rounds k (after RoPE) and v to f16 before attention, as the
 * engine's KV pages store them, so the reference can be compared tightly.
 */
export interface ReferenceOptions {
  readonly roundKvToF16?: boolean;
  /**
   * Rounds the input of every product over block-quantized weights as the
   * engine's integer path does (native/src/quant_dot.h: per 32-value block,
   * d = amax / 127, q = round-half-even(x · (127 / amax)), both in f32), so
   * a quantized model is compared with the arithmetic it is specified to do.
   */
  readonly int8Activations?: boolean;
}

/** x [T, K] on the int8 grid of ReferenceOptions.int8Activations, as f64. */
function int8Grid(x: Float64Array, K: number): Float64Array {
  const y = new Float64Array(x.length);
  for (let o = 0; o < x.length; o += 32) {
    let amax = 0;
    for (let j = 0; j < 32; j++) amax = Math.max(amax, Math.abs(Math.fround(x[o + j]!)));
    const id = amax > 0 ? Math.fround(127 / amax) : 0;
    const d = Math.fround(amax / 127);
    for (let j = 0; j < 32; j++) {
      const v = Math.fround(Math.fround(x[o + j]!) * id);
      let q = Math.round(v);
      if (q - v === 0.5 && q % 2 !== 0) q -= 1; // half to even (Math.round takes halves up)
      y[o + j] = d * q;
    }
  }
  if (K % 32 !== 0) throw new RangeError(`int8 activations need rows of whole 32-blocks, got ${K}`);
  return y;
}

/** The widened tensors of the types the engine multiplies on its integer path. */
const int8Weights = new WeakSet<Float64Array>();

/** Weights widened to f64 once per tensor. */
const widened = new WeakMap<Buffer, Float64Array>();
function f64(t: LoadedTensor): Float64Array {
  let w = widened.get(t.data);
  if (!w) {
    w = decodeValues(t.data, t.dtype);
    widened.set(t.data, w);
    if (t.dtype === "Q8_0" || t.dtype === "Q4_0" || t.dtype === "Q6_K" || t.dtype === "Q4_K")
      int8Weights.add(w);
  }
  return w;
}

/** y[T, N] = x[T, K] · W[N, K]ᵀ (+ b[N]), W's rows [r0, r0 + N). */
function linear(
  x: Float64Array,
  T: number,
  K: number,
  w: Float64Array,
  N: number,
  b?: Float64Array,
  r0 = 0,
): Float64Array {
  const y = new Float64Array(T * N);
  for (let t = 0; t < T; t++) {
    const xo = t * K;
    for (let n = 0; n < N; n++) {
      const wo = (r0 + n) * K;
      let s = 0;
      for (let k = 0; k < K; k++) s += x[xo + k]! * w[wo + k]!;
      y[t * N + n] = s + (b ? b[n]! : 0);
    }
  }
  return y;
}

/** LlamaRMSNorm: w · x/√(mean x² + eps); GemmaRMSNorm: (1 + w) · x/√(mean x² + eps). Rows of D. */
function rmsnorm(x: Float64Array, D: number, w: Float64Array, eps: number, gemma: boolean): Float64Array {
  const y = new Float64Array(x.length);
  for (let r = 0; r < x.length / D; r++) {
    let ss = 0;
    for (let i = 0; i < D; i++) ss += x[r * D + i]! ** 2;
    const inv = 1 / Math.sqrt(ss / D + eps);
    for (let i = 0; i < D; i++) y[r * D + i] = x[r * D + i]! * inv * (gemma ? 1 + w[i]! : w[i]!);
  }
  return y;
}

/**
 * inv_freq of a layer, from transformers' modeling_rope_utils: default
 * 1/θ^(2i/d); linear divides by factor; llama3 blends by wavelength; longrope
 * divides by the chosen ext_factors. Gemma 3's sliding layers use
 * rope_local_base_freq with the default rule.
 */
function invFreqOf(spec: EngineSpec, sliding: boolean): Float64Array {
  const d = spec.headDim;
  const local = sliding && spec.localRopeTheta !== undefined;
  const theta = local ? spec.localRopeTheta! : spec.ropeTheta;
  const inv = Float64Array.from({ length: d / 2 }, (_, i) => 1 / theta ** ((2 * i) / d));
  const rs = local ? undefined : spec.ropeScaling;
  if (rs === undefined) return inv;
  if (rs.kind === "linear") return inv.map((f) => f / rs.factor);
  if (rs.kind === "longrope") return inv.map((_, i) => 1 / (rs.factors[i]! * theta ** ((2 * i) / d)));
  const low = rs.originalMaxPosition / rs.lowFreqFactor;
  const high = rs.originalMaxPosition / rs.highFreqFactor;
  return inv.map((f) => {
    const wavelen = (2 * Math.PI) / f;
    if (wavelen < high) return f;
    if (wavelen > low) return f / rs.factor;
    const smooth =
      (rs.originalMaxPosition / wavelen - rs.lowFreqFactor) / (rs.highFreqFactor - rs.lowFreqFactor);
    return (1 - smooth) * (f / rs.factor) + smooth * f;
  });
}

/** In place on x [T, H, d]: x·cos + rotate_half(x)·sin, both scaled by `mscale`. */
function applyRotary(x: Float64Array, T: number, H: number, d: number, inv: Float64Array, mscale: number) {
  const half = d / 2;
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < H; h++) {
      const o = (t * H + h) * d;
      for (let i = 0; i < half; i++) {
        const c = Math.cos(t * inv[i]!) * mscale;
        const s = Math.sin(t * inv[i]!) * mscale;
        const a = x[o + i]!;
        const b = x[o + i + half]!;
        x[o + i] = a * c - b * s;
        x[o + i + half] = b * c + a * s;
      }
    }
  }
}

/** gelu_pytorch_tanh: 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))). */
const geluTanh = (x: number) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
const silu = (x: number) => x / (1 + Math.exp(-x));

/**
 * Logits [T][vocab] for `tokens` at positions 0.. (a fresh sequence). Each row
 * sees only the rows at or before it (and, on a sliding layer, within its window).
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
  const tensor = (name: string): LoadedTensor => {
    const t = weights.tensors.get(name);
    if (!t) throw new RangeError(`the reference needs tensor '${name}'`);
    return t;
  };
  const W = (name: string) => f64(tensor(name));
  const lin = (x: Float64Array, T: number, K: number, w: Float64Array, N: number, b?: Float64Array, r0 = 0) =>
    linear(opts.int8Activations && int8Weights.has(w) ? int8Grid(x, K) : x, T, K, w, N, b, r0);
  const Wopt = (name: string) => (weights.tensors.has(name) ? W(name) : undefined);
  const gemma = spec.family === "gemma2" || spec.family === "gemma3";
  const phi3 = spec.family === "phi3";
  const qkNorm = spec.family === "qwen3" || spec.family === "gemma3";
  const norm = (x: Float64Array, width: number, name: string) =>
    rmsnorm(x, width, W(name), spec.rmsEps, gemma);
  const scaling = gemma ? spec.attnScale! : d ** -0.5;
  const mscale = spec.ropeScaling?.kind === "longrope" ? spec.ropeScaling.attentionFactor : 1;
  const group = H / KV;

  const embTensor = tensor("model.embed_tokens.weight");
  const emb = f64(embTensor);
  // Gemma: hidden_states * torch.tensor(hidden ** 0.5, dtype=hidden_states.dtype)
  let normalizer = 1;
  if (gemma) {
    const s = Math.fround(Math.sqrt(D));
    normalizer =
      embTensor.dtype === "BF16"
        ? bf16BitsToF32(f32ToBf16Bits(s))
        : embTensor.dtype === "F16"
          ? roundToF16(s)
          : s;
  }
  const x = new Float64Array(T * D);
  for (let t = 0; t < T; t++)
    for (let i = 0; i < D; i++) x[t * D + i] = emb[tokens[t]! * D + i]! * normalizer;

  for (let l = 0; l < spec.nLayers; l++) {
    const p = `model.layers.${l}.`;
    const layer = spec.layers[l]!;
    const h = norm(x, D, `${p}input_layernorm.weight`);
    let q: Float64Array, k: Float64Array, v: Float64Array;
    if (phi3) {
      const qkv = W(`${p}self_attn.qkv_proj.weight`);
      q = lin(h, T, D, qkv, H * d, undefined, 0);
      k = lin(h, T, D, qkv, KV * d, undefined, H * d);
      v = lin(h, T, D, qkv, KV * dv, undefined, H * d + KV * d);
    } else {
      q = lin(h, T, D, W(`${p}self_attn.q_proj.weight`), H * d, Wopt(`${p}self_attn.q_proj.bias`));
      k = lin(h, T, D, W(`${p}self_attn.k_proj.weight`), KV * d, Wopt(`${p}self_attn.k_proj.bias`));
      v = lin(h, T, D, W(`${p}self_attn.v_proj.weight`), KV * dv, Wopt(`${p}self_attn.v_proj.bias`));
    }
    if (qkNorm) {
      q = norm(q, d, `${p}self_attn.q_norm.weight`);
      k = norm(k, d, `${p}self_attn.k_norm.weight`);
    }
    const inv = invFreqOf(spec, layer.kind === "sliding");
    applyRotary(q, T, H, d, inv, mscale);
    applyRotary(k, T, KV, d, inv, mscale);
    if (opts.roundKvToF16) {
      for (let i = 0; i < k.length; i++) k[i] = roundToF16(k[i]!);
      for (let i = 0; i < v.length; i++) v[i] = roundToF16(v[i]!);
    }
    const a = new Float64Array(T * H * dv);
    const sc = new Float64Array(T);
    for (let t = 0; t < T; t++) {
      // The causal mask, with the sliding overlay kv_idx > q_idx − W.
      const first = layer.kind === "sliding" ? Math.max(0, t - layer.window + 1) : 0;
      for (let hh = 0; hh < H; hh++) {
        const kvh = Math.floor(hh / group);
        const qo = (t * H + hh) * d;
        let max = Number.NEGATIVE_INFINITY;
        for (let j = first; j <= t; j++) {
          const ko = (j * KV + kvh) * d;
          let s = 0;
          for (let i = 0; i < d; i++) s += q[qo + i]! * k[ko + i]!;
          s *= scaling;
          if (spec.attnSoftcap !== null) s = Math.tanh(s / spec.attnSoftcap) * spec.attnSoftcap;
          sc[j] = s;
          if (s > max) max = s;
        }
        let sum = 0;
        for (let j = first; j <= t; j++) {
          sc[j] = Math.exp(sc[j]! - max);
          sum += sc[j]!;
        }
        const ao = (t * H + hh) * dv;
        for (let j = first; j <= t; j++) {
          const pj = sc[j]! / sum;
          const vo = (j * KV + kvh) * dv;
          for (let i = 0; i < dv; i++) a[ao + i] = a[ao + i]! + pj * v[vo + i]!;
        }
      }
    }
    let o = lin(a, T, H * dv, W(`${p}self_attn.o_proj.weight`), D);
    if (gemma) o = norm(o, D, `${p}post_attention_layernorm.weight`);
    for (let i = 0; i < x.length; i++) x[i] = x[i]! + o[i]!;

    const h2 = norm(
      x,
      D,
      gemma ? `${p}pre_feedforward_layernorm.weight` : `${p}post_attention_layernorm.weight`,
    );
    let g: Float64Array, u: Float64Array;
    if (phi3) {
      const gu = W(`${p}mlp.gate_up_proj.weight`);
      g = lin(h2, T, D, gu, F, undefined, 0);
      u = lin(h2, T, D, gu, F, undefined, F);
    } else {
      g = lin(h2, T, D, W(`${p}mlp.gate_proj.weight`), F);
      u = lin(h2, T, D, W(`${p}mlp.up_proj.weight`), F);
    }
    for (let i = 0; i < g.length; i++) g[i] = (gemma ? geluTanh(g[i]!) : silu(g[i]!)) * u[i]!;
    let m = lin(g, T, F, W(`${p}mlp.down_proj.weight`), D);
    if (gemma) m = norm(m, D, `${p}post_feedforward_layernorm.weight`);
    for (let i = 0; i < x.length; i++) x[i] = x[i]! + m[i]!;
  }
  const xn = norm(x, D, "model.norm.weight");
  const logits = lin(xn, T, D, spec.tiedEmbeddings ? emb : W("lm_head.weight"), V);
  if (spec.finalSoftcap !== null) {
    const cap = spec.finalSoftcap;
    for (let i = 0; i < logits.length; i++) logits[i] = Math.tanh(logits[i]! / cap) * cap;
  }
  const rows: Float64Array[] = [];
  for (let t = 0; t < T; t++) rows.push(logits.slice(t * V, (t + 1) * V));
  return rows;
}
