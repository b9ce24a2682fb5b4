import type { BackendName, CudaStatus } from "../../native/backends.ts";

/**
 * Execution variants: the name, in the model fingerprint, of the numerics an
 * engine's K/V bytes and logits depend on. Chunks are reused as exact only
 * between engines of one variant (the fingerprint differs otherwise, so the
 * catalog's node ids, the router's model constraint and the restorer's
 * lookups all keep the variants apart). The one place that maps an engine to
 * its variant.
 *
 * - CPU: every ISA path computes the same bits (kernels.h), one variant.
 * - CUDA: `cuda-<arch>-cu<toolkit>/<numerics>`: the device architecture
 *   selects the machine code that runs (and the tensor cores' internal
 *   accumulation), the toolkit the compiler's instruction choices (e.g. which
 *   a·b + c become fused), and the numerics tag the kernels' summation order
 *   and operand precision (kNumerics in native/cuda/kernels_cuda.cuh, bumped
 *   with any change to them). Two builds that agree on all three compute the
 *   same bits.
 */
export const CPU_VARIANT = "cpu-f32acc/v1";

/** The variant an engine of `backend` computes on this machine (`cuda` as nativeBackends() reports it). */
export function executionVariant(backend: BackendName, cuda: CudaStatus): string {
  if (backend === "cpu") return CPU_VARIANT;
  if (!cuda.built || cuda.toolkit === undefined || cuda.numerics === undefined)
    throw new RangeError("the CUDA engine's variant needs an addon built with the CUDA backend");
  if (cuda.arch === undefined)
    throw new RangeError(
      `the CUDA engine's variant needs a device's architecture (${cuda.reason ?? "none seen"})`,
    );
  return `cuda-${cuda.arch}-cu${cuda.toolkit}/${cuda.numerics}`;
}

export class VariantMismatchError extends Error {
  override readonly name = "VariantMismatchError";
}

/**
 * The variant a process that runs an engine serves under: its engine's own
 * for `configured` "auto"; a named one (config model.variant) must be exactly
 * the engine's, so a worker on other hardware refuses to start instead of
 * joining a fleet whose controller never routes to it.
 */
export function servedVariant(configured: string, engine: string): string {
  if (configured === "auto" || configured === engine) return engine;
  throw new VariantMismatchError(
    `model.variant is ${configured}, but this process's engine computes ${engine} (set model.variant to auto or to that)`,
  );
}

/** The variant a fleet controller routes to (it runs no engine): "auto" is the CPU engine's. */
export function routedVariant(configured: string): string {
  return configured === "auto" ? CPU_VARIANT : configured;
}
