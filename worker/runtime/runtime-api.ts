import { type ModelFingerprint, RequestId } from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import type { Calibration, ConfiguredCosts } from "../calibration/calibration.ts";
import type { AttentionLayout } from "../model/layout.ts";
import type { LogitsRules } from "../model/logits.ts";
import type { PrefixRestorer, RouteCheckpointer } from "../pages/durable-hooks.ts";
import type { TokenMachine } from "../structured/token-machine.ts";
import type { RuntimeEvent } from "./sequence.ts";

/** What WorkerRuntime is given and answers (runtime.ts). */

export interface RuntimeOptions {
  readonly fingerprint: ModelFingerprint;
  readonly vocab: number;
  /** Prompt plus generation may not exceed this (the model's positions). */
  readonly maxContext: number;
  readonly pageTokens: number;
  readonly physicalPages: number;
  /** The model's attention layout, per layer: when every layer is sliding, pages outside the window are released. */
  readonly layers: readonly AttentionLayout[];
  readonly maxBatchTokens: number;
  readonly maxBatchSeqs: number;
  readonly minPrefillTokens: number;
  readonly prefillTile: number;
  /**
   * Keeps running decodes at pace: while any decodes, prefill tiles shrink
   * (to no less than minPrefillTokens) so a mixed step takes at most this
   * many times a decode-only step, by the measured costs (PrefillPacer).
   * Absent: tiles are always prefillTile.
   */
  readonly decodePace?: number;
  /** Requests admitted or waiting at once; one more is refused (the caller answers 429). */
  readonly maxQueued: number;
  readonly costs: ConfiguredCosts;
  readonly logger: Logger;
  /** Durable prefix restore (worker/restore): absent, only resident pages are reused. */
  readonly restore?: PrefixRestorer;
  /** Checkpoint of retired routes into durable chunks (worker/checkpoint): absent, nothing is captured. */
  readonly checkpoint?: RouteCheckpointer;
}

export interface SubmitRequest {
  readonly requestId: RequestId;
  /** The tenant's cache salt: its prefixes only ever match its own. */
  readonly salt: string | undefined;
  readonly prompt: readonly number[];
  readonly maxTokens: number;
  readonly temperature: number;
  readonly topP: number;
  readonly topK: number;
  /** Absent: a fresh random seed. */
  readonly seed: number | undefined;
  readonly stopTokenIds: readonly number[];
  /** Larger is more important; preemption takes the lowest first. Default 0. */
  readonly priority?: number;
  /** Its pages are freed when it ends, neither cached nor offered for checkpoint (the warm-up request). Default false. */
  readonly ephemeral?: boolean;
  /** Keep tokens at least this fraction as likely as the most likely; default 0 (off). */
  readonly minP?: number;
  /** Penalties, logit bias, min_tokens, allowed ids; default none. */
  readonly rules?: LogitsRules;
  /** Log-probabilities of each generated token with this many alternatives; absent: none. */
  readonly logprobs?: number;
  /**
   * Log-probabilities of each prompt token after the first, with this many
   * alternatives; absent: none. Such a request computes its whole prompt
   * (no resident or restored prefix has the logits), as vLLM's does.
   */
  readonly promptLogprobs?: number;
  /** The grammar the output follows (structured output); absent: free. */
  readonly constraint?: TokenMachine;
}

/** A greedy request (temperature 0, no top-p or top-k cut, seed 1) for `prompt`, `extra` over it. */
export function greedyRequest(
  id: string,
  prompt: readonly number[],
  maxTokens: number,
  extra: Partial<SubmitRequest> = {},
): SubmitRequest {
  return {
    requestId: RequestId(id),
    salt: undefined,
    prompt: [...prompt],
    maxTokens,
    temperature: 0,
    topP: 1,
    topK: 0,
    seed: 1,
    stopTokenIds: [],
    ...extra,
  };
}

export interface RuntimeGeneration {
  readonly events: AsyncIterable<RuntimeEvent>;
  /** Fences the request at once: no token is emitted after this call. */
  cancel(): void;
  /** Where the request's time went so far (the router's terms, measured). */
  timing(): RequestTiming;
}

/**
 * Measured counterparts of the router's TTFT terms (controller/router.ts):
 * queue = submission → first admission (null until admitted); fetch = the
 * durable restore's load, begin → settled (0 without one). The rest of the
 * time to the first token is prefill and the first token's step.
 */
export interface RequestTiming {
  readonly queueMs: number | null;
  readonly fetchMs: number;
}

/** Refused at submission; nothing was queued. `status` is the HTTP status that fits. */
export class SubmitError extends Error {
  override readonly name = "SubmitError";
  constructor(
    readonly status: 400 | 429 | 503,
    message: string,
  ) {
    super(message);
  }
}

export interface RuntimeStats {
  readonly pagesTotal: number;
  /** Pages a request may be given: free or evictable, net of reservations. */
  readonly pagesAvailable: number;
  /** Pages holding nothing (some promised to reservations). */
  readonly pagesFree: number;
  /** Pages holding a cached prefix nobody references, evicted on demand (counted in pagesAvailable). */
  readonly pagesEvictable: number;
  readonly waiting: number;
  readonly running: number;
  readonly cachedPromptTokens: number;
  readonly computedPromptTokens: number;
  readonly generatedTokens: number;
  readonly steps: number;
  readonly preemptions: number;
  /** Cached pages evicted to make room (their prefixes are computed or restored again when next asked for). */
  readonly evictedPages: number;
  /** Prompt tokens adopted from pages another running request computed (a subset of cachedPromptTokens). */
  readonly sharedInFlightTokens: number;
  /** Page-table entries released outside the window (every layer sliding), each dead for every layer. */
  readonly windowReleasedPages: number;
  readonly calibration: Calibration;
  /** The scheduler's step budget and per-prompt prefill tile (rows), as heartbeats report them. */
  readonly batching: { readonly stepTokens: number; readonly prefillTile: number };
}
