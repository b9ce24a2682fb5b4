import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { type CpuFeatures, cpuIsaFromEnv } from "../../native/cpu-isa.ts";
import { features } from "../../native/index.ts";

/**
 * CONTINUUM_CPU_ISA picks the CPU kernels' vector path for a process (so an
 * AVX-512 host can measure the AVX2 path); anything else is refused with the
 * variable's name, never ignored.
 */
const ALL: CpuFeatures = { avx2: true, fma: true, f16c: true, avx512: true, vnni: true };
const AVX2_ONLY: CpuFeatures = { ...ALL, avx512: false, vnni: false };
const NONE: CpuFeatures = { avx2: false, fma: false, f16c: false, avx512: false, vnni: false };

describe("CONTINUUM_CPU_ISA", () => {
  it("unset or empty: the widest path the CPU has (null: no override)", () => {
    expect(cpuIsaFromEnv(undefined, ALL)).toBeNull();
    expect(cpuIsaFromEnv("", ALL)).toBeNull();
  });

  it("names a path the CPU has", () => {
    expect(cpuIsaFromEnv("avx2", ALL)).toBe("avx2");
    expect(cpuIsaFromEnv("avx512", ALL)).toBe("avx512");
    expect(cpuIsaFromEnv("generic", NONE)).toBe("generic");
  });

  it("refuses an unknown value or a path the CPU lacks, naming the variable", () => {
    expect(() => cpuIsaFromEnv("AVX2", ALL)).toThrow(
      /CONTINUUM_CPU_ISA must be one of generic\|avx2\|avx512/,
    );
    expect(() => cpuIsaFromEnv("sse4", ALL)).toThrow(/CONTINUUM_CPU_ISA/);
    expect(() => cpuIsaFromEnv("avx512", AVX2_ONLY)).toThrow(/CONTINUUM_CPU_ISA=avx512.*lacks AVX-512/);
    expect(() => cpuIsaFromEnv("avx2", NONE)).toThrow(/CONTINUUM_CPU_ISA=avx2.*lacks AVX2/);
  });

  it("a process started with it runs its kernels on that path", () => {
    const isa = features.avx2 && features.fma && features.f16c ? "avx2" : "generic";
    const script = 'import { kernels } from "./native/index.ts"; console.log(kernels.isa());';
    const r = spawnSync(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
      env: { ...process.env, CONTINUUM_CPU_ISA: isa },
      encoding: "utf8",
    });
    expect(r.stderr).toBe("");
    expect(r.stdout.trim()).toBe(isa);
    const bad = spawnSync(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
      env: { ...process.env, CONTINUUM_CPU_ISA: "avx3" },
      encoding: "utf8",
    });
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toMatch(/CONTINUUM_CPU_ISA must be one of/);
  });
});
