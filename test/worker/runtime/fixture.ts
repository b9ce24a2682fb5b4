import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Engine, StepBatch } from "../../../native/engine.ts";
import { silentLogger } from "../../../schema/log.ts";
import { generateModel } from "../../../worker/model/generate.ts";
import { type LoadedModel, loadModelDir } from "../../../worker/model/model-dir.ts";
import { CPU_VARIANT } from "../../../worker/model/variant.ts";
import { loadEngine } from "../../../worker/runtime/engine-load.ts";
import { WorkerRuntime } from "../../../worker/runtime/runtime.ts";
import type { RuntimeOptions } from "../../../worker/runtime/runtime-api.ts";
import type { RuntimeEvent } from "../../../worker/runtime/sequence.ts";

export { greedyRequest } from "../../../worker/runtime/runtime-api.ts";

/** The tiny generated model, loaded once per test file. */
export async function tinyModel(): Promise<{ model: LoadedModel; cleanup: () => Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), "continuum-tiny-"));
  await generateModel({ preset: "tiny", out: dir, seed: 7 });
  const model = await loadModelDir(dir, { variant: CPU_VARIANT });
  return { model, cleanup: () => rm(dir, { recursive: true, force: true }) };
}

export interface RuntimeFixture {
  readonly runtime: WorkerRuntime;
  readonly engine: Engine;
  close(): Promise<void>;
}

/** A started runtime over a fresh engine for `model`. */
export async function startRuntime(
  model: LoadedModel,
  overrides: Partial<RuntimeOptions> = {},
  wrap?: (engine: Engine) => Engine,
): Promise<RuntimeFixture> {
  const f = await openRuntime(model, overrides, wrap);
  f.runtime.start();
  return f;
}

/** Like startRuntime, but the caller starts the loop (to test what happens around start). */
export async function openRuntime(
  model: LoadedModel,
  overrides: Partial<RuntimeOptions> = {},
  /** Wraps the engine the runtime steps (to observe or gate its steps); the fixture frees the real one. */
  wrap?: (engine: Engine) => Engine,
): Promise<RuntimeFixture> {
  const opts: RuntimeOptions = {
    fingerprint: model.fingerprint,
    vocab: model.config.spec.vocab,
    maxContext: model.config.spec.maxPosition,
    layers: model.config.spec.layers,
    pageTokens: 16,
    physicalPages: 512,
    maxBatchTokens: 256,
    maxBatchSeqs: 64,
    minPrefillTokens: 32,
    prefillTile: 64,
    maxQueued: 256,
    costs: {
      prefillPerTokenMs: 0.1,
      firstTokenMs: 1,
      decodeStepMs: 1,
      restorePerByteMs: { ram: 1e-6, ssd: 1e-5, peer: 1e-5, s3: 1e-4 },
    },
    logger: silentLogger,
    ...overrides,
  };
  const engine = await loadEngine(model, opts, { threads: 2 });
  const runtime = new WorkerRuntime(wrap ? wrap(engine) : engine, opts);
  return {
    runtime,
    engine,
    async close() {
      await runtime.stop();
      engine.free();
    },
  };
}

/** A deterministic prompt of `length` token ids in [5, 505) from `seed`. */
export function prompt(seed: number, length: number): number[] {
  let x = seed * 2654435761;
  return Array.from({ length }, () => {
    x = (x * 1103515245 + 12345) >>> 0;
    return 5 + (x % 500);
  });
}

/** Drains a request's events: its tokens and the event that ended it. */
export async function collect(
  events: AsyncIterable<RuntimeEvent>,
): Promise<{ tokens: number[]; end: RuntimeEvent }> {
  const tokens: number[] = [];
  for await (const ev of events) {
    if (ev.type === "token") tokens.push(ev.token);
    else return { tokens, end: ev };
  }
  throw new Error("stream ended without an end event");
}

/**
 * The engine as the runtime sees it, counting the prompt rows it computes
 * (every row of a step except the decode rows, which are its logit rows),
 * and calling `onStep` before each step with the rows computed so far.
 */
export function countingPrefill(onStep?: (prefillRowsSoFar: number) => void) {
  const seen = { prefillRows: 0 };
  const wrap = (inner: Engine): Engine =>
    new Proxy(inner, {
      get(target, key) {
        if (key === "step")
          return (batch: StepBatch) => {
            onStep?.(seen.prefillRows);
            seen.prefillRows += batch.tokens.length - batch.logitRows.length;
            return target.step(batch);
          };
        const v = Reflect.get(target, key, target);
        return typeof v === "function" ? v.bind(target) : v;
      },
    });
  return { seen, wrap };
}
