import type { StreamQueue } from "../../schema/channel.ts";
import { ContinuationId, type RequestId } from "../../schema/ids.ts";
import type { TokenHistory, TokenLogprob } from "../model/logits.ts";
import type { SamplerState } from "../model/sampling.ts";
import { PageHashChain } from "../pages/page-hashes.ts";
import type { PreemptDisposition } from "../scheduler/request.ts";

/** What a request's consumer receives: its tokens in order, then exactly one end or error. */
export type RuntimeEvent =
  | {
      readonly type: "token";
      readonly token: number;
      /** Present when the request asked for log-probabilities. */
      readonly logprob: TokenLogprob | null;
      /**
       * On the first token of a request that scores its prompt: the
       * log-probabilities of prompt positions 1.. (the first token has none).
       */
      readonly promptLogprobs?: readonly TokenLogprob[];
    }
  | {
      readonly type: "end";
      readonly reason: "stop" | "length" | "cancelled";
      /** Prompt tokens whose attention state was reused instead of computed. */
      readonly cachedTokens: number;
    }
  | { readonly type: "error"; readonly message: string };

/**
 * One continuation the runtime keeps alive: its token history, how much of it
 * is in the KV cache, its sampler and its consumer. Mutable, owned by the
 * runtime loop alone.
 *
 * Invariant while admitted: rows [0, processed) are in the route's pages and
 * tokens[tokens.length − 1] is the pending token, so processed ≤
 * tokens.length − 1, with equality exactly when the next step is a decode.
 */
export class Sequence {
  readonly route: ContinuationId;
  readonly chain: PageHashChain;
  processed = 0;
  state: "waiting" | "running" = "waiting";
  preempted: PreemptDisposition | null = null;
  cancelled = false;
  /** Prompt tokens served from resident pages at first admission. */
  cachedTokens = -1;
  /** performance.now() at submission and at first admission (queue delay = the difference). */
  readonly submittedAt: number;
  admittedAt = 0;
  /** Its pages are freed at the end, not kept cached or offered for checkpoint (SubmitRequest.ephemeral). */
  ephemeral = false;
  /** The durable restore's load, begin → settled, in ms (0 without one; RequestTiming.fetchMs). */
  fetchMs = 0;
  /** Log-probabilities of prompt positions 1 .. 1 + length, held until the first token carries them. */
  readonly promptEntries: TokenLogprob[] = [];

  constructor(
    readonly id: RequestId,
    readonly tokens: number[],
    readonly promptLength: number,
    public sampler: SamplerState,
    /** Token counts the penalties read (the generated ids, and the prompt's for repetition). */
    readonly history: TokenHistory,
    readonly priority: number,
    readonly arrival: number,
    readonly events: StreamQueue<RuntimeEvent>,
    pageTokens: number,
    /** The tenant's cache salt (the chain root of its prefixes, page and chunk alike). */
    readonly salt: string | undefined,
    now: number,
    /** Alternatives per prompt position to score the prompt with; null: the prompt is not scored. */
    readonly promptLogprobs: number | null = null,
  ) {
    this.route = ContinuationId(`r:${id}`);
    this.chain = new PageHashChain(pageTokens, salt);
    this.submittedAt = now;
  }

  /** Adopts resident or restored prefix pages; not when the prompt is scored (they hold no logits). */
  get reusesPrefixes(): boolean {
    return this.promptLogprobs === null;
  }

  get generated(): number {
    return this.tokens.length - this.promptLength;
  }

  /** Rows this continuation can ever hold: prompt plus every token it may still generate. */
  get totalRows(): number {
    return this.tokens.length + (this.sampler.params.maxTokens - this.sampler.generated);
  }
}
