import { createHash } from "node:crypto";
import { type ModelManifest, modelFingerprint } from "../../schema/identity.ts";
import type { ModelFingerprint } from "../../schema/ids.ts";
import type { EngineSpec } from "./config.ts";
import { familyArchitecture } from "./family-manifest.ts";
import { layoutName } from "./layout.ts";
import type { LoadedTensor, SafetensorsCheckpoint } from "./safetensors.ts";

/**
 * The model fingerprint (schema/identity.ts): sha256 of the canonical
 * manifest {weightsDigest, architecture, weightFormat (block-quantized models
 * only), kvDtype, layout, variant}. Two workers share attention state only when all of these agree.
 */
export const WEIGHTS_DIGEST_TAG = "continuum/weights/v1";
export const KV_DTYPE = "f16";
/** The layout name of an all-global model (layout.ts). */
export { KV_LAYOUT } from "./layout.ts";

/**
 * sha256(tag ‖ for each tensor in name order: u32 len ‖ name ‖ u32 len ‖ dtype
 * ‖ u32 rank ‖ u64 dims… ‖ u64 byteLength ‖ bytes), all little-endian. Names
 * are compared as strings of code units (checkpoint names are ASCII).
 */
export function weightsDigest(tensors: Iterable<LoadedTensor>): string {
  const sorted = sortedByName([...tensors]);
  const h = createHash("sha256").update(WEIGHTS_DIGEST_TAG);
  for (const t of sorted) h.update(tensorHead(t, t.data.byteLength)).update(t.data);
  return h.digest("hex");
}

/**
 * The same digest read from a checkpoint one bounded span at a time: the
 * weights are never held (memory: one span), for a process that needs the
 * fingerprint but runs no model (the fleet controller).
 */
export async function streamWeightsDigest(
  ckpt: SafetensorsCheckpoint,
  names: Iterable<string>,
  spanBytes = 8 << 20,
): Promise<string> {
  const sorted = sortedByName([...names].map((n) => ckpt.info(n)));
  const h = createHash("sha256").update(WEIGHTS_DIGEST_TAG);
  for (const t of sorted) {
    h.update(tensorHead(t, t.byteLength));
    await ckpt.stream(t.name, spanBytes, (span) => h.update(span));
  }
  return h.digest("hex");
}

function sortedByName<T extends { readonly name: string }>(tensors: T[]): T[] {
  const sorted = tensors.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (let i = 1; i < sorted.length; i++)
    if (sorted[i]!.name === sorted[i - 1]!.name)
      throw new RangeError(`tensor '${sorted[i]!.name}' given twice`);
  return sorted;
}

/**
 * The same digest over tensors read one at a time in name order through
 * `read` (memory: one tensor), for a file whose stored bytes are not the
 * loaded ones (a GGUF's permuted q/k rows).
 */
export async function readWeightsDigest(
  tensors: Iterable<Pick<LoadedTensor, "name" | "dtype" | "shape">>,
  read: (name: string) => Promise<Uint8Array>,
): Promise<string> {
  const h = createHash("sha256").update(WEIGHTS_DIGEST_TAG);
  for (const t of sortedByName([...tensors])) {
    const data = await read(t.name);
    h.update(tensorHead(t, data.byteLength)).update(data);
  }
  return h.digest("hex");
}

const FLOAT_DTYPES = new Set(["f32", "f16", "bf16"]);
const INT8_DOT = new Set(["q8_0", "q4_0", "q6_k", "q4_k"]);

/**
 * The manifest's weightFormat: the distinct tensor types, lowercase, sorted,
 * joined by "+" — or undefined when every tensor is f32/f16/bf16. The weights
 * digest already names each tensor's dtype, so a float model's fingerprint
 * needs no more, and leaving the field out keeps the fingerprints (and every
 * chunk published under them) of the float models that predate block formats.
 */
export function weightFormatOf(dtypes: Iterable<string>): string | undefined {
  const formats = [...new Set([...dtypes].map((d) => d.toLowerCase()))].sort();
  if (formats.every((f) => FLOAT_DTYPES.has(f))) return undefined;
  // Block-format products quantize their activations to int8 blocks
  // (native/src/quant_dot.h): other bits than the f32 product the first
  // GGUF builds computed, so their chunks must not meet under one name.
  const int8 = formats.some((f) => INT8_DOT.has(f));
  return `${formats.join("+")}${int8 ? "/int8-dot" : ""}`;
}

/** u32 len ‖ name ‖ u32 len ‖ dtype ‖ u32 rank ‖ u64 dims… ‖ u64 byteLength. */
function tensorHead(t: Pick<LoadedTensor, "name" | "dtype" | "shape">, byteLength: number): Buffer {
  const name = Buffer.from(t.name, "utf8");
  const dtype = Buffer.from(t.dtype, "ascii");
  const head = Buffer.alloc(4 + name.length + 4 + dtype.length + 4 + 8 * t.shape.length + 8);
  let o = head.writeUInt32LE(name.length, 0);
  o += name.copy(head, o);
  o = head.writeUInt32LE(dtype.length, o);
  o += dtype.copy(head, o);
  o = head.writeUInt32LE(t.shape.length, o);
  for (const d of t.shape) o = head.writeBigUInt64LE(BigInt(d), o);
  head.writeBigUInt64LE(BigInt(byteLength), o);
  return head;
}

/**
 * The config fields that shape the computation, normalised (what the engine
 * sees). maxPosition is left out: it bounds how long a context may grow but
 * changes no value computed inside that bound. The per-layer attention
 * layout goes into the manifest's `layout`.
 */
export function architectureOf(spec: EngineSpec): Record<string, unknown> {
  return {
    family: spec.family,
    nLayers: spec.nLayers,
    hidden: spec.hidden,
    nHeads: spec.nHeads,
    nKvHeads: spec.nKvHeads,
    headDim: spec.headDim,
    vHeadDim: spec.vHeadDim,
    ffn: spec.ffn,
    vocab: spec.vocab,
    rmsEps: spec.rmsEps,
    ropeTheta: spec.ropeTheta,
    ropeScaling: spec.ropeScaling ?? null,
    attentionBias: spec.attentionBias,
    tiedEmbeddings: spec.tiedEmbeddings,
    ...familyArchitecture(spec),
  };
}

export function modelManifest(
  spec: EngineSpec,
  tensors: Iterable<LoadedTensor>,
  variant: string,
): ModelManifest {
  const all = [...tensors];
  return manifestOf(spec, weightsDigest(all), variant, weightFormatOf(all.map((t) => t.dtype)));
}

/** The manifest around a weights digest however it was computed (loaded or streamed). */
export function manifestOf(
  spec: EngineSpec,
  digest: string,
  variant: string,
  weightFormat: string | undefined,
): ModelManifest {
  if (variant.length === 0) throw new RangeError("execution variant must be named");
  return {
    weightsDigest: digest,
    architecture: architectureOf(spec),
    ...(weightFormat === undefined ? {} : { weightFormat }),
    kvDtype: KV_DTYPE,
    layout: layoutName(spec.layers),
    variant,
  };
}

export function fingerprintOf(
  spec: EngineSpec,
  tensors: Iterable<LoadedTensor>,
  variant: string,
): ModelFingerprint {
  return modelFingerprint(modelManifest(spec, tensors, variant));
}
