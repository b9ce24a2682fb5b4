/** The architecture of a model as the engine takes it: its fields, their checks, its RoPE frequencies. */

/** Llama-3 rotary frequency scaling, with Hugging Face's `rope_scaling` field names. */
export interface Llama3RopeScaling {
  readonly factor: number;
  readonly low_freq_factor: number;
  readonly high_freq_factor: number;
  readonly original_max_position_embeddings: number;
}

/**
 * The architecture of a Llama-family model and its relatives (native/src/backend.h
 * gives the forward). The optional family fields default to the Llama forward.
 */
export interface ModelSpec {
  readonly nLayers: number;
  readonly hidden: number;
  readonly nHeads: number;
  readonly nKvHeads: number;
  readonly headDim: number;
  /** Value head dimension; defaults to headDim. */
  readonly vHeadDim?: number;
  /** MLP intermediate size. */
  readonly ffn: number;
  readonly vocab: number;
  readonly rmsEps: number;
  readonly ropeTheta: number;
  readonly ropeScaling?: Llama3RopeScaling | null;
  /** q/k/v projections carry a bias (Qwen2). */
  readonly attentionBias: boolean;
  /** lm_head shares model.embed_tokens.weight. */
  readonly tiedEmbeddings: boolean;
  /** Positions are in [0, maxPosition). */
  readonly maxPosition: number;
  /** Every RMSNorm scales by (1 + w) (Gemma). */
  readonly normOffset?: boolean;
  /** q_norm / k_norm [headDim] per head before RoPE (Qwen3, Gemma 3). */
  readonly qkNorm?: boolean;
  /** post_attention_layernorm on the attention output, pre_ and post_feedforward_layernorm around the MLP (Gemma). */
  readonly sandwichNorms?: boolean;
  /** The MLP gate; default "silu". */
  readonly activation?: "silu" | "gelu_tanh";
  /** Embedding rows are multiplied by this (Gemma: √hidden); default 1. */
  readonly embedScale?: number;
  /** q and k are multiplied by this after RoPE (LongRoPE's attention factor); default 1. */
  readonly ropeScale?: number;
  /** Softmax scale of the scores; default 1/√headDim. */
  readonly attnScale?: number;
  /** Scores become cap · tanh(s / cap); absent or null: none. */
  readonly attnSoftcap?: number | null;
  /** Logits become cap · tanh(l / cap); absent or null: none. */
  readonly finalSoftcap?: number | null;
  /** Per layer: 0 global, W > 0 sliding over the last W positions; absent: every layer global. */
  readonly layerWindows?: Int32Array;
  /**
   * RoPE inverse frequencies per layer, [nLayers * headDim / 2]; absent:
   * ropeInvFreq(spec) for every layer.
   */
  readonly layerInvFreq?: Float32Array;
}

export class ModelSpecError extends Error {
  override readonly name = "ModelSpecError";
}

/**
 * Rotary inverse frequencies [headDim / 2]: inv_freq[i] = theta^(-2i / headDim),
 * then the Llama-3 rule when `ropeScaling` is set (with wavelen = 2π / inv_freq,
 * low = original / low_freq_factor, high = original / high_freq_factor):
 * wavelen < high keeps inv_freq; wavelen > low divides it by `factor`; between,
 * smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
 * and inv_freq' = (1 - smooth) * inv_freq / factor + smooth * inv_freq.
 * Computed in float64, rounded once to float32.
 */
export function ropeInvFreq(spec: Pick<ModelSpec, "headDim" | "ropeTheta" | "ropeScaling">): Float32Array {
  const half = spec.headDim / 2;
  const out = new Float32Array(half);
  const sc = spec.ropeScaling ?? null;
  for (let i = 0; i < half; i++) {
    let f = 1 / spec.ropeTheta ** ((2 * i) / spec.headDim);
    if (sc !== null) {
      const lowWavelen = sc.original_max_position_embeddings / sc.low_freq_factor;
      const highWavelen = sc.original_max_position_embeddings / sc.high_freq_factor;
      const wavelen = (2 * Math.PI) / f;
      if (wavelen > lowWavelen) {
        f = f / sc.factor;
      } else if (wavelen >= highWavelen) {
        const smooth =
          (sc.original_max_position_embeddings / wavelen - sc.low_freq_factor) /
          (sc.high_freq_factor - sc.low_freq_factor);
        f = ((1 - smooth) * f) / sc.factor + smooth * f;
      }
    }
    out[i] = f;
  }
  return out;
}

/** Throws ModelSpecError naming the first field that the engine cannot take. */
export function checkSpec(spec: ModelSpec): void {
  const ints: (keyof ModelSpec)[] = [
    "nLayers",
    "hidden",
    "nHeads",
    "nKvHeads",
    "headDim",
    "ffn",
    "vocab",
    "maxPosition",
  ];
  for (const k of ints) {
    const v = spec[k];
    if (typeof v !== "number" || !Number.isInteger(v) || v < 1 || v > 2 ** 31 - 1) {
      throw new ModelSpecError(`spec.${k} must be a positive integer, got ${String(v)}`);
    }
  }
  const vHead = spec.vHeadDim ?? spec.headDim;
  if (!Number.isInteger(vHead) || vHead < 1)
    throw new ModelSpecError(`spec.vHeadDim must be a positive integer`);
  if (spec.nHeads % spec.nKvHeads !== 0) {
    throw new ModelSpecError(
      `spec.nHeads (${spec.nHeads}) must be a multiple of nKvHeads (${spec.nKvHeads})`,
    );
  }
  if (spec.headDim % 2 !== 0) throw new ModelSpecError(`spec.headDim must be even, got ${spec.headDim}`);
  if (!(spec.rmsEps > 0)) throw new ModelSpecError(`spec.rmsEps must be > 0, got ${spec.rmsEps}`);
  if (!(spec.ropeTheta > 0)) throw new ModelSpecError(`spec.ropeTheta must be > 0, got ${spec.ropeTheta}`);
  const sc = spec.ropeScaling;
  if (sc !== undefined && sc !== null) {
    for (const k of [
      "factor",
      "low_freq_factor",
      "high_freq_factor",
      "original_max_position_embeddings",
    ] as const) {
      if (!(typeof sc[k] === "number" && sc[k] > 0)) {
        throw new ModelSpecError(`spec.ropeScaling.${k} must be > 0, got ${String(sc[k])}`);
      }
    }
    if (sc.high_freq_factor <= sc.low_freq_factor) {
      throw new ModelSpecError("spec.ropeScaling.high_freq_factor must exceed low_freq_factor");
    }
  }
  for (const k of ["embedScale", "ropeScale", "attnScale", "attnSoftcap", "finalSoftcap"] as const) {
    const v = spec[k];
    if (v !== undefined && v !== null && !(typeof v === "number" && Number.isFinite(v) && v > 0))
      throw new ModelSpecError(`spec.${k} must be a positive number, got ${String(v)}`);
  }
  const w = spec.layerWindows;
  if (w !== undefined) {
    if (!(w instanceof Int32Array) || w.length !== spec.nLayers)
      throw new ModelSpecError(
        `spec.layerWindows must be an Int32Array of nLayers (${spec.nLayers}) windows`,
      );
    if (w.some((x) => x < 0)) throw new ModelSpecError("spec.layerWindows must be >= 0 (0: global)");
  }
  const inv = spec.layerInvFreq;
  if (
    inv !== undefined &&
    (!(inv instanceof Float32Array) || inv.length !== (spec.nLayers * spec.headDim) / 2)
  )
    throw new ModelSpecError("spec.layerInvFreq must be a Float32Array of nLayers * headDim / 2 frequencies");
}
