import type { EngineSpec } from "./config.ts";

/**
 * The family fields of the model fingerprint's architecture: only those that
 * differ from the Llama forward, so a Llama-family model keeps the manifest
 * (and fingerprint) it had before families existed, and two models whose
 * layers compute differently never share a fingerprint.
 */
export function familyArchitecture(spec: EngineSpec): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (spec.normOffset) out.normOffset = true;
  if (spec.qkNorm) out.qkNorm = true;
  if (spec.sandwichNorms) out.sandwichNorms = true;
  if (spec.activation !== "silu") out.activation = spec.activation;
  if (spec.scaleEmbeddings) out.scaleEmbeddings = true;
  if (spec.attnScale !== null) out.attnScale = spec.attnScale;
  if (spec.attnSoftcap !== null) out.attnSoftcap = spec.attnSoftcap;
  if (spec.finalSoftcap !== null) out.finalSoftcap = spec.finalSoftcap;
  if (spec.localRopeTheta !== undefined) out.localRopeTheta = spec.localRopeTheta;
  // Fused projections are only a checkpoint layout (the weights digest covers it).
  return out;
}
