import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BackendUnavailableError, type CudaStatus, nativeBackends } from "../../../native/backends.ts";
import { generateModel } from "../../../worker/model/generate.ts";
import { loadModelIdentity } from "../../../worker/model/model-dir.ts";
import {
  CPU_VARIANT,
  executionVariant,
  routedVariant,
  servedVariant,
  VariantMismatchError,
} from "../../../worker/model/variant.ts";
import { chooseEngine } from "../../../worker/runtime/engine-load.ts";

/** A CUDA build as the probe reports it on a machine with one H200. */
const H200: CudaStatus = {
  built: true,
  devices: 1,
  arch: "sm90",
  toolkit: "13.0",
  numerics: "gemm-mma16816.f32acc.k256+attn-mma.hilo.s512/v1",
};

describe("executionVariant: one name per engine's numerics", () => {
  it("pins the CPU engine's variant (every chunk a CPU worker publishes is named by it)", () => {
    expect(CPU_VARIANT).toBe("cpu-f32acc/v1");
    expect(executionVariant("cpu", H200)).toBe(CPU_VARIANT);
    expect(executionVariant("cpu", { built: false, devices: 0 })).toBe(CPU_VARIANT);
  });

  it("names the CUDA engine by device architecture, toolkit and kernel numerics", () => {
    expect(executionVariant("cuda", H200)).toBe(
      "cuda-sm90-cu13.0/gemm-mma16816.f32acc.k256+attn-mma.hilo.s512/v1",
    );
    const others = [
      { ...H200, arch: "sm100" },
      { ...H200, toolkit: "12.8" },
      { ...H200, numerics: "gemm-mma16816.f32acc.k256+attn-mma.hilo.s512/v2" },
    ].map((c) => executionVariant("cuda", c));
    expect(new Set([executionVariant("cuda", H200), CPU_VARIANT, ...others]).size).toBe(5);
  });

  it("has no CUDA variant without a CUDA build or a device", () => {
    expect(() => executionVariant("cuda", { built: false, devices: 0, reason: "not built" })).toThrow(
      /addon built with the CUDA backend/,
    );
    const { arch: _, ...noArch } = H200;
    expect(() => executionVariant("cuda", { ...noArch, devices: 0, reason: "no driver" })).toThrow(
      /device's architecture \(no driver\)/,
    );
  });

  it("this addon reports what a CUDA engine's variant is made of, as it was built", () => {
    const cuda = nativeBackends().cuda;
    if (cuda.built) {
      expect(cuda.toolkit).toMatch(/^\d+\.\d+$/);
      expect(cuda.numerics).toMatch(/^[a-z0-9][a-z0-9.+_-]*(\/[a-z0-9][a-z0-9.+_-]*)*$/);
      if (cuda.devices === 0) expect(cuda.arch).toBeUndefined();
      else expect(cuda.arch).toMatch(/^sm\d+$/);
    } else {
      expect(cuda.toolkit).toBeUndefined();
      expect(cuda.numerics).toBeUndefined();
    }
  });
});

describe("the variant a process serves or routes", () => {
  it("a process with an engine takes its engine's, and a named model.variant must be exactly that", () => {
    expect(servedVariant("auto", CPU_VARIANT)).toBe(CPU_VARIANT);
    const gpu = executionVariant("cuda", H200);
    expect(servedVariant(gpu, gpu)).toBe(gpu);
    expect(() => servedVariant(gpu, CPU_VARIANT)).toThrow(VariantMismatchError);
    expect(() => servedVariant(CPU_VARIANT, gpu)).toThrow(
      `model.variant is ${CPU_VARIANT}, but this process's engine computes ${gpu}`,
    );
  });

  it("the controller routes to the named variant, or the CPU engine's for auto", () => {
    expect(routedVariant("auto")).toBe(CPU_VARIANT);
    const gpu = executionVariant("cuda", H200);
    expect(routedVariant(gpu)).toBe(gpu);
  });

  it("chooseEngine resolves worker.backend and model.variant on this machine", () => {
    const cuda = nativeBackends().cuda;
    expect(chooseEngine("cpu", "auto")).toEqual({ backend: "cpu", variant: CPU_VARIANT });
    expect(() => chooseEngine("cpu", executionVariant("cuda", H200))).toThrow(VariantMismatchError);
    if (cuda.devices === 0) {
      expect(chooseEngine("auto", "auto")).toEqual({ backend: "cpu", variant: CPU_VARIANT });
      expect(() => chooseEngine("cuda", "auto")).toThrow(BackendUnavailableError);
    } else {
      expect(chooseEngine("auto", "auto")).toEqual({
        backend: "cuda",
        variant: executionVariant("cuda", cuda),
      });
    }
  });
});

describe("the variant is part of the model fingerprint", () => {
  let root: string;
  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "continuum-variant-"));
  });
  afterAll(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it("the same weights under another variant name other chunks", async () => {
    const dir = (await generateModel({ preset: "tiny", out: join(root, "tiny") })).dir;
    const cpu = await loadModelIdentity(dir, { variant: CPU_VARIANT });
    const gpu = await loadModelIdentity(dir, { variant: executionVariant("cuda", H200) });
    expect(gpu.manifest.weightsDigest).toBe(cpu.manifest.weightsDigest);
    expect(gpu.fingerprint).not.toBe(cpu.fingerprint);
  });
});
