import { rowLogprobs } from "../../native/index.ts";

/**
 * What a request's own rules do to one row of logits before the draw, and
 * the log-probabilities it can ask for. Pure over the row it is given (the
 * processors rewrite it in place; the row belongs to one request's lane).
 *
 * Order, as vLLM's v1 sampler applies them:
 *   1. allowed_token_ids: every other id → −∞;
 *   2. min_tokens: the stop ids (EOS included) → −∞ while fewer than
 *      min_tokens were generated (unless that would leave no id at all);
 *   3. logit_bias: logit[id] += bias;
 *   4. penalties: repetition over prompt ∪ output ids (x > 0 ? x / r : x · r),
 *      then frequency and presence over output ids
 *      (x − f · count − p · [count > 0]).
 * Temperature, min-p, top-k and top-p follow in sampling.ts.
 */

/** A request's logits rules; the neutral value of each leaves the row unchanged. */
export interface LogitsRules {
  /** 1 = off. */
  readonly repetitionPenalty: number;
  /** 0 = off. */
  readonly presencePenalty: number;
  /** 0 = off. */
  readonly frequencyPenalty: number;
  /** Token id → added logit. */
  readonly logitBias: ReadonlyMap<number, number>;
  /** Stop ids cannot be sampled before this many tokens were generated. */
  readonly minTokens: number;
  /** null: any id. */
  readonly allowedTokenIds: ReadonlySet<number> | null;
}

export const NO_RULES: LogitsRules = {
  repetitionPenalty: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
  logitBias: new Map(),
  minTokens: 0,
  allowedTokenIds: null,
};

/** The logits rules of a request's sampling fields; an absent field is the neutral value. */
export function logitsRules(s: {
  readonly repetitionPenalty?: number;
  readonly presencePenalty?: number;
  readonly frequencyPenalty?: number;
  readonly logitBias?: readonly (readonly [number, number])[];
  readonly minTokens?: number;
  readonly allowedTokenIds?: readonly number[] | null;
}): LogitsRules {
  return {
    repetitionPenalty: s.repetitionPenalty ?? 1,
    presencePenalty: s.presencePenalty ?? 0,
    frequencyPenalty: s.frequencyPenalty ?? 0,
    logitBias: new Map(s.logitBias ?? []),
    minTokens: s.minTokens ?? 0,
    allowedTokenIds: s.allowedTokenIds == null ? null : new Set(s.allowedTokenIds),
  };
}

/** True when the rules touch no logit (the common case: nothing to do per token). */
export function rulesAreNeutral(r: LogitsRules): boolean {
  return (
    r.repetitionPenalty === 1 &&
    r.presencePenalty === 0 &&
    r.frequencyPenalty === 0 &&
    r.logitBias.size === 0 &&
    r.minTokens === 0 &&
    r.allowedTokenIds === null
  );
}

/**
 * The token counts the penalties read: how often each id was generated, and
 * the prompt's ids (repetition counts them too). Mutable, one per request;
 * O(distinct ids) memory, O(1) per generated token.
 */
export class TokenHistory {
  private readonly output = new Map<number, number>();
  private readonly prompt: ReadonlySet<number>;

  constructor(prompt: readonly number[], keepPrompt: boolean) {
    this.prompt = keepPrompt ? new Set(prompt) : new Set();
  }

  add(token: number): void {
    this.output.set(token, (this.output.get(token) ?? 0) + 1);
  }

  get outputCounts(): ReadonlyMap<number, number> {
    return this.output;
  }

  get promptIds(): ReadonlySet<number> {
    return this.prompt;
  }
}

/**
 * Applies steps 1–4 in place to `row`, the logits of `ids` (ascending; null:
 * the whole vocabulary, row[i] being id i); `generated` is the number of
 * tokens the request produced so far.
 */
export function applyRules(
  row: Float32Array,
  rules: LogitsRules,
  history: TokenHistory,
  generated: number,
  stopTokens: readonly number[],
  ids: Int32Array | null = null,
): void {
  const at = ids === null ? (id: number) => (id < row.length ? id : -1) : (id: number) => indexOf(ids, id);
  const allowed = rules.allowedTokenIds;
  if (allowed !== null) {
    for (let i = 0; i < row.length; i++)
      if (!allowed.has(ids === null ? i : ids[i]!)) row[i] = Number.NEGATIVE_INFINITY;
  }
  if (generated < rules.minTokens && stopTokens.length > 0) maskStops(row, stopTokens, at);
  for (const [id, bias] of rules.logitBias) {
    const i = at(id);
    if (i >= 0) row[i] = row[i]! + bias;
  }
  const rep = rules.repetitionPenalty;
  if (rep !== 1) {
    const penalise = (id: number) => {
      const i = at(id);
      if (i < 0) return;
      const x = row[i]!;
      row[i] = x > 0 ? x / rep : x * rep;
    };
    for (const id of history.promptIds) penalise(id);
    for (const id of history.outputCounts.keys()) if (!history.promptIds.has(id)) penalise(id);
  }
  const f = rules.frequencyPenalty;
  const p = rules.presencePenalty;
  if (f !== 0 || p !== 0) {
    for (const [id, count] of history.outputCounts) {
      const i = at(id);
      if (i >= 0) row[i] = row[i]! - f * count - p;
    }
  }
}

/** Position of `id` in ascending `ids`, or −1. */
function indexOf(ids: Int32Array, id: number): number {
  let lo = 0;
  let hi = ids.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >>> 1;
    const v = ids[mid]!;
    if (v === id) return mid;
    if (v < id) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

/** Stop ids → −∞, unless no other entry would remain finite (then min_tokens yields: a token must exist). */
function maskStops(row: Float32Array, stopTokens: readonly number[], at: (id: number) => number): void {
  const stops = new Set<number>();
  for (const t of stopTokens) {
    const i = at(t);
    if (i >= 0) stops.add(i);
  }
  let otherFinite = false;
  for (let i = 0; i < row.length && !otherFinite; i++) {
    if (!stops.has(i) && row[i]! > Number.NEGATIVE_INFINITY) otherFinite = true;
  }
  if (!otherFinite) return;
  for (const i of stops) row[i] = Number.NEGATIVE_INFINITY;
}

/** One position's log-probabilities: the chosen id's, and the `top` most likely ids' (rank order, ties by lower id). */
export interface TokenLogprob {
  readonly token: number;
  readonly logprob: number;
  /** 1 + the number of ids strictly more likely (vLLM's rank). */
  readonly rank: number;
  readonly top: readonly (readonly [token: number, logprob: number])[];
}

/** [max, Σ exp(x − max), rank] of the last rowLogprobs call (one reusable buffer: the call is synchronous). */
const rowScratch = new Float64Array(3);

/**
 * Log-probabilities at one position for `token`, with the `topN` most likely
 * ids (0: none), in one native reduction over the row (native/src/logprobs.h:
 * max, rank and top ids in one pass, Σ exp(x − max) in a second, in a fixed
 * order: the same bits in any batch). exp is f32 and the sum f64, as vLLM's
 * f32 log_softmax: log_softmax(row)[i] = row[i] − (max + log Σ).
 */
export function tokenLogprob(row: Float32Array, token: number, topN: number): TokenLogprob {
  const k = Math.min(topN, row.length);
  const ids = new Int32Array(k);
  rowLogprobs(row, token, ids, rowScratch);
  const max = rowScratch[0]!;
  const lse = max === Number.NEGATIVE_INFINITY ? max : max + Math.log(rowScratch[1]!);
  const top = new Array<readonly [number, number]>(k);
  for (let i = 0; i < k; i++) top[i] = [ids[i]!, row[ids[i]!]! - lse];
  return { token, logprob: row[token]! - lse, rank: rowScratch[2]!, top };
}
