import type { EngineSpec, RopeScaling } from "./config.ts";

/**
 * RoPE inverse frequencies, Hugging Face convention, in float64. The native
 * engine computes its own; this one feeds the TypeScript reference forward and
 * cross-checks the engine's.
 *
 *   inv_freq[i] = 1 / theta^(2i / head_dim),  i < head_dim / 2
 *
 * Llama-3 scaling
 * (transformers' _compute_llama3_parameters) leaves short wavelengths alone,
 * divides long ones by `factor`, and blends in between:
 *
 *   wavelen = 2π / inv_freq
 *   low_wavelen  = original_max_position / low_freq_factor
 *   high_wavelen = original_max_position / high_freq_factor
 *   wavelen < high_wavelen  → inv_freq
 *   wavelen > low_wavelen   → inv_freq / factor
 *   otherwise, with s = (original_max_position / wavelen − low_freq_factor)
 *                       / (high_freq_factor − low_freq_factor):
 *                         → (1 − s) · inv_freq / factor + s · inv_freq
 */
export function ropeInvFreq(headDim: number, theta: number, scaling?: RopeScaling): Float64Array {
  if (!Number.isInteger(headDim) || headDim <= 0 || headDim % 2 !== 0)
    throw new RangeError(`head_dim must be a positive even integer, got ${headDim}`);
  const half = headDim / 2;
  const out = new Float64Array(half);
  for (let i = 0; i < half; i++) out[i] = 1 / theta ** ((2 * i) / headDim);
  if (scaling === undefined) return out;
  // Linear (transformers' _compute_linear_scaling_rope_parameters): inv_freq / factor.
  if (scaling.kind === "linear") return out.map((f) => f / scaling.factor);
  // LongRoPE (_compute_longrope_parameters): 1 / (ext_factor[i] · theta^(2i/d)).
  if (scaling.kind === "longrope") return out.map((f, i) => f / scaling.factors[i]!);
  const { factor, lowFreqFactor, highFreqFactor, originalMaxPosition } = scaling;
  const lowWavelen = originalMaxPosition / lowFreqFactor;
  const highWavelen = originalMaxPosition / highFreqFactor;
  for (let i = 0; i < half; i++) {
    const f = out[i]!;
    const wavelen = (2 * Math.PI) / f;
    if (wavelen < highWavelen) continue;
    if (wavelen > lowWavelen) {
      out[i] = f / factor;
      continue;
    }
    const s = (originalMaxPosition / wavelen - lowFreqFactor) / (highFreqFactor - lowFreqFactor);
    out[i] = (1 - s) * (f / factor) + s * f;
  }
  return out;
}

/** The global layers' frequencies: rope_theta with rope_scaling. */
export function specInvFreq(spec: EngineSpec): Float64Array {
  return ropeInvFreq(spec.headDim, spec.ropeTheta, spec.ropeScaling);
}

/**
 * Layer l's frequencies. Gemma 3's sliding layers use their own unscaled base
 * (rope_local_base_freq); every other layer the global table.
 */
export function layerInvFreq(spec: EngineSpec, layer: number): Float64Array {
  const local = spec.layers[layer]!.kind === "sliding" && spec.localRopeTheta !== undefined;
  return local ? ropeInvFreq(spec.headDim, spec.localRopeTheta!) : specInvFreq(spec);
}

/**
 * The factor LongRoPE multiplies cos and sin by (1 without it): q·k scales by
 * its square.
 */
export function ropeAttentionFactor(spec: EngineSpec): number {
  return spec.ropeScaling?.kind === "longrope" ? spec.ropeScaling.attentionFactor : 1;
}
