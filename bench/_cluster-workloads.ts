import { Rng, seedRng } from "../worker/model/prng.ts";

/**
 * The two workloads of `bench cluster`, generated from a fixed seed so every
 * fleet of a run serves the same requests in the same order.
 *
 * shared — many users share a few long system prompts. P system prompts of
 *   L tokens; T tenants, each with its own API key, so its prefixes are
 *   salted (never shared across tenants): T × P distinct prefixes. Every
 *   request is a tenant's system prompt + a unique 16–32 token user message.
 *   Warm: each prefix once; measured: N requests over the prefixes,
 *   uniformly at random, from 2 closed-loop clients.
 *
 * zipf — where routing matters: T tenants × P prompts each (T × P salted
 *   prefixes of L tokens), popularity Zipf(s) over them in a seeded order, so
 *   a few prefixes carry most requests. Warm: every prefix once, in popularity
 *   order, so the measured phase is the steady state (every prefix computed
 *   once somewhere, in S3): a prefix's first prefill costs the same under any
 *   policy, and a tail first seen while measuring made those unavoidable
 *   seconds most of every fleet's mean. Measured: N requests drawn by
 *   popularity from more closed-loop clients than workers, each pausing
 *   (`thinkMs`) between its requests.
 */

export interface Job {
  readonly tenant: number;
  readonly prompt: number;
  readonly tokens: readonly number[];
  /** The client's pause after this request ends, before it sends its next (0: none). */
  readonly thinkMs?: number;
}

export interface SharedShape {
  readonly tenants: number;
  readonly prompts: number;
  readonly promptTokens: number;
  readonly requests: number;
}

export interface ZipfShape extends SharedShape {
  /** Zipf exponent of prefix popularity. */
  readonly s: number;
  /**
   * Mean pause of a client between its measured requests (exponential, capped
   * at 4× the mean): users who read an answer before asking again, so the
   * fleet runs below saturation and TTFT shows each request's own latency
   * rather than the closed loop's throughput.
   */
  readonly thinkMs: number;
}

export interface Workload {
  readonly warm: readonly Job[];
  readonly measured: readonly Job[];
  /** Distinct prefixes (tenant, prompt) in popularity order, most popular first. */
  readonly ranked: readonly { readonly tenant: number; readonly prompt: number }[];
}

function words(rng: Rng, vocab: number): () => number {
  return () => 1 + Math.floor(rng.nextFloat() * (vocab - 1));
}

function systemPrompts(rng: Rng, vocab: number, prompts: number, tokens: number): number[][] {
  const word = words(rng, vocab);
  return Array.from({ length: prompts }, () => Array.from({ length: tokens }, word));
}

/** A tenant's system prompt plus a unique 16–32 token user message. */
function jobMaker(rng: Rng, vocab: number, system: readonly (readonly number[])[]) {
  const word = words(rng, vocab);
  return (tenant: number, prompt: number): Job => {
    const suffix = Array.from({ length: 16 + Math.floor(rng.nextFloat() * 17) }, word);
    return { tenant, prompt, tokens: [...system[prompt]!, ...suffix] };
  };
}

export function sharedWorkload(shape: SharedShape, vocab: number): Workload {
  const rng = new Rng(seedRng(0x5eed));
  const job = jobMaker(rng, vocab, systemPrompts(rng, vocab, shape.prompts, shape.promptTokens));
  const warm: Job[] = [];
  const ranked: { tenant: number; prompt: number }[] = [];
  for (let p = 0; p < shape.prompts; p++)
    for (let t = 0; t < shape.tenants; t++) {
      warm.push(job(t, p));
      ranked.push({ tenant: t, prompt: p });
    }
  const measured: Job[] = [];
  for (let i = 0; i < shape.requests; i++)
    measured.push(
      job(Math.floor(rng.nextFloat() * shape.tenants), Math.floor(rng.nextFloat() * shape.prompts)),
    );
  return { warm, measured, ranked };
}

export function zipfWorkload(shape: ZipfShape, vocab: number): Workload {
  const rng = new Rng(seedRng(0x21bf));
  // Each tenant's prompts are its own (a prompt index per tenant: T × P texts).
  const n = shape.tenants * shape.prompts;
  const system = systemPrompts(rng, vocab, n, shape.promptTokens);
  const job = jobMaker(rng, vocab, system);
  // Popularity order: a seeded shuffle of the (tenant, prompt) pairs, so no tenant owns the head.
  const pairs = Array.from({ length: n }, (_, i) => ({ tenant: i % shape.tenants, prompt: i }));
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(rng.nextFloat() * (i + 1));
    [pairs[i], pairs[j]] = [pairs[j]!, pairs[i]!];
  }
  // Zipf(s): weight of rank k (from 0) is 1 / (k + 1)^s.
  const weights = pairs.map((_, k) => 1 / (k + 1) ** shape.s);
  const total = weights.reduce((a, b) => a + b, 0);
  const draw = () => {
    let x = rng.nextFloat() * total;
    for (let k = 0; k < n; k++) {
      x -= weights[k]!;
      if (x < 0) return pairs[k]!;
    }
    return pairs[n - 1]!;
  };
  const warm = pairs.map((p) => job(p.tenant, p.prompt));
  const think = () => Math.min(4, -Math.log(1 - rng.nextFloat())) * shape.thinkMs;
  const measured = Array.from({ length: shape.requests }, () => {
    const p = draw();
    return { ...job(p.tenant, p.prompt), thinkMs: think() };
  });
  return { warm, measured, ranked: pairs };
}

/** `count` prompts of `tokens` tokens nobody else uses (cold everywhere): warm-start probes. */
export function coldPrompts(count: number, tokens: number, vocab: number, seed: number): number[][] {
  const rng = new Rng(seedRng(seed));
  const word = words(rng, vocab);
  return Array.from({ length: count }, () => Array.from({ length: tokens }, word));
}
