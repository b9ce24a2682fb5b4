import type { StopRules } from "./request-sampling.ts";
import type { FinishReason, Generation, GenerationFailure, TextCodec, TokenLogprob } from "./service.ts";
import { IncrementalDetokenizer, StopMatcher } from "./text-stream.ts";

/** What one choice adds to its response between two emits. */
export interface ChoiceDelta {
  readonly index: number;
  /** Text released since the last delta (stop-sequence holds may delay it). */
  readonly text: string;
  /** Ids generated since the last delta, with their log-probabilities when asked for. */
  readonly tokens: readonly number[];
  readonly logprobs: readonly TokenLogprob[];
  readonly finish: FinishReason | null;
  /** vLLM's stop_reason: the stop string or stop_token_id that ended the choice (null: EOS, length, none). */
  readonly stopReason: string | number | null;
}

export interface ChoiceOptions {
  readonly stop: StopRules;
  /** The model's EOS ids (they end generation unless stop.ignoreEos). */
  readonly eosTokenIds: readonly number[];
  readonly skipSpecialTokens: boolean;
  /** Stop strings are matched only after this many tokens (vLLM's min_tokens rule). */
  readonly minTokens: number;
  /** Score the prompt only: generated tokens are dropped (echo with max_tokens 0). */
  readonly discardGenerated?: boolean;
}

/**
 * One choice being generated: its generation and its text pipeline (incremental
 * detokenization, then stop strings). A state machine over the generation's
 * events, pure apart from cancelling its own generation when a stop string
 * ends it; the caller drives it and sends what it returns.
 */
export class ChoiceRun {
  completionTokens = 0;
  cachedTokens = 0;
  text = "";
  readonly tokens: number[] = [];
  readonly logprobs: TokenLogprob[] = [];
  finish: FinishReason | null = null;
  stopReason: string | number | null = null;
  /** Why the choice failed, when it ended with an error instead of a finish reason. */
  error: string | null = null;
  /** Whose failure it was (service.ts GenerationEvent); null: internal. */
  failure: GenerationFailure | null = null;
  /** Prompt positions 1.. scored by the worker (null: the prompt was not scored). */
  promptLogprobs: readonly TokenLogprob[] | null = null;
  /** Σ of the generated tokens' log-probabilities (best_of ranks choices by it). */
  cumulativeLogprob = 0;
  private readonly detok: IncrementalDetokenizer;
  private readonly stopper: StopMatcher;
  private readonly endIds: ReadonlySet<number>;
  private lastEndToken: number | null = null;

  constructor(
    readonly index: number,
    /** The prompt's token ids. */
    readonly prompt: readonly number[],
    readonly gen: Generation,
    codec: TextCodec,
    private readonly opts: ChoiceOptions,
  ) {
    this.detok = new IncrementalDetokenizer((ids) =>
      codec.decode(ids, { skipSpecialTokens: opts.skipSpecialTokens }),
    );
    this.stopper = new StopMatcher(opts.stop.strings, opts.stop.includeStopStr);
    this.endIds = new Set([...opts.stop.tokenIds, ...(opts.stop.ignoreEos ? [] : opts.eosTokenIds)]);
  }

  get promptTokens(): number {
    return this.prompt.length;
  }

  /** A generated token; null when nothing is to be sent (the choice already stopped). */
  onToken(
    token: number,
    logprob: TokenLogprob | null | undefined,
    promptLogprobs?: readonly TokenLogprob[],
  ): ChoiceDelta | null {
    if (promptLogprobs) this.promptLogprobs = promptLogprobs;
    if (this.stopper.isStopped || this.opts.discardGenerated) return null;
    if (logprob) this.cumulativeLogprob += logprob.logprob;
    this.completionTokens++;
    this.tokens.push(token);
    if (logprob) this.logprobs.push(logprob);
    let piece = "";
    if (this.endIds.has(token)) {
      // The runtime ends on it: its text is kept only with include_stop_str_in_output (vLLM).
      this.lastEndToken = token;
      if (this.opts.stop.includeStopStr) piece = this.detok.push(token);
    } else {
      piece = this.detok.push(token);
    }
    const out = this.stopper.push(piece, this.completionTokens > this.opts.minTokens);
    if (out.stopped) {
      this.stopReason = this.stopper.matched;
      this.gen.cancel();
    }
    this.text += out.emit;
    return {
      index: this.index,
      text: out.emit,
      tokens: [token],
      logprobs: logprob ? [logprob] : [],
      finish: null,
      stopReason: null,
    };
  }

  /** The generation ended: the held text and the finish reason. */
  onEnd(reason: FinishReason, cachedTokens: number): ChoiceDelta {
    this.cachedTokens = cachedTokens;
    if (this.opts.discardGenerated) {
      // Nothing was generated for the client: the prompt's scoring is the whole answer.
      this.finish = reason === "cancelled" ? "cancelled" : "length";
      return { index: this.index, text: "", tokens: [], logprobs: [], finish: this.finish, stopReason: null };
    }
    let tail = "";
    if (!this.stopper.isStopped) {
      tail = this.stopper.push(this.detok.flush()).emit + this.stopper.flush();
      if (this.stopper.isStopped) this.stopReason = this.stopper.matched;
    }
    this.text += tail;
    if (this.stopper.isStopped) this.finish = "stop";
    else {
      this.finish = reason;
      const t = this.lastEndToken;
      // vLLM: the stop_token_id that ended it; EOS is no stop reason.
      if (reason === "stop" && t !== null && this.opts.stop.tokenIds.includes(t) && !this.isEos(t))
        this.stopReason = t;
    }
    return {
      index: this.index,
      text: tail,
      tokens: [],
      logprobs: [],
      finish: this.finish,
      stopReason: this.stopReason,
    };
  }

  onError(message: string, failure: GenerationFailure | null = null): void {
    this.finish = null;
    this.error = message;
    this.failure = failure;
  }

  private isEos(t: number): boolean {
    return !this.opts.stop.ignoreEos && this.opts.eosTokenIds.includes(t);
  }
}

/** The ids that end generation for a request (its stop_token_ids and, unless ignore_eos, the model's EOS ids). */
export function endTokenIds(stop: StopRules, eosTokenIds: readonly number[]): number[] {
  return [...new Set([...stop.tokenIds, ...(stop.ignoreEos ? [] : eosTokenIds)])];
}
