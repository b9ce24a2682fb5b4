/** A model's weight tensors: their element types, byte sizes, names and load order. */
import type { ModelSpec } from "./model-spec.ts";

/**
 * Weight element types: one value per element (f32, f16, bf16), or one of
 * llama.cpp's block formats (native/src/quant.h: a row of K elements is K /
 * block blocks), which only weight matrices and the embedding may use.
 */
export type WeightDType = "f32" | "f16" | "bf16" | "q8_0" | "q4_0" | "q4_k" | "q6_k";

/** Elements and bytes of one block of each weight type (a value of f32/f16/bf16 is a block of one). */
export const WEIGHT_BLOCKS: Readonly<
  Record<WeightDType, { readonly elems: number; readonly bytes: number }>
> = {
  f32: { elems: 1, bytes: 4 },
  f16: { elems: 1, bytes: 2 },
  bf16: { elems: 1, bytes: 2 },
  q8_0: { elems: 32, bytes: 34 },
  q4_0: { elems: 32, bytes: 18 },
  q4_k: { elems: 256, bytes: 144 },
  q6_k: { elems: 256, bytes: 210 },
};

/** Bytes of a tensor of `shape` in `dtype`, or null when its rows are not whole blocks. */
export function weightBytes(dtype: WeightDType, shape: readonly number[]): number | null {
  const b = WEIGHT_BLOCKS[dtype];
  const row = shape.length > 0 ? shape[shape.length - 1]! : 1;
  if (row % b.elems !== 0) return null;
  return (shape.reduce((a, d) => a * d, 1) / b.elems) * b.bytes;
}

/** One tensor as read from safetensors: little-endian bytes in `dtype`. */
export interface WeightTensor {
  readonly dtype: WeightDType;
  readonly shape: readonly number[];
  readonly data: Uint8Array;
}

/** Tensors keyed by Hugging Face name. */
export type Weights = ReadonlyMap<string, WeightTensor> | Readonly<Record<string, WeightTensor>>;

export class WeightError extends Error {
  override readonly name = "WeightError";
}

/** The tensors a spec needs, by Hugging Face name, in the engine's load order. */
export function weightNames(spec: ModelSpec): { name: string; shape: number[] }[] {
  const H = spec.hidden;
  const vHead = spec.vHeadDim ?? spec.headDim;
  const qn = spec.nHeads * spec.headDim;
  const kn = spec.nKvHeads * spec.headDim;
  const vn = spec.nKvHeads * vHead;
  const on = spec.nHeads * vHead;
  const out: { name: string; shape: number[] }[] = [
    { name: "model.embed_tokens.weight", shape: [spec.vocab, H] },
  ];
  for (let l = 0; l < spec.nLayers; l++) {
    const p = `model.layers.${l}.`;
    out.push({ name: `${p}input_layernorm.weight`, shape: [H] });
    out.push({ name: `${p}self_attn.q_proj.weight`, shape: [qn, H] });
    out.push({ name: `${p}self_attn.k_proj.weight`, shape: [kn, H] });
    out.push({ name: `${p}self_attn.v_proj.weight`, shape: [vn, H] });
    if (spec.attentionBias) {
      out.push({ name: `${p}self_attn.q_proj.bias`, shape: [qn] });
      out.push({ name: `${p}self_attn.k_proj.bias`, shape: [kn] });
      out.push({ name: `${p}self_attn.v_proj.bias`, shape: [vn] });
    }
    if (spec.qkNorm) {
      out.push({ name: `${p}self_attn.q_norm.weight`, shape: [spec.headDim] });
      out.push({ name: `${p}self_attn.k_norm.weight`, shape: [spec.headDim] });
    }
    out.push({ name: `${p}self_attn.o_proj.weight`, shape: [H, on] });
    out.push({ name: `${p}post_attention_layernorm.weight`, shape: [H] });
    if (spec.sandwichNorms) out.push({ name: `${p}pre_feedforward_layernorm.weight`, shape: [H] });
    out.push({ name: `${p}mlp.gate_proj.weight`, shape: [spec.ffn, H] });
    out.push({ name: `${p}mlp.up_proj.weight`, shape: [spec.ffn, H] });
    out.push({ name: `${p}mlp.down_proj.weight`, shape: [H, spec.ffn] });
    if (spec.sandwichNorms) out.push({ name: `${p}post_feedforward_layernorm.weight`, shape: [H] });
  }
  out.push({ name: "model.norm.weight", shape: [H] });
  if (!spec.tiedEmbeddings) out.push({ name: "lm_head.weight", shape: [spec.vocab, H] });
  return out;
}

/** Checks every tensor (presence, no extras, shape, dtype, byte length) and returns them in load order. */
export function orderWeights(spec: ModelSpec, weights: Weights): { dtype: WeightDType; data: Uint8Array }[] {
  const byName: ReadonlyMap<string, WeightTensor> =
    weights instanceof Map ? weights : new Map(Object.entries(weights as Record<string, WeightTensor>));
  const wanted = weightNames(spec);
  const known = new Set(wanted.map((w) => w.name));
  for (const name of byName.keys()) {
    if (!known.has(name))
      throw new WeightError(`unexpected tensor ${name}: the model spec has no place for it`);
  }
  return wanted.map(({ name, shape }) => {
    const t = byName.get(name);
    if (t === undefined) throw new WeightError(`missing tensor ${name} [${shape.join(", ")}]`);
    if (!Object.hasOwn(WEIGHT_BLOCKS, t.dtype)) {
      throw new WeightError(
        `tensor ${name}: dtype ${String(t.dtype)} is not one of ${Object.keys(WEIGHT_BLOCKS).join(", ")}`,
      );
    }
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new WeightError(`tensor ${name}: shape [${t.shape.join(", ")}], expected [${shape.join(", ")}]`);
    }
    if (!(t.data instanceof Uint8Array)) throw new WeightError(`tensor ${name}: data must be a Uint8Array`);
    const bytes = weightBytes(t.dtype, shape);
    if (bytes === null) {
      throw new WeightError(
        `tensor ${name}: rows of ${shape[shape.length - 1]} elements are not whole ${t.dtype} blocks of ${WEIGHT_BLOCKS[t.dtype].elems}`,
      );
    }
    if (t.data.byteLength !== bytes) {
      throw new WeightError(`tensor ${name}: ${t.data.byteLength} bytes, expected ${bytes} for ${t.dtype}`);
    }
    return { dtype: t.dtype, data: t.data };
  });
}
