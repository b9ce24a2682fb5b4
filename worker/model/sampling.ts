import type { TokenMachine } from "../structured/token-machine.ts";
import {
  applyRules,
  type LogitsRules,
  NO_RULES,
  rulesAreNeutral,
  type TokenHistory,
  type TokenLogprob,
  tokenLogprob,
} from "./logits.ts";
import { Rng, type RngState, seedRng } from "./prng.ts";

/**
 * Per-request sampling. Pure: logits, parameters and the request's RNG state
 * in; a token and the next RNG state out. The state belongs to the request
 * (never to shared KV pages), so any number of requests can continue one
 * shared prefix, each with its own sampler, and a request's choices depend
 * only on its own seed and its own logits.
 *
 * Order of operations (vLLM's v1 sampler): the request's logits rules
 * (logits.ts: allowed ids, min_tokens, logit_bias, penalties), then greedy
 * argmax when temperature is 0 (ties to the lowest id), else temperature,
 * min-p, top-k, top-p and one uniform draw. Log-probabilities, when asked
 * for, are the raw model's (before any rule or temperature), as vLLM returns
 * by default.
 */
export interface SamplingParams {
  /** 0 = greedy. */
  readonly temperature: number;
  /** Keep the k most likely tokens; 0 = no limit. */
  readonly topK: number;
  /** Keep the smallest set of most likely tokens whose mass reaches p; 1 = no limit. */
  readonly topP: number;
  /** Keep tokens whose probability is at least minP × the largest; 0 = no limit. */
  readonly minP: number;
  readonly seed: number;
  /** Penalties, logit bias, min_tokens, allowed ids. */
  readonly rules: LogitsRules;
  /** Log-probabilities of each sampled token with this many alternatives; null: none. */
  readonly logprobs: number | null;
  /** The output is constrained to this grammar (structured output); null: free. */
  readonly constraint: TokenMachine | null;
  /** Generation stops after emitting any of these. */
  readonly stopTokens: readonly number[];
  /** Generation stops after this many tokens. */
  readonly maxTokens: number;
}

export const GREEDY: SamplingParams = {
  temperature: 0,
  topK: 0,
  topP: 1,
  minP: 0,
  seed: 0,
  rules: NO_RULES,
  logprobs: null,
  constraint: null,
  stopTokens: [],
  maxTokens: 256,
};

export class SamplingParamsError extends Error {
  override readonly name = "SamplingParamsError";
}

/** Validates and fills defaults; throws naming the first bad field. */
export function samplingParams(p: Partial<SamplingParams>): SamplingParams {
  const out = { ...GREEDY, ...p };
  if (!Number.isFinite(out.temperature) || out.temperature < 0)
    throw new SamplingParamsError(`temperature must be >= 0, got ${out.temperature}`);
  if (!Number.isSafeInteger(out.topK) || out.topK < 0)
    throw new SamplingParamsError(`top_k must be a non-negative integer, got ${out.topK}`);
  if (!Number.isFinite(out.topP) || out.topP <= 0 || out.topP > 1)
    throw new SamplingParamsError(`top_p must be in (0, 1], got ${out.topP}`);
  if (!Number.isFinite(out.minP) || out.minP < 0 || out.minP > 1)
    throw new SamplingParamsError(`min_p must be in [0, 1], got ${out.minP}`);
  const r = out.rules;
  if (!Number.isFinite(r.repetitionPenalty) || r.repetitionPenalty <= 0)
    throw new SamplingParamsError(`repetition_penalty must be > 0, got ${r.repetitionPenalty}`);
  if (!Number.isFinite(r.presencePenalty) || !Number.isFinite(r.frequencyPenalty))
    throw new SamplingParamsError("presence_penalty and frequency_penalty must be finite");
  if (!Number.isSafeInteger(r.minTokens) || r.minTokens < 0)
    throw new SamplingParamsError(`min_tokens must be a non-negative integer, got ${r.minTokens}`);
  for (const [id, bias] of r.logitBias)
    if (!Number.isSafeInteger(id) || id < 0 || !Number.isFinite(bias))
      throw new SamplingParamsError(`logit_bias entry ${id}: ${bias} is not a token id and a finite bias`);
  if (r.allowedTokenIds !== null && r.allowedTokenIds.size === 0)
    throw new SamplingParamsError("allowed_token_ids must not be empty");
  if (out.logprobs !== null && (!Number.isSafeInteger(out.logprobs) || out.logprobs < 0))
    throw new SamplingParamsError(`logprobs must be a non-negative integer, got ${out.logprobs}`);
  if (!Number.isSafeInteger(out.seed))
    throw new SamplingParamsError(`seed must be an integer, got ${out.seed}`);
  if (!Number.isSafeInteger(out.maxTokens) || out.maxTokens <= 0)
    throw new SamplingParamsError(`max_tokens must be a positive integer, got ${out.maxTokens}`);
  for (const t of out.stopTokens)
    if (!Number.isSafeInteger(t) || t < 0) throw new SamplingParamsError(`stop token ${t} is not a token id`);
  return out;
}

/** Index of the largest logit; ties go to the lowest id. */
export function argmax(logits: ArrayLike<number>): number {
  if (logits.length === 0) throw new RangeError("argmax of no logits");
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i]! > logits[best]!) best = i;
  return best;
}

/**
 * The tokens sampling may choose and their probabilities, most likely first
 * (ties by lower id), after temperature, top-k and top-p. Exposed so tests
 * and callers can see the support the draw picks from.
 */
export function candidates(logits: ArrayLike<number>, p: SamplingParams): { ids: number[]; probs: number[] } {
  if (p.temperature === 0) return { ids: [argmax(logits)], probs: [1] };
  const n = logits.length;
  const k = p.topK > 0 ? Math.min(p.topK, n) : n;
  const kept = p.minP > 0 ? minPKept(logits, p.minP, p.temperature, k) : mostLikely(logits, k);
  // softmax(logit / T) over the kept set, stabilised by the largest logit.
  const top = logits[kept[0]!]!;
  let sum = 0;
  const w = kept.map((id) => {
    const e = Math.exp((logits[id]! - top) / p.temperature);
    sum += e;
    return e;
  });
  let probs = w.map((x) => x / sum);
  let ids2 = kept;
  if (p.topP < 1) {
    let mass = 0;
    let cut = probs.length;
    for (let i = 0; i < probs.length; i++) {
      mass += probs[i]!;
      if (mass >= p.topP) {
        cut = i + 1;
        break;
      }
    }
    ids2 = kept.slice(0, cut);
    const renorm = probs.slice(0, cut).reduce((a, b) => a + b, 0);
    probs = probs.slice(0, cut).map((x) => x / renorm);
  }
  return { ids: ids2, probs };
}

/**
 * min-p then top-k: p_i ≥ minP · p_max at temperature T is
 * logit_i ≥ max + T · ln(minP), so only ids above that threshold are
 * ordered (a prefix of the sampling order, like top-k's, so the two commute).
 */
function minPKept(logits: ArrayLike<number>, minP: number, temperature: number, k: number): number[] {
  let max = Number.NEGATIVE_INFINITY;
  for (let i = 0; i < logits.length; i++) if (logits[i]! > max) max = logits[i]!;
  const threshold = max + temperature * Math.log(minP);
  const ids: number[] = [];
  for (let i = 0; i < logits.length; i++) if (logits[i]! >= threshold) ids.push(i);
  ids.sort((a, b) => logits[b]! - logits[a]! || a - b);
  return ids.length > k ? ids.slice(0, k) : ids;
}

/** The k most likely ids in sampling order (exported for log-probability alternatives). */
export function topIds(logits: ArrayLike<number>, k: number): number[] {
  return mostLikely(logits, Math.min(k, logits.length));
}

/**
 * The k most likely ids in sampling order (logit descending, ties by lower
 * id). Sampling runs once per generated token over the whole vocabulary, so
 * this avoids a comparator sort of all n ids (O(n log n) closure calls):
 *   k < n: one pass keeping the best k in a heap whose root is the worst
 *     kept (O(n log k), nearly always one comparison per id), then a sort of k;
 *   k = n over float32 logits: one native sort of packed numeric keys.
 * Both give exactly the order of the full comparator sort.
 */
function mostLikely(logits: ArrayLike<number>, k: number): number[] {
  const n = logits.length;
  if (k < n) return topK(logits, k);
  if (logits instanceof Float32Array && n <= ID_SPAN) return float32Order(logits);
  const ids = Array.from({ length: n }, (_, i) => i);
  return ids.sort((a, b) => logits[b]! - logits[a]! || a - b);
}

/**
 * The best k of n > k ids in sampling order: one pass keeping them in a
 * heap whose root is the worst kept (children of i at 2i + 1, 2i + 2; no
 * parent comes before its children), then a sort of the k. Ids arrive
 * ascending, so a later id never wins a tie against a kept one: it enters
 * exactly when its logit is strictly larger than the root's, one float
 * comparison for nearly every id. The heap keeps ids and logits side by side
 * in typed arrays so a sift compares numbers, not closures over the logits
 * (this pass was most of the runtime's JS time per decode step).
 */
function topK(logits: ArrayLike<number>, k: number): number[] {
  const n = logits.length;
  const ids = new Int32Array(k);
  const vals = new Float64Array(k);
  // Entry i comes after entry j in sampling order when
  //   vals[i] < vals[j] || (vals[i] === vals[j] && ids[i] > ids[j]),
  // written out below: this loop runs once per token over the vocabulary.
  for (let i = 0; i < k; i++) {
    const v = logits[i]!;
    // Sift up: move parents that the new entry comes after down into the hole.
    let c = i;
    while (c > 0) {
      const p = (c - 1) >> 1;
      if (!(v < vals[p]! || (v === vals[p] && i > ids[p]!))) break;
      ids[c] = ids[p]!;
      vals[c] = vals[p]!;
      c = p;
    }
    ids[c] = i;
    vals[c] = v;
  }
  let root = vals[0]!;
  for (let id = k; id < n; id++) {
    const x = logits[id]!;
    if (!(x > root)) continue;
    // Replace the root; sift down: move up the child that comes after the other while it comes after x.
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= k) break;
      let c = l;
      const r = l + 1;
      if (r < k && (vals[r]! < vals[l]! || (vals[r] === vals[l] && ids[r]! > ids[l]!))) c = r;
      if (!(vals[c]! < x || (vals[c] === x && ids[c]! > id))) break;
      ids[i] = ids[c]!;
      vals[i] = vals[c]!;
      i = c;
    }
    ids[i] = id;
    vals[i] = x;
    root = vals[0]!;
  }
  const order = Array.from({ length: k }, (_, i) => i);
  order.sort((a, b) => vals[b]! - vals[a]! || ids[a]! - ids[b]!);
  return order.map((i) => ids[i]!);
}

/** Ids fit in the low 21 bits of a packed key: 32 + 21 = 53 bits, exact in a float64. */
const ID_SPAN = 2 ** 21;

/**
 * All ids of float32 logits in sampling order, by one native sort of
 * key = (2³² − 1 − ord(logit)) · 2²¹ + id, where ord maps a float32's bits
 * to an unsigned integer ordered like its value (negatives: all bits
 * flipped; positives: sign bit set) and −0 counts as +0, so ascending keys
 * are logits descending, ties by lower id.
 */
function float32Order(logits: Float32Array): number[] {
  const n = logits.length;
  const bits = new Uint32Array(logits.buffer, logits.byteOffset, n);
  const keys = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    let b = bits[i]!;
    if ((b & 0x7fffffff) === 0) b = 0;
    const ord = b & 0x80000000 ? ~b >>> 0 : (b | 0x80000000) >>> 0;
    keys[i] = (0xffffffff - ord) * ID_SPAN + i;
  }
  keys.sort();
  const ids = new Array<number>(n);
  for (let i = 0; i < n; i++) ids[i] = keys[i]! % ID_SPAN;
  return ids;
}

/** One token from `logits` and the request's next RNG state. */
export function sampleToken(
  logits: ArrayLike<number>,
  p: SamplingParams,
  rng: RngState,
): { token: number; rng: RngState } {
  const { ids, probs } = candidates(logits, p);
  if (ids.length === 1) return { token: ids[0]!, rng };
  const g = new Rng(rng);
  const u = g.nextFloat();
  let acc = 0;
  for (let i = 0; i < ids.length; i++) {
    acc += probs[i]!;
    if (u < acc) return { token: ids[i]!, rng: g.state() };
  }
  // Rounding left the cumulative sum a hair below 1: the last candidate.
  return { token: ids[ids.length - 1]!, rng: g.state() };
}

/** Why a request's generation ended. */
export type FinishReason = "stop" | "length";

/**
 * A request's sampling state: its parameters, RNG state and token count.
 * Immutable: `next` returns the successor state, so a state can be kept with
 * the request, checkpointed, or forked for parallel samples.
 */
export interface SamplerState {
  readonly params: SamplingParams;
  readonly rng: RngState;
  readonly generated: number;
  /** The constraint's DFA state (−1 when unconstrained). */
  readonly grammar: number;
}

export function initialSamplerState(params: SamplingParams, requestLabel = ""): SamplerState {
  return {
    params,
    rng: seedRng(params.seed, requestLabel),
    generated: 0,
    grammar: params.constraint ? params.constraint.start : -1,
  };
}

/**
 * One token for the request. `history` carries the counts the penalties read
 * (required when the rules penalise); the caller adds the returned token to
 * it. With a constraint the draw is over the ids its grammar allows (the
 * rules apply to those), and the output ends ("stop") once the grammar is
 * complete.
 */
export function nextToken(
  state: SamplerState,
  logits: ArrayLike<number>,
  history?: TokenHistory,
): { token: number; state: SamplerState; finish: FinishReason | null; logprob: TokenLogprob | null } {
  const p = state.params;
  if (state.generated >= p.maxTokens)
    throw new RangeError(`sampler already produced its ${p.maxTokens} tokens`);
  const machine = p.constraint;
  const ids = machine ? machine.choices(state.grammar, p.maxTokens - state.generated, p.stopTokens) : null;
  if (ids !== null && ids.length === 0) throw new RangeError("the constraint allows no token here");
  let row: ArrayLike<number> = logits;
  if (ids !== null || !rulesAreNeutral(p.rules)) {
    // A working copy (the raw row stays for the log-probabilities): the allowed ids' logits, or all.
    let work: Float32Array;
    if (ids === null) work = Float32Array.from(logits);
    else {
      // A plain loop, not Float32Array.from's call per element: this runs per constrained row.
      work = new Float32Array(ids.length);
      for (let i = 0; i < ids.length; i++) work[i] = logits[ids[i]!]!;
    }
    if (!rulesAreNeutral(p.rules)) {
      if (!history) throw new RangeError("penalties need the request's token history");
      applyRules(work, p.rules, history, state.generated, p.stopTokens, ids);
    }
    row = work;
  }
  const drawn = sampleToken(row, p, state.rng);
  const token = ids === null ? drawn.token : ids[drawn.token]!;
  const generated = state.generated + 1;
  const stop = p.stopTokens.includes(token);
  const grammar = machine && !stop ? machine.next(state.grammar, token) : state.grammar;
  const finish: FinishReason | null =
    stop || machine?.complete(grammar) ? "stop" : generated >= p.maxTokens ? "length" : null;
  const logprob =
    p.logprobs === null
      ? null
      : tokenLogprob(logits instanceof Float32Array ? logits : Float32Array.from(logits), token, p.logprobs);
  return { token, state: { params: p, rng: drawn.rng, generated, grammar }, finish, logprob };
}
