import { Rng, type RngState, seedRng } from "./prng.ts";

/**
 * Per-request sampling. Pure: logits, parameters and the request's RNG state
 * in; a token and the next RNG state out. The state belongs to the request
 * (never to shared KV pages), so any number of requests can continue one
 * shared prefix, each with its own sampler, and a request's choices depend
 * only on its own seed and its own logits.
 *
 * Order of operations (as in Hugging Face generate): temperature, then top-k,
 * then top-p, then one uniform draw. temperature 0 is greedy (argmax, ties to
 * the lowest id).
 */
export interface SamplingParams {
  /** 0 = greedy. */
  readonly temperature: number;
  /** Keep the k most likely tokens; 0 = no limit. */
  readonly topK: number;
  /** Keep the smallest set of most likely tokens whose mass reaches p; 1 = no limit. */
  readonly topP: number;
  readonly seed: number;
  /** Generation stops after emitting any of these. */
  readonly stopTokens: readonly number[];
  /** Generation stops after this many tokens. */
  readonly maxTokens: number;
}

export const GREEDY: SamplingParams = {
  temperature: 0,
  topK: 0,
  topP: 1,
  seed: 0,
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
  const ids = Array.from({ length: n }, (_, i) => i);
  ids.sort((a, b) => logits[b]! - logits[a]! || a - b);
  const k = p.topK > 0 ? Math.min(p.topK, n) : n;
  const kept = ids.slice(0, k);
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
}

export function initialSamplerState(params: SamplingParams, requestLabel = ""): SamplerState {
  return { params, rng: seedRng(params.seed, requestLabel), generated: 0 };
}

export function nextToken(
  state: SamplerState,
  logits: ArrayLike<number>,
): { token: number; state: SamplerState; finish: FinishReason | null } {
  if (state.generated >= state.params.maxTokens)
    throw new RangeError(`sampler already produced its ${state.params.maxTokens} tokens`);
  const { token, rng } = sampleToken(logits, state.params, state.rng);
  const generated = state.generated + 1;
  const finish: FinishReason | null = state.params.stopTokens.includes(token)
    ? "stop"
    : generated >= state.params.maxTokens
      ? "length"
      : null;
  return { token, state: { params: state.params, rng, generated }, finish };
}
