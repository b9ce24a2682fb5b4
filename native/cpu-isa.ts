/** The CPU's vector paths: what it offers, and the one a process is told to run on. */

export interface CpuFeatures {
  readonly avx2: boolean;
  readonly fma: boolean;
  readonly f16c: boolean;
  /** AVX-512 F and DQ: the batched GEMM's 512-bit column pairs. */
  readonly avx512: boolean;
  /** AVX512-VNNI with AVX512-VL: the "avx512" path's quantized products use vpdpbusd. */
  readonly vnni: boolean;
}

export type CpuIsa = "generic" | "avx2" | "avx512";
const CPU_ISAS: readonly CpuIsa[] = ["generic", "avx2", "avx512"];

/**
 * The vector path a process runs its CPU kernels on: `CONTINUUM_CPU_ISA`
 * (generic, avx2 or avx512) when set, else the widest the CPU has. The
 * paths compute the same bits (kernels.h), so the choice changes speed only:
 * it lets an AVX-512 host measure the AVX2 path most CPUs take. A value that
 * is not one of the three, or a path the CPU lacks, is an error naming the
 * variable.
 */
export function cpuIsaFromEnv(value: string | undefined, cpu: CpuFeatures): CpuIsa | null {
  if (value === undefined || value === "") return null;
  if (!(CPU_ISAS as readonly string[]).includes(value))
    throw new Error(`CONTINUUM_CPU_ISA must be one of ${CPU_ISAS.join("|")}, got ${JSON.stringify(value)}`);
  const isa = value as CpuIsa;
  const avx2 = cpu.avx2 && cpu.fma && cpu.f16c;
  if ((isa === "avx2" && !avx2) || (isa === "avx512" && !(avx2 && cpu.avx512)))
    throw new Error(
      `CONTINUUM_CPU_ISA=${isa}, but this CPU lacks ${isa === "avx2" ? "AVX2, FMA or F16C" : "AVX-512 F/DQ/BW"}`,
    );
  return isa;
}
