/**
 * The backends an engine can compute on (the CPU engine, always built; the
 * CUDA engine, built in when nvcc was found at build time, see
 * native/build.mjs), what this addon offers, and which one an engine gets.
 */
import type { CpuFeatures, CpuIsa } from "./cpu-isa.ts";
import { cudaProbe, defaultThreads, features, kernels } from "./index.ts";

/** A backend that computes. */
export type BackendName = "cpu" | "cuda";
/** What engine creation asks for: `auto` = CUDA when built and a device is present, else CPU. */
export type BackendChoice = "auto" | BackendName;

/** Whether this addon carries the CUDA backend and what the CUDA runtime sees. */
export interface CudaStatus {
  readonly built: boolean;
  readonly devices: number;
  /** Why no device is usable (absent when devices > 0). */
  readonly reason?: string;
  /** Device 0's compute capability, e.g. "sm90" (absent without a device). */
  readonly arch?: string;
  /** The CUDA toolkit the backend was compiled with, e.g. "13.0" (absent when not built). */
  readonly toolkit?: string;
  /** The kernels' numerics tag (kNumerics, native/cuda/kernels_cuda.cuh; absent when not built). */
  readonly numerics?: string;
}

export interface NativeBackends {
  readonly cpu: { readonly isa: CpuIsa; readonly threads: number } & CpuFeatures;
  readonly cuda: CudaStatus;
}

/**
 * The backends this addon offers: the CPU's vector path and threads, and
 * whether the CUDA backend is built in and how many devices it sees (the
 * CUDA runtime is asked on each call; without a driver it answers 0 devices
 * and the reason).
 */
export function nativeBackends(): NativeBackends {
  return {
    cpu: { isa: kernels.isa(), threads: defaultThreads, ...features },
    cuda: cudaProbe(),
  };
}

export class BackendUnavailableError extends Error {
  override readonly name = "BackendUnavailableError";
}

/**
 * The backend an engine gets. Pure. `auto` takes CUDA when it is built and
 * sees a device, else CPU; `cuda` without either throws saying which.
 */
export function chooseBackend(choice: BackendChoice, cuda: CudaStatus): BackendName {
  switch (choice) {
    case "cpu":
      return "cpu";
    case "auto":
      return cuda.built && cuda.devices > 0 ? "cuda" : "cpu";
    case "cuda":
      if (!cuda.built) {
        throw new BackendUnavailableError(
          `backend "cuda" requested, but this native addon was built without the CUDA backend (${cuda.reason ?? "no nvcc at build time"}); rebuild with nvcc present (CONTINUUM_CUDA=on)`,
        );
      }
      if (cuda.devices === 0) {
        throw new BackendUnavailableError(
          `backend "cuda" requested, but no CUDA device is usable: ${cuda.reason ?? "0 devices"}`,
        );
      }
      return "cuda";
    default:
      throw new BackendUnavailableError(
        `backend must be "auto", "cpu" or "cuda", got ${JSON.stringify(choice)}`,
      );
  }
}
