import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { describe, expect, it } from "vitest";
import { BackendUnavailableError, chooseBackend, nativeBackends } from "../../native/backends.ts";
import { createEngine, liveEngineCount } from "../../native/engine.ts";
import { type ModelSpec, ropeInvFreq } from "../../native/model-spec.ts";
import { makeModel } from "./model.ts";

// headDim 64: a shape the CUDA kernels support, so a refusal below is about
// the build or the device, not the spec.
const SPEC: ModelSpec = {
  nLayers: 1,
  hidden: 64,
  nHeads: 2,
  nKvHeads: 1,
  headDim: 64,
  ffn: 32,
  vocab: 17,
  rmsEps: 1e-5,
  ropeTheta: 10000,
  attentionBias: false,
  tiedEmbeddings: true,
  maxPosition: 64,
};

const addonDir = new URL("../../native/build/", import.meta.url).pathname;
// build.mjs archives the CUDA backend here only when it builds it (node-gyp clean removes it otherwise).
const builtWithCuda = existsSync(`${addonDir}cuda/libck_cuda.a`);
const cuda = nativeBackends().cuda;

describe("chooseBackend (pure)", () => {
  const none = { built: false, devices: 0, reason: "built without CUDA" };
  const noDevice = { built: true, devices: 0, reason: "cudaErrorInsufficientDriver: no driver" };
  const oneDevice = { built: true, devices: 1 };
  it("auto takes CUDA only when it is built and sees a device", () => {
    expect(chooseBackend("auto", none)).toBe("cpu");
    expect(chooseBackend("auto", noDevice)).toBe("cpu");
    expect(chooseBackend("auto", oneDevice)).toBe("cuda");
    expect(chooseBackend("cpu", oneDevice)).toBe("cpu");
    expect(chooseBackend("cuda", oneDevice)).toBe("cuda");
  });
  it("a forced cuda that cannot run says whether the build or the device is missing", () => {
    expect(() => chooseBackend("cuda", none)).toThrow(/built without the CUDA backend/);
    expect(() => chooseBackend("cuda", noDevice)).toThrow(
      /no CUDA device is usable: cudaErrorInsufficientDriver: no driver/,
    );
    expect(() => chooseBackend("cuda", noDevice)).toThrow(BackendUnavailableError);
  });
  it("an unknown backend is refused by name", () => {
    expect(() => chooseBackend("tpu" as never, oneDevice)).toThrow(/"auto", "cpu" or "cuda", got "tpu"/);
  });
});

describe("native backends of this addon", () => {
  it("reports the CPU's vector path and whether the CUDA backend is built in, as the build left it", () => {
    const b = nativeBackends();
    expect(["generic", "avx2", "avx512"]).toContain(b.cpu.isa);
    expect(b.cpu.threads).toBeGreaterThanOrEqual(1);
    expect(b.cuda.built).toBe(builtWithCuda);
    expect(Number.isInteger(b.cuda.devices) && b.cuda.devices >= 0).toBe(true);
    // No device: the reason says why (not built, no driver, no device).
    if (b.cuda.devices === 0) expect(b.cuda.reason).toMatch(/\S/);
  });

  it("auto creates an engine on CUDA when a device is usable, else on the CPU, and it computes", async () => {
    const m = makeModel(SPEC, 7);
    const e = await createEngine(m.spec, m.weights, { threads: 1 });
    try {
      expect(e.backend).toBe(cuda.built && cuda.devices > 0 ? "cuda" : "cpu");
      e.createContiguousCache(1, 8);
      const logits = await e.stepContiguous({
        tokens: Int32Array.of(3, 5),
        positions: Int32Array.of(0, 1),
        rowSeq: Int32Array.of(0, 0),
        logitRows: Int32Array.of(1),
      });
      expect(logits.length).toBe(SPEC.vocab);
      expect(logits.every(Number.isFinite)).toBe(true);
    } finally {
      e.free();
    }
  });

  it.skipIf(cuda.devices > 0)(
    "forcing cuda without a usable device fails with the reason and creates nothing",
    async () => {
      const m = makeModel(SPEC, 7);
      const before = liveEngineCount();
      const err = await createEngine(m.spec, m.weights, { backend: "cuda" }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(BackendUnavailableError);
      expect((err as Error).message).toMatch(
        builtWithCuda ? /no CUDA device is usable: \S/ : /built without the CUDA backend/,
      );
      expect(liveEngineCount()).toBe(before);
    },
  );

  it.skipIf(cuda.devices > 0)(
    "the addon itself refuses a cuda engine it cannot make, with the reason",
    () => {
      const addon = createRequire(import.meta.url)(`${addonDir}Release/continuum_native.node`) as {
        Engine: new (spec: ModelSpec, inv: Float32Array, threads: number, backend: string) => unknown;
      };
      const inv = ropeInvFreq(SPEC);
      expect(() => new addon.Engine(SPEC, inv, 1, "cuda")).toThrow(
        builtWithCuda ? /cuda backend: no usable device \(\S/ : /built without the CUDA backend/,
      );
      expect(() => new addon.Engine(SPEC, inv, 1, "tpu")).toThrow(
        /backend must be "cpu" or "cuda", got "tpu"/,
      );
    },
  );

  it.skipIf(!builtWithCuda)("a spec the CUDA kernels cannot run is refused naming the dimension", () => {
    const addon = createRequire(import.meta.url)(`${addonDir}Release/continuum_native.node`) as {
      Engine: new (spec: ModelSpec, inv: Float32Array, threads: number, backend: string) => unknown;
    };
    const spec = { ...SPEC, headDim: 48 };
    expect(() => new addon.Engine(spec, ropeInvFreq(spec), 1, "cuda")).toThrow(/headDim 48 is not supported/);
  });
});
