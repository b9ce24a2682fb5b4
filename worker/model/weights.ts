import type { EngineSpec } from "./config.ts";
import { type ByteProgress, progressFor } from "./progress.ts";
import { type LoadedTensor, SafetensorsCheckpoint, SafetensorsError } from "./safetensors.ts";

/**
 * The tensor set of each family (Hugging Face names and [out, in] Linear
 * layout) and its loading. The loader checks names and shapes against the
 * config before reading a byte, so a wrong checkpoint fails fast and loads
 * nothing.
 */
export interface LayerWeights {
  readonly inputNorm: LoadedTensor; // [hidden]
  readonly q: LoadedTensor; // [nHeads*headDim, hidden]
  readonly k: LoadedTensor; // [nKv*headDim, hidden]
  readonly v: LoadedTensor; // [nKv*vHeadDim, hidden]
  readonly o: LoadedTensor; // [hidden, nHeads*vHeadDim]
  readonly qBias?: LoadedTensor; // [nHeads*headDim] (attentionBias)
  readonly kBias?: LoadedTensor;
  readonly vBias?: LoadedTensor;
  readonly qNorm?: LoadedTensor; // [headDim] (qkNorm)
  readonly kNorm?: LoadedTensor;
  /** sandwichNorms: post_attention_layernorm, on the attention output. */
  readonly attnOutNorm?: LoadedTensor; // [hidden]
  /** Before the MLP: post_attention_layernorm (Llama), pre_feedforward_layernorm (Gemma). */
  readonly mlpNorm: LoadedTensor; // [hidden]
  readonly gate: LoadedTensor; // [ffn, hidden]
  readonly up: LoadedTensor; // [ffn, hidden]
  readonly down: LoadedTensor; // [hidden, ffn]
  /** sandwichNorms: post_feedforward_layernorm, on the MLP output. */
  readonly mlpOutNorm?: LoadedTensor; // [hidden]
}

export interface ModelWeights {
  readonly embed: LoadedTensor; // [vocab, hidden]
  readonly layers: readonly LayerWeights[];
  readonly norm: LoadedTensor; // [hidden]
  /** [vocab, hidden]; the embedding itself when tied. */
  readonly lmHead: LoadedTensor;
  /** Every distinct tensor, by checkpoint name (what the fingerprint digests). */
  readonly tensors: ReadonlyMap<string, LoadedTensor>;
}

export class WeightsError extends Error {
  override readonly name = "WeightsError";
}

/** Tensors that may appear in a checkpoint but carry nothing the engine uses. */
const IGNORED = /^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$/;

const layerPrefix = (i: number) => `model.layers.${i}`;

/** Every tensor name the spec requires, with its shape. */
export function expectedTensors(spec: EngineSpec): Map<string, readonly number[]> {
  const { hidden, nHeads, nKvHeads, headDim, vHeadDim, ffn, vocab } = spec;
  const qn = nHeads * headDim;
  const kn = nKvHeads * headDim;
  const vn = nKvHeads * vHeadDim;
  const m = new Map<string, readonly number[]>();
  m.set("model.embed_tokens.weight", [vocab, hidden]);
  for (let i = 0; i < spec.nLayers; i++) {
    const p = layerPrefix(i);
    m.set(`${p}.input_layernorm.weight`, [hidden]);
    if (spec.fusedProjections) {
      // Phi-3: rows [0, qn) are q, then kn rows of k, then vn of v.
      m.set(`${p}.self_attn.qkv_proj.weight`, [qn + kn + vn, hidden]);
    } else {
      m.set(`${p}.self_attn.q_proj.weight`, [qn, hidden]);
      m.set(`${p}.self_attn.k_proj.weight`, [kn, hidden]);
      m.set(`${p}.self_attn.v_proj.weight`, [vn, hidden]);
    }
    if (spec.attentionBias) {
      m.set(`${p}.self_attn.q_proj.bias`, [qn]);
      m.set(`${p}.self_attn.k_proj.bias`, [kn]);
      m.set(`${p}.self_attn.v_proj.bias`, [vn]);
    }
    if (spec.qkNorm) {
      m.set(`${p}.self_attn.q_norm.weight`, [headDim]);
      m.set(`${p}.self_attn.k_norm.weight`, [headDim]);
    }
    m.set(`${p}.self_attn.o_proj.weight`, [hidden, nHeads * vHeadDim]);
    m.set(`${p}.post_attention_layernorm.weight`, [hidden]);
    if (spec.sandwichNorms) {
      m.set(`${p}.pre_feedforward_layernorm.weight`, [hidden]);
      m.set(`${p}.post_feedforward_layernorm.weight`, [hidden]);
    }
    if (spec.fusedProjections) {
      // Phi-3: rows [0, ffn) are the gate, [ffn, 2 ffn) the up projection.
      m.set(`${p}.mlp.gate_up_proj.weight`, [2 * ffn, hidden]);
    } else {
      m.set(`${p}.mlp.gate_proj.weight`, [ffn, hidden]);
      m.set(`${p}.mlp.up_proj.weight`, [ffn, hidden]);
    }
    m.set(`${p}.mlp.down_proj.weight`, [hidden, ffn]);
  }
  m.set("model.norm.weight", [hidden]);
  if (!spec.tiedEmbeddings) m.set("lm_head.weight", [vocab, hidden]);
  return m;
}

/**
 * Checks the checkpoint's names and shapes against the spec: every expected
 * tensor present with its shape, nothing unexpected (except ignorable rotary
 * caches, and an lm_head that a tied model does not use).
 */
export function checkCheckpoint(
  ckpt: SafetensorsCheckpoint,
  spec: EngineSpec,
): Map<string, readonly number[]> {
  const expected = expectedTensors(spec);
  for (const [name, shape] of expected) {
    const t = ckpt.tensors.get(name);
    if (!t) throw new WeightsError(`${ckpt.dir}: missing tensor '${name}' (shape [${shape.join(", ")}])`);
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i]))
      throw new WeightsError(
        `${t.file}: tensor '${name}' has shape [${t.shape.join(", ")}], config.json implies [${shape.join(", ")}]`,
      );
  }
  for (const [name, t] of ckpt.tensors) {
    if (expected.has(name) || IGNORED.test(name) || (spec.tiedEmbeddings && name === "lm_head.weight"))
      continue;
    throw new WeightsError(`${t.file}: unexpected tensor '${name}' for this config.json`);
  }
  return expected;
}

export interface LoadWeightsOptions {
  /** Terminal progress; default: a stderr line for loads of 64 MiB or more. */
  readonly progress?: ByteProgress;
}

/** Loads and validates the weights of `spec` from the checkpoint in `dir`. All or nothing. */
export async function loadWeights(
  dir: string,
  spec: EngineSpec,
  opts: LoadWeightsOptions = {},
): Promise<ModelWeights> {
  const ckpt = await SafetensorsCheckpoint.open(dir);
  const expected = checkCheckpoint(ckpt, spec);
  const names = [...expected.keys()];
  const progress = opts.progress ?? progressFor("loading weights", ckpt.bytesOf(names));
  const tensors = await ckpt.load(names, progress);
  return assemble(tensors, spec);
}

/**
 * Rows [r0, r0 + rows) of a fused [N, K] weight as a tensor of its own (a
 * view of the same bytes, named as the unfused checkpoint would name it).
 */
function rowsOf(t: LoadedTensor, name: string, r0: number, rows: number): LoadedTensor {
  const K = t.shape[1]!;
  const bytes = t.data.byteLength / t.shape[0]!;
  return {
    name,
    dtype: t.dtype,
    shape: [rows, K],
    data: t.data.subarray(r0 * bytes, (r0 + rows) * bytes),
  };
}

/** Arranges validated tensors by role. */
export function assemble(tensors: ReadonlyMap<string, LoadedTensor>, spec: EngineSpec): ModelWeights {
  const get = (name: string): LoadedTensor => {
    const t = tensors.get(name);
    if (!t) throw new SafetensorsError(`missing tensor '${name}'`);
    return t;
  };
  const qn = spec.nHeads * spec.headDim;
  const kn = spec.nKvHeads * spec.headDim;
  const vn = spec.nKvHeads * spec.vHeadDim;
  const layers: LayerWeights[] = [];
  for (let i = 0; i < spec.nLayers; i++) {
    const p = layerPrefix(i);
    let q: LoadedTensor, k: LoadedTensor, v: LoadedTensor, gate: LoadedTensor, up: LoadedTensor;
    if (spec.fusedProjections) {
      const qkv = get(`${p}.self_attn.qkv_proj.weight`);
      q = rowsOf(qkv, `${p}.self_attn.q_proj.weight`, 0, qn);
      k = rowsOf(qkv, `${p}.self_attn.k_proj.weight`, qn, kn);
      v = rowsOf(qkv, `${p}.self_attn.v_proj.weight`, qn + kn, vn);
      const gu = get(`${p}.mlp.gate_up_proj.weight`);
      gate = rowsOf(gu, `${p}.mlp.gate_proj.weight`, 0, spec.ffn);
      up = rowsOf(gu, `${p}.mlp.up_proj.weight`, spec.ffn, spec.ffn);
    } else {
      q = get(`${p}.self_attn.q_proj.weight`);
      k = get(`${p}.self_attn.k_proj.weight`);
      v = get(`${p}.self_attn.v_proj.weight`);
      gate = get(`${p}.mlp.gate_proj.weight`);
      up = get(`${p}.mlp.up_proj.weight`);
    }
    layers.push({
      inputNorm: get(`${p}.input_layernorm.weight`),
      q,
      k,
      v,
      o: get(`${p}.self_attn.o_proj.weight`),
      ...(spec.attentionBias
        ? {
            qBias: get(`${p}.self_attn.q_proj.bias`),
            kBias: get(`${p}.self_attn.k_proj.bias`),
            vBias: get(`${p}.self_attn.v_proj.bias`),
          }
        : {}),
      ...(spec.qkNorm
        ? { qNorm: get(`${p}.self_attn.q_norm.weight`), kNorm: get(`${p}.self_attn.k_norm.weight`) }
        : {}),
      ...(spec.sandwichNorms
        ? {
            attnOutNorm: get(`${p}.post_attention_layernorm.weight`),
            mlpNorm: get(`${p}.pre_feedforward_layernorm.weight`),
            mlpOutNorm: get(`${p}.post_feedforward_layernorm.weight`),
          }
        : { mlpNorm: get(`${p}.post_attention_layernorm.weight`) }),
      gate,
      up,
      down: get(`${p}.mlp.down_proj.weight`),
    });
  }
  const embed = get("model.embed_tokens.weight");
  return {
    embed,
    layers,
    norm: get("model.norm.weight"),
    lmHead: spec.tiedEmbeddings ? embed : get("lm_head.weight"),
    tensors,
  };
}
