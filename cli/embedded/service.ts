import { ApiError, unavailable } from "../../controller/api/errors.ts";
import { RESTORE_TIERS, type RestoreTierName } from "../../controller/api/restore-metrics.ts";
import {
  type Generation,
  type GenerationEvent,
  type GenerationRequest,
  type InferenceService,
  type ModelInfo,
  prefixSalt,
  type ServiceGauges,
} from "../../controller/api/service.ts";
import type { Config } from "../../schema/config.ts";
import { logitsRules } from "../../worker/model/logits.ts";
import type { LoadedModel } from "../../worker/model/model-dir.ts";
import type { WorkerRuntime } from "../../worker/runtime/runtime.ts";
import { SubmitError } from "../../worker/runtime/runtime-api.ts";
import type { RuntimeEvent } from "../../worker/runtime/sequence.ts";
import { ConstraintCompiler } from "../../worker/structured/constraint.ts";
import { textCodec } from "./text-codec.ts";

/**
 * The embedded default's inference service: the HTTP front door talks to one
 * in-process worker runtime directly (no router, no sockets). The tenant id
 * is the tenant's cache salt, so tenants never share prefix pages.
 */
export class EmbeddedService implements InferenceService {
  private readonly info: ModelInfo;
  private readonly constraints: ConstraintCompiler;

  constructor(
    private readonly runtime: WorkerRuntime,
    model: LoadedModel,
    readonly modelId: string,
    /** Prompt tokens restored from each durable tier so far (the restorer's count); absent: no durable cache. */
    private readonly restoredTokens?: () => Readonly<Record<RestoreTierName, number>>,
    /** model.chatTemplate's text (replacing the model's own template) and model.toolCallParser. */
    text: {
      readonly chatTemplate?: string;
      readonly toolCallParser?: Config["model"]["toolCallParser"];
    } = {},
  ) {
    this.constraints = new ConstraintCompiler(model.tokenizer.tokenBytes());
    this.info = {
      id: modelId,
      created: Math.floor(Date.now() / 1000),
      maxContext: model.config.spec.maxPosition,
      codec: textCodec(model, text.chatTemplate, this.constraints, text.toolCallParser),
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
        salt: prefixSalt(req.tenant, req.cacheSalt),
        prompt: req.prompt,
        maxTokens: req.maxTokens,
        temperature: req.sampling.temperature,
        topP: req.sampling.topP,
        topK: req.sampling.topK,
        minP: req.sampling.minP,
        seed: req.sampling.seed,
        rules: logitsRules(req.sampling),
        stopTokenIds: req.stopTokenIds,
        priority: req.priority,
        ...(req.logprobs === null ? {} : { logprobs: req.logprobs }),
        ...(req.promptLogprobs === null ? {} : { promptLogprobs: req.promptLogprobs }),
        ...(req.constraint === null ? {} : { constraint: this.constraints.machine(req.constraint) }),
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
