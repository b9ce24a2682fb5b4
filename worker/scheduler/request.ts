import type { ModelFingerprint, PageCount, PrefixHash, RequestId, TokenCount } from "../../schema/ids.ts";

/** What a request's next rows are: one pending token, or prompt rows. */
export type Phase = "decode" | "prefill";

/**
 * How a preempted request gives up its pages, and so how it resumes:
 *   keep-resident — only its unallocated reservation is returned; pages stay, resume is free;
 *   drop          — its route is released; its full pages stay cached in the pool, so a
 *                   resumption adopts those still there and recomputes the rest.
 */
export type PreemptDisposition = "keep-resident" | "drop";

/**
 * One request as the scheduler sees it. Rows `tokens[0, processed)` are in the
 * KV cache; the last token of `tokens` is the pending token (sampled or the
 * prompt's last) and is fed by the next decode step, so a request decodes
 * exactly when processed = tokens.length − 1.
 */
export interface RequestRecord {
  readonly id: RequestId;
  readonly model: ModelFingerprint;
  /** Token history: prompt then generated tokens; never empty. */
  readonly tokens: readonly number[];
  readonly processed: TokenCount;
  /** Equal to the last element of `tokens`. */
  readonly pendingToken: number;
  /** Larger is more important. */
  readonly priority: number;
  /** Logical arrival time; earlier is older. */
  readonly arrival: number;
  /** Admitted requests hold a reservation; waiting ones (new or preempted) do not. */
  readonly state: "running" | "waiting";
  /** Every page event (restore, copy) of the request completed. */
  readonly runnable: boolean;
  /** Waiting only: pages its admission must reserve (resident pages already credited). */
  readonly admitPages: PageCount;
  /** Running only: unallocated reserved pages, returned on any preemption. */
  readonly reservedPages: PageCount;
  /** Running only: allocated pages that free when its route is released (unshared ones). */
  readonly releasablePages: PageCount;
  /** Waiting only: set when the request was preempted, so its admission is a resumption. */
  readonly preempted: PreemptDisposition | null;
  /**
   * The prefix-chain hash of the page that holds this request's next prompt
   * row (page ⌊processed / pageTokens⌋) when that page is a full page of its
   * prompt; null otherwise (a partial tail page, a decode, or no identity).
   * Two requests with the same value need the same page computed: one
   * computes it, the other waits and shares it (in-flight prefix sharing).
   */
  readonly nextPageHash: PrefixHash | null;
}

export interface Budgets {
  readonly model: ModelFingerprint;
  readonly pageTokens: number;
  /** Rows processed per iteration across all lanes. */
  readonly maxBatchTokens: number;
  /** Lanes (sequences) per iteration. */
  readonly maxBatchSeqs: number;
  /** Rows held back from decode for prefill whenever some wait, so they never starve. */
  readonly minPrefillTokens: number;
  /** Rows per prefill tile of one prompt. */
  readonly prefillTile: number;
  /** Free (or evictable cached) pages not promised to any reservation. */
  readonly availablePages: PageCount;
}

export class SchedulerInputError extends Error {
  override readonly name = "SchedulerInputError";
}

/** A request's phase and remaining rows in it, derived from its record. */
export function phaseOf(r: RequestRecord): { phase: Phase; remaining: number } {
  const prompt = r.tokens.length - 1 - r.processed;
  if (prompt > 0) return { phase: "prefill", remaining: prompt };
  return { phase: "decode", remaining: 1 };
}
