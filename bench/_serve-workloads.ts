import { Rng, seedRng } from "../worker/model/prng.ts";
import { checkEnds, gaps, type Session, type Trace, tokens } from "./_serve-session.ts";
import { round } from "./contract.ts";

/**
 * bench serve's workloads on a session (bench/_serve-session.ts): prefill
 * interference beside running decodes, the open-loop Poisson load with
 * shared prefixes, and the in-flight sharing burst; with the run sizes.
 */
export const DECODES = 8;
export const DECODE_PROMPT = 32;
/** 4088 + 8 generated = the small preset's 4096 positions. */
export const LONG_PROMPT = 4088;
const WARM_TOKENS = 4;

interface Interference {
  /** Inter-token gaps of the decodes that ended while a long prompt was prefilling ("on") or not. */
  on: number[];
  off: number[];
  longPrefilledTokens: number;
  longPrefillMs: number;
  /** Submission to first token of each long prompt that got one (full run: the one "on" phase). */
  longTtftMs: number[];
  phases: string[];
}

/**
 * The same 8 decodes run throughout while phases alternate: "off" (the
 * decodes alone for `offSteps` steps) and "on" (a long prompt submitted and
 * prefilled in tiles beside them, until its first token, or for `onSteps`
 * steps and then cancelled). Alternating within one run exposes both sides
 * to the same machine conditions, which on a shared machine drift more than
 * the effect being measured; for the same reason an "off" after an "on"
 * lasts as many steps as that "on" did (up to `matchSteps`), so a long
 * prefill is not compared with a short, luckier quiet window. A gap belongs
 * to the phase its later token arrived in.
 */
export async function interference(
  s: Session,
  vocab: number,
  plan: readonly ("off" | "on")[],
  offSteps: number,
  onSteps: number,
  matchSteps: number,
  decodeTokens: number,
): Promise<Interference> {
  const rng = new Rng(seedRng(1, "bench-serve-interference"));
  const decodes = Array.from({ length: DECODES }, (_, i) =>
    s.submit(`d${i}`, tokens(rng, DECODE_PROMPT, vocab), decodeTokens),
  );
  const generated = () => s.rt.stats().generatedTokens;
  await waitFor(() => generated() >= DECODES * WARM_TOKENS);
  const windows: { kind: "on" | "off"; from: number; to: number }[] = [];
  let prefilled = 0;
  let prefillMs = 0;
  const ttft: number[] = [];
  let lastOnSteps = 0;
  for (const [i, kind] of plan.entries()) {
    const from = performance.now();
    const start = generated();
    if (kind === "off") {
      const steps = Math.max(offSteps, Math.min(lastOnSteps, matchSteps));
      await waitFor(() => generated() - start >= steps * DECODES);
    } else {
      const computed = s.rt.stats().computedPromptTokens;
      const long = s.submit(`long${i}`, tokens(rng, LONG_PROMPT, vocab), 8);
      await waitFor(() => long.live.tokenAt.length > 0 || generated() - start >= onSteps * DECODES);
      if (long.live.tokenAt.length > 0) ttft.push(long.live.tokenAt[0]! - long.live.submittedAt);
      prefilled += s.rt.stats().computedPromptTokens - computed;
      prefillMs += performance.now() - from;
      long.cancel();
      await long.trace;
      lastOnSteps = Math.ceil((generated() - start) / DECODES);
    }
    windows.push({ kind, from, to: performance.now() });
    if (decodes.some((d) => d.live.end !== "")) throw new Error("the decodes ended before the phases did");
  }
  for (const d of decodes) d.cancel();
  const traces = await Promise.all(decodes.map((d) => d.trace));
  const out: Interference = {
    on: [],
    off: [],
    longPrefilledTokens: prefilled,
    longPrefillMs: prefillMs,
    longTtftMs: ttft,
    phases: [],
  };
  for (const t of traces) {
    for (let k = 1; k < t.tokenAt.length; k++) {
      const at = t.tokenAt[k]!;
      const w = windows.find((x) => at > x.from && at <= x.to);
      if (w) out[w.kind].push(at - t.tokenAt[k - 1]!);
    }
  }
  out.phases = windows.map((w) => `${w.kind} ${round(w.to - w.from)} ms`);
  return out;
}

async function waitFor(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setTimeout(r, 5));
}

interface WorkloadRun {
  wallS: number;
  generated: number;
  promptTokens: number;
  computedPromptTokens: number;
  cachedPromptTokens: number;
  ttft: number[];
  itl: number[];
  maxRunning: number;
}

/** Open loop: request i arrives at its Poisson time whatever the runtime is doing. */
export async function poisson(s: Session, vocab: number, z: Sizes, ratePerS: number): Promise<WorkloadRun> {
  const rng = new Rng(seedRng(3, "bench-serve-poisson"));
  const prefixes = z.prefixes.map((n) => tokens(rng, n, vocab));
  const pick = (r: readonly [number, number]) => r[0] + (rng.nextU32() % (r[1] - r[0] + 1));
  const before = s.rt.stats();
  const start = performance.now();
  let at = 0;
  let maxRunning = 0;
  const runs: Promise<Trace>[] = [];
  let promptTokens = 0;
  for (let i = 0; i < z.requests; i++) {
    // Exponential inter-arrival gaps: −ln(U)/λ.
    at += (-Math.log(1 - rng.nextFloat()) / ratePerS) * 1000;
    const prompt = [...prefixes[rng.nextU32() % prefixes.length]!, ...tokens(rng, pick(z.suffix), vocab)];
    const maxTokens = pick(z.gen);
    promptTokens += prompt.length;
    const wait = start + at - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    runs.push(s.submit(`p${i}`, prompt, maxTokens).trace);
    const st = s.rt.stats();
    maxRunning = Math.max(maxRunning, st.running + st.waiting);
  }
  const traces = await Promise.all(runs);
  checkEnds(traces, "poisson");
  const end = Math.max(...traces.map((t) => t.tokenAt[t.tokenAt.length - 1]!));
  const after = s.rt.stats();
  return {
    wallS: (end - start) / 1000,
    generated: traces.reduce((a, t) => a + t.tokenAt.length, 0),
    promptTokens,
    computedPromptTokens: after.computedPromptTokens - before.computedPromptTokens,
    cachedPromptTokens: after.cachedPromptTokens - before.cachedPromptTokens,
    ttft: traces.map((t) => t.tokenAt[0]! - t.submittedAt),
    itl: traces.flatMap((t) => gaps(t.tokenAt)),
    maxRunning,
  };
}

/** Run sizes: the full run follows the issue; quick shrinks every part to fit in a minute. */
export interface Sizes {
  readonly genTokens: number;
  /** Quick: steps of each interference phase (the long prompt is cancelled after them). */
  readonly windowSteps: number;
  /** Alternating rounds of the 1- and 16-request runs. */
  readonly rounds: number;
  readonly prefixes: readonly number[];
  readonly suffix: readonly [number, number];
  readonly gen: readonly [number, number];
  readonly requests: number;
}
export const FULL: Sizes = {
  genTokens: 64,
  windowSteps: Number.POSITIVE_INFINITY,
  rounds: 3,
  prefixes: [256, 512, 768, 1024],
  suffix: [16, 64],
  gen: [32, 64],
  requests: 48,
};
export const QUICK: Sizes = {
  genTokens: 16,
  windowSteps: 12,
  rounds: 2,
  prefixes: [64, 128, 192, 256],
  suffix: [8, 24],
  gen: [8, 16],
  requests: 12,
};

export const BURST = 16;
export const BURST_SUFFIX = 16;

/** BURST requests sharing one `system`-token prompt, submitted at once; the prompt rows the runtime computed. */
export async function burst(s: Session, vocab: number, system: number, gen: number) {
  const rng = new Rng(seedRng(4, "bench-serve-burst"));
  const shared = tokens(rng, system, vocab);
  const computed = s.rt.stats().computedPromptTokens;
  const traces = await Promise.all(
    Array.from(
      { length: BURST },
      (_, i) => s.submit(`b${i}`, [...shared, ...tokens(rng, BURST_SUFFIX, vocab)], gen).trace,
    ),
  );
  checkEnds(traces, "burst");
  return {
    computed: s.rt.stats().computedPromptTokens - computed,
    prompt: BURST * (system + BURST_SUFFIX),
    shared: s.rt.stats().sharedInFlightTokens,
    ttft: traces.map((t) => t.tokenAt[0]! - t.submittedAt),
  };
}
