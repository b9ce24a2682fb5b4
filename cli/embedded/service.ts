import { ApiError, unavailable } from "../../controller/api/errors.ts";
import { RESTORE_TIERS, type RestoreTierName } from "../../controller/api/restore-metrics.ts";
import type {
  Generation,
  GenerationEvent,
  GenerationRequest,
  InferenceService,
  ModelInfo,
  ServiceGauges,
  TextCodec,
} from "../../controller/api/service.ts";
import type { LoadedModel, ModelIdentity } from "../../worker/model/model-dir.ts";
import { SubmitError, type WorkerRuntime } from "../../worker/runtime/runtime.ts";
import type { RuntimeEvent } from "../../worker/runtime/sequence.ts";
import { codecOf } from "./codec.ts";

/** The front door's view of a loaded model: its tokenizer and chat template. */
export function textCodec(model: ModelIdentity): TextCodec {
  return codecOf(model.tokenizer, model.eosTokenIds, model.config.spec.vocab);
}

/**
 * The embedded default's inference service: the HTTP front door talks to one
 * in-process worker runtime directly (no router, no sockets). The tenant id
 * is the tenant's cache salt, so tenants never share prefix pages.
 */
export class EmbeddedService implements InferenceService {
  private readonly info: ModelInfo;

  constructor(
    private readonly runtime: WorkerRuntime,
    model: LoadedModel,
    readonly modelId: string,
    /** Prompt tokens restored from each durable tier so far (the restorer's count); absent: no durable cache. */
    private readonly restoredTokens?: () => Readonly<Record<RestoreTierName, number>>,
  ) {
    this.info = {
      id: modelId,
      created: Math.floor(Date.now() / 1000),
      maxContext: model.config.spec.maxPosition,
      codec: textCodec(model),
    };
  }

  models(): readonly ModelInfo[] {
    return [this.info];
  }

  generate(req: GenerationRequest): Generation {
    let gen: ReturnType<WorkerRuntime["submit"]>;
    try {
      gen = this.runtime.submit({
        requestId: req.requestId,
        salt: req.tenant === "default" ? undefined : req.tenant,
        prompt: req.prompt,
        maxTokens: req.maxTokens,
        temperature: req.sampling.temperature,
        topP: req.sampling.topP,
        topK: req.sampling.topK,
        seed: req.sampling.seed,
        stopTokenIds: req.stopTokenIds,
      });
    } catch (err) {
      if (err instanceof SubmitError)
        throw err.status === 503 ? unavailable(err.message) : new ApiError(err.status, err.message);
      throw err;
    }
    return { events: mapEvents(gen.events), cancel: () => gen.cancel() };
  }

  gauges(): ServiceGauges {
    const s = this.runtime.stats();
    const bySource: Record<string, number> = { recompute: s.computedPromptTokens };
    let restored = 0;
    const tiers = this.restoredTokens?.();
    for (const tier of RESTORE_TIERS) {
      bySource[tier] = tiers?.[tier] ?? 0;
      restored += bySource[tier]!;
    }
    // The runtime's cached tokens include restored ones: resident = cached − restored. A
    // restore that completed after its request was cancelled is in the restorer's count
    // only, hence the floor at 0.
    bySource.resident = Math.max(0, s.cachedPromptTokens - restored);
    return {
      // Free net of reservations, not counting the cached pages the pool would evict (as the fleet's heartbeats).
      pagesFree: Math.max(0, s.pagesAvailable - s.pagesEvictable),
      pagesTotal: s.pagesTotal,
      queueDepth: s.waiting + s.running,
      catalogLag: 0,
      cacheTokensBySource: bySource,
    };
  }
}

async function* mapEvents(events: AsyncIterable<RuntimeEvent>): AsyncIterable<GenerationEvent> {
  for await (const ev of events) {
    if (ev.type === "token") yield ev;
    else if (ev.type === "end") yield { type: "end", reason: ev.reason, cachedTokens: ev.cachedTokens };
    else yield ev;
  }
}
