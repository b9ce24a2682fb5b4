import type { Config } from "../schema/config.ts";
import type { Logger } from "../schema/log.ts";
import type { LoadedModel } from "../worker/model/model-dir.ts";
import type { RuntimeOptions } from "../worker/runtime/runtime-api.ts";

/**
 * A worker runtime's options from the configuration and the loaded model:
 * the same for the embedded default and a fleet worker. Costs start from
 * configured guesses for a CPU engine (the restore tiers' from
 * worker.restorePriorMsPerByte); calibration replaces each with measurements
 * after its first sample.
 */
export function runtimeOptions(config: Config, model: LoadedModel, logger: Logger): RuntimeOptions {
  const s = config.scheduler;
  return {
    fingerprint: model.fingerprint,
    vocab: model.config.spec.vocab,
    maxContext: model.config.spec.maxPosition,
    pageTokens: config.pages.pageTokens,
    layers: model.config.spec.layers,
    physicalPages: config.pages.physicalPages,
    maxBatchTokens: s.maxBatchTokens,
    maxBatchSeqs: s.maxBatchSeqs,
    minPrefillTokens: s.minPrefillTokens,
    prefillTile: s.prefillTile,
    ...(s.decodePace > 0 ? { decodePace: s.decodePace } : {}),
    maxQueued: 4 * s.maxBatchSeqs,
    costs: {
      prefillPerTokenMs: 0.5,
      firstTokenMs: 5,
      decodeStepMs: 5,
      restorePerByteMs: { ...config.worker.restorePriorMsPerByte },
    },
    logger,
  };
}
