import type { ModelFingerprint, NodeId, RequestId, TokenCount, WorkerId } from "../../schema/ids.ts";
import type { ChainBoundary } from "../candidates.ts";
import type { WorkerSnapshot } from "../fleet/decision-text.ts";
import type { TtftWeights } from "../router.ts";
import {
  defaultSimOptions,
  type RoutingPolicy,
  type SimOptions,
  type SimSummary,
  type SimWorld,
  type SimWorldWorker,
  simulate,
} from "../sim/simulate.ts";
import type { SimCosts } from "../sim/worker.ts";
import type { SimRequest } from "../sim/workload.ts";
import {
  chosen,
  type PredictionError,
  percentileOf,
  predictionError,
  type RecordedDecision,
} from "./records.ts";

/**
 * Replay (pure): the recorded workload through the simulator under other
 * routing policies.
 *
 * The world is rebuilt from the records alone:
 *  - requests: each request's first decision — its arrival (routing time,
 *    relative to the first), chain, prompt and generation lengths;
 *  - workers: every worker a record saw, with the median of the costs its
 *    heartbeats reported (what the router believed), its pages, page size,
 *    state bytes per token and context;
 *  - true costs: the reported ones scaled by what the measurements say of
 *    them — prefill and first token by the median of measured prefill over
 *    predicted (upload + prefill + first token), restores by the median of
 *    measured fetch over predicted fetch — so a router that believes the
 *    heartbeats is wrong in the simulator as it was in the fleet, and a
 *    weight that corrects a term can show it.
 * Then each policy variant runs on the same world with the same seed (the
 * live router with the recorded weights, round-robin, prefix-only, and the
 * live router with changed weights), giving predicted mean and p99 TTFT. Same
 * records and seed, same figures.
 */

export interface ReplayOptions {
  readonly seed: number;
  /** Weights of the `weighted` variant (absent: no such variant). */
  readonly weights?: Partial<TtftWeights>;
}

export interface VariantResult {
  readonly policy: RoutingPolicy;
  readonly weights: TtftWeights;
  readonly meanTtftMs: number;
  readonly p99TtftMs: number;
  readonly completed: number;
  readonly failed: number;
  readonly traceHash: string;
}

export interface ReplayReport {
  readonly requests: number;
  readonly workers: number;
  /** What the fleet measured for those requests (controller: offer → first token). */
  readonly recorded: { readonly meanTtftMs: number | null; readonly p99TtftMs: number | null };
  /** Scales from the heartbeats' costs to the simulated true costs. */
  readonly corrections: { readonly prefill: number; readonly fetch: number };
  readonly variants: Readonly<Record<string, VariantResult>>;
  readonly error: PredictionError;
}

const median = (xs: readonly number[]): number | null => {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
};
const clampScale = (x: number | null): number =>
  x === null || !Number.isFinite(x) ? 1 : Math.min(10, Math.max(0.1, x));

function corrections(decisions: readonly RecordedDecision[]): { prefill: number; fetch: number } {
  const prefill: number[] = [];
  const fetch: number[] = [];
  for (const d of decisions) {
    const t = d.text.measured?.terms;
    const c = chosen(d);
    if (t === undefined || c === undefined) continue;
    const p = c.terms.uploadMs + c.terms.prefillMs + c.terms.firstTokenMs;
    if (p > 0) prefill.push(t.prefillMs / p);
    if (c.terms.fetchMs > 0) fetch.push(t.fetchMs / c.terms.fetchMs);
  }
  return { prefill: clampScale(median(prefill)), fetch: clampScale(median(fetch)) };
}

function medianCosts(snaps: readonly WorkerSnapshot[]): SimCosts {
  const m = (f: (s: WorkerSnapshot) => number) => median(snaps.map(f)) ?? 0;
  const firstTokenMs = m((s) => s.costs.firstTokenMs);
  return {
    prefillPerTokenMs: m((s) => s.costs.prefillPerTokenMs),
    firstTokenMs,
    // Heartbeats carry no decode cost: a decode step costs about a first token's step.
    decodeMsPerToken: firstTokenMs,
    uploadMsPerMiB: m((s) => s.costs.uploadMsPerMiB),
    restoreMsPerMiB: {
      ram: m((s) => s.costs.restoreMsPerMiB.ram),
      ssd: m((s) => s.costs.restoreMsPerMiB.ssd),
      peer: m((s) => s.costs.restoreMsPerMiB.peer),
      s3: m((s) => s.costs.restoreMsPerMiB.s3),
    },
  };
}

function scaled(c: SimCosts, k: { prefill: number; fetch: number }): SimCosts {
  const r = c.restoreMsPerMiB;
  return {
    prefillPerTokenMs: c.prefillPerTokenMs * k.prefill,
    firstTokenMs: c.firstTokenMs * k.prefill,
    decodeMsPerToken: c.decodeMsPerToken * k.prefill,
    uploadMsPerMiB: c.uploadMsPerMiB * k.prefill,
    restoreMsPerMiB: {
      ram: r.ram * k.fetch,
      ssd: r.ssd * k.fetch,
      peer: r.peer * k.fetch,
      s3: r.s3 * k.fetch,
    },
  };
}

/** The recorded world: workload and workers (see the module comment); null when nothing was recorded. */
export function recordedWorld(decisions: readonly RecordedDecision[]): SimWorld | null {
  const firsts = decisions.filter((d) => d.attempt === 1);
  if (firsts.length === 0) return null;
  const t0 = firsts[0]!.text.context!.routedAtMs;
  const chains = new Map<string, ChainBoundary[]>();
  const requests: SimRequest[] = firsts.map((d, i) => {
    const ctx = d.text.context!;
    const chain = ctx.chain.map(([nodeId, tokens]) => ({
      nodeId: nodeId as NodeId,
      tokens: tokens as TokenCount,
    }));
    const key = chain.length === 0 ? "" : chain[chain.length - 1]!.nodeId;
    if (!chains.has(key)) chains.set(key, chain);
    return {
      requestId: `replay-${i}` as RequestId,
      tenant: 0,
      arrivalMs: Math.max(0, Math.round(ctx.routedAtMs - t0)),
      chain,
      promptTokens: d.text.promptTokens as TokenCount,
      maxTokens: Math.max(1, d.text.maxTokens) as TokenCount,
    };
  });
  // Arrivals must not go back in time (records are sorted by routing time).
  for (let i = 1; i < requests.length; i++)
    if (requests[i]!.arrivalMs < requests[i - 1]!.arrivalMs)
      requests[i] = { ...requests[i]!, arrivalMs: requests[i - 1]!.arrivalMs };
  const snaps = new Map<string, WorkerSnapshot[]>();
  for (const d of decisions)
    for (const s of d.text.context!.workers) {
      let list = snaps.get(s.id);
      if (list === undefined) {
        list = [];
        snaps.set(s.id, list);
      }
      list.push(s);
    }
  if (snaps.size === 0) return null;
  const k = corrections(decisions);
  const workers: SimWorldWorker[] = [...snaps.keys()].sort().map((id) => {
    const list = snaps.get(id)!;
    const reported = medianCosts(list);
    const last = list[list.length - 1]!;
    const pages = Math.max(...list.map((s) => s.totalPages ?? s.freePages + s.evictablePages));
    return {
      id: id as WorkerId,
      reported,
      costs: scaled(reported, k),
      shape: {
        totalPages: Math.max(1, pages),
        pageTokens: last.pageTokens,
        kvBytesPerToken: last.kvBytesPerToken,
        maxContext: last.maxContext,
        ramChunks: 4096,
        ssdTier: last.durableTiers.includes("ssd"),
      },
    };
  });
  return {
    workload: {
      fingerprint: firsts[0]!.model as ModelFingerprint,
      tenantChains: [...chains.values()],
      requests,
    },
    workers,
  };
}

/** The simulator's options for one variant on the recorded world. */
function variantOptions(
  world: SimWorld,
  seed: number,
  policy: RoutingPolicy,
  weights: TtftWeights,
): SimOptions {
  const base = defaultSimOptions(seed, world.workers.length, world.workload.requests.length);
  return {
    ...base,
    policy,
    world,
    // Replay measures TTFT, not failover: no timeout may cut a recorded request short.
    limits: {
      maxAttempts: 4,
      offerTimeoutMs: 60_000,
      progressTimeoutMs: 3_600_000,
      requestDeadlineMs: 3_600_000,
    },
    router: { ...base.router, weights },
  };
}

function summarize(policy: RoutingPolicy, weights: TtftWeights, s: SimSummary): VariantResult {
  return {
    policy,
    weights,
    meanTtftMs: s.meanTtftMs,
    p99TtftMs: s.p99TtftMs,
    completed: s.completed,
    failed: Object.values(s.failed).reduce((a, b) => a + b, 0),
    traceHash: s.traceHash,
  };
}

export function replay(decisions: readonly RecordedDecision[], opts: ReplayOptions): ReplayReport | null {
  const world = recordedWorld(decisions);
  if (world === null) return null;
  const live = decisions.at(-1)!.text.context!.weights;
  const run = (policy: RoutingPolicy, w: TtftWeights) =>
    summarize(policy, w, simulate(variantOptions(world, opts.seed, policy, w)));
  const variants: Record<string, VariantResult> = {
    live: run("ttft", live),
    round_robin: run("round-robin", live),
    prefix: run("prefix", live),
  };
  if (opts.weights !== undefined) variants.weighted = run("ttft", { ...live, ...opts.weights });
  const measured = decisions
    .filter((d) => d.text.measured !== null)
    .map((d) => d.text.measured!.ttftMs)
    .sort((a, b) => a - b);
  return {
    requests: world.workload.requests.length,
    workers: world.workers.length,
    recorded: {
      meanTtftMs: measured.length === 0 ? null : measured.reduce((a, b) => a + b, 0) / measured.length,
      p99TtftMs: percentileOf(measured, 99),
    },
    corrections: corrections(decisions),
    variants,
    error: predictionError(decisions),
  };
}
