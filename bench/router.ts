import { createHash } from "node:crypto";
import { loadavg } from "node:os";
import type { ChainBoundary, ChunkReplica } from "../controller/candidates.ts";
import { emptyView, type HeartbeatView, observe } from "../controller/heartbeat-view.ts";
import { defaultRouterPolicy, route } from "../controller/router.ts";
import { Prng } from "../controller/sim/prng.ts";
import {
  defaultSimOptions,
  type RoutingPolicy,
  type SimSummary,
  simulate,
} from "../controller/sim/simulate.ts";
import type { Heartbeat, ResidentPrefix } from "../schema/control.ts";
import type { ModelFingerprint, NodeId, RequestId, TokenCount, WorkerId } from "../schema/ids.ts";
import { type Bench, percentile, round } from "./contract.ts";

/**
 * Router benchmark, two parts measured side by side:
 *
 * 1. Decision latency of candidate derivation + TTFT routing for one
 *    request, with 64 live workers and a 200,000-chunk catalog (1,000 prefix
 *    families × 200 chunks, each chunk in S3 and on 1–3 workers' RAM/SSD;
 *    each worker reports 256 resident boundaries). The catalog answer is
 *    built per request from the chunk index (the batched lookup the catalog
 *    replica does), once inside and once outside the timed region.
 * 2. In the simulator, mean time to first token of this router against
 *    round-robin and against prefix-only routing (most cached tokens,
 *    ignoring load) on a multi-tenant shared-prefix workload, with and
 *    without a local SSD tier, and the load balance (max / mean completed
 *    requests per worker).
 */

const WORKERS = 64;
const FAMILIES = 1000;
const CHUNKS_PER_FAMILY = 200;
const CHUNK_TOKENS = 256;

function id(...parts: (string | number)[]): string {
  return createHash("sha256").update(parts.join("/")).digest("hex");
}

interface LatencyFigures {
  p50Us: number;
  p99Us: number;
  p50WithLookupUs: number;
  p99WithLookupUs: number;
  p99MinOf3Us: number;
  candidatesPerDecision: number;
}

export function decisionLatency(decisions: number): LatencyFigures {
  const rng = new Prng(7);
  const fp = id("bench-model") as ModelFingerprint;
  const families: ChainBoundary[][] = [];
  const replicasOf = new Map<NodeId, ChunkReplica[]>();
  const workerIds = Array.from({ length: WORKERS }, (_, i) => `w${String(i).padStart(2, "0")}` as WorkerId);
  for (let f = 0; f < FAMILIES; f++) {
    const chain: ChainBoundary[] = [];
    for (let i = 0; i < CHUNKS_PER_FAMILY; i++) {
      const nodeId = id("bench-node", f, i) as NodeId;
      chain.push({ nodeId, tokens: ((i + 1) * CHUNK_TOKENS) as TokenCount });
      const reps: ChunkReplica[] = [{ tier: "s3", workerId: null }];
      const copies = rng.int(1, 3);
      for (let k = 0; k < copies; k++) {
        reps.push({ tier: rng.chance(0.5) ? "ram" : "ssd", workerId: workerIds[rng.int(0, WORKERS - 1)]! });
      }
      replicasOf.set(nodeId, reps);
    }
    families.push(chain);
  }
  let view: HeartbeatView = emptyView;
  for (const w of workerIds) {
    const residentPrefixes: ResidentPrefix[] = [];
    while (residentPrefixes.length < 256) {
      const fam = families[rng.int(0, FAMILIES - 1)]!;
      const depth = rng.int(1, 32);
      for (let i = 0; i < depth && residentPrefixes.length < 256; i++) {
        residentPrefixes.push({ nodeId: fam[i]!.nodeId, tokens: fam[i]!.tokens });
      }
    }
    const hb: Heartbeat = {
      workerId: w,
      epoch: 1,
      sequence: 1,
      modelFingerprint: fp,
      maxContext: 32768 as TokenCount,
      pageTokens: 16,
      kvBytesPerToken: 128 * 1024,
      freePages: rng.int(500, 4000) as never,
      evictablePages: rng.int(0, 2000) as never,
      residentPrefixes,
      durableTiers: ["ram", "ssd", "s3"],
      ready: true,
      queue: {
        queuedTokens: rng.int(0, 20000) as TokenCount,
        queuedRequests: rng.int(0, 8),
        runningRequests: rng.int(0, 32),
      },
      costs: {
        prefillPerTokenMs: 0.1 + rng.float() * 0.1,
        firstTokenMs: 15 + rng.float() * 10,
        uploadMsPerMiB: 0.04,
        restoreMsPerMiB: { ram: 0.05, ssd: 0.3, peer: 0.8, s3: 2.5 },
        samples: 100,
      },
    };
    view = observe(view, hb, 0).view;
  }
  const requests = Array.from({ length: decisions }, (_, i) => {
    const fam = families[rng.int(0, FAMILIES - 1)]!;
    const depth = rng.int(8, 32); // 2k–8k shared tokens
    return {
      request: {
        requestId: `r${i}` as RequestId,
        modelFingerprint: fp,
        chain: fam.slice(0, depth),
        promptTokens: (depth * CHUNK_TOKENS + rng.int(16, 512)) as TokenCount,
        maxTokens: 256 as TokenCount,
      },
    };
  });
  const lookup = (chain: readonly ChainBoundary[]) => {
    const replicas: ChunkReplica[][] = [];
    for (const n of chain) {
      const r = replicasOf.get(n.nodeId);
      if (!r) break;
      replicas.push(r);
    }
    return { replicas };
  };
  const decide = (i: number, withLookup: boolean, answer: ReturnType<typeof lookup>) => {
    const req = requests[i % requests.length]!.request;
    return route({
      request: req,
      attempt: 1,
      view,
      nowMs: 0,
      catalog: withLookup ? lookup(req.chain) : answer,
      outstanding: new Map(),
      exclude: new Set(),
      policy: defaultRouterPolicy,
    });
  };
  const answers = requests.map((r) => lookup(r.request.chain));
  for (let i = 0; i < Math.min(500, decisions); i++) decide(i, false, answers[i]!); // warm up the JIT and memos
  const plain: number[] = [];
  const withLookup: number[] = [];
  // Each decision is also timed 3 times and the fastest kept: on a shared,
  // oversubscribed machine the wall-clock tail is mostly preemption, and the
  // minimum of repeats keeps each request's own work (its chain, its
  // candidates) while dropping most of the scheduler's noise.
  const minOf3: number[] = [];
  let candidates = 0;
  for (let i = 0; i < decisions; i++) {
    let t = process.hrtime.bigint();
    const d = decide(i, false, answers[i]!);
    const first = Number(process.hrtime.bigint() - t) / 1000;
    plain.push(first);
    candidates += d.ranked.length;
    let best = first;
    for (let k = 0; k < 2; k++) {
      t = process.hrtime.bigint();
      decide(i, false, answers[i]!);
      best = Math.min(best, Number(process.hrtime.bigint() - t) / 1000);
    }
    minOf3.push(best);
    t = process.hrtime.bigint();
    decide(i, true, answers[i]!);
    withLookup.push(Number(process.hrtime.bigint() - t) / 1000);
  }
  return {
    p50Us: percentile(plain, 50),
    p99Us: percentile(plain, 99),
    p50WithLookupUs: percentile(withLookup, 50),
    p99WithLookupUs: percentile(withLookup, 99),
    p99MinOf3Us: percentile(minOf3, 99),
    candidatesPerDecision: candidates / decisions,
  };
}

interface PolicyFigures {
  meanTtftMs: number;
  maxOverMeanLoad: number;
  failed: number;
}

function simulated(policy: RoutingPolicy, seeds: number, requests: number, ssdTier: boolean): PolicyFigures {
  let ttft = 0;
  let maxLoad = 0;
  let failed = 0;
  for (let seed = 1; seed <= seeds; seed++) {
    const o = defaultSimOptions(seed, 8, requests);
    const s: SimSummary = simulate({ ...o, policy, ssdTier });
    ttft += s.meanTtftMs / seeds;
    maxLoad = Math.max(maxLoad, s.maxOverMeanLoad);
    failed += s.requests - s.completed;
  }
  return { meanTtftMs: ttft, maxOverMeanLoad: maxLoad, failed };
}

const bench: Bench = {
  summary:
    "router decision latency (64 workers, 200k chunks) and simulated TTFT vs round-robin and prefix-only",
  async run({ quick, log }) {
    const decisions = quick ? 2_000 : 20_000;
    log(
      `decision latency: ${decisions} decisions, ${WORKERS} workers, ${FAMILIES * CHUNKS_PER_FAMILY} chunks`,
    );
    const lat = decisionLatency(decisions);
    const figures: Record<string, number> = {
      decision_p50_ms: round(lat.p50Us / 1000),
      decision_p99_ms: round(lat.p99Us / 1000),
      decision_with_lookup_p50_ms: round(lat.p50WithLookupUs / 1000),
      decision_with_lookup_p99_ms: round(lat.p99WithLookupUs / 1000),
      decision_p99_min_of_3_ms: round(lat.p99MinOf3Us / 1000),
      candidates_per_decision: round(lat.candidatesPerDecision),
    };
    const ratios: Record<string, number | null> = {};
    const seeds = quick ? 1 : 3;
    const requests = quick ? 800 : 1500;
    for (const [tag, ssd] of [
      ["", true],
      ["no_ssd_", false],
    ] as const) {
      const by: Partial<Record<RoutingPolicy, PolicyFigures>> = {};
      for (const policy of ["ttft", "round-robin", "prefix"] as const) {
        log(
          `simulating ${policy}${ssd ? "" : " (no SSD tier)"}: 8 workers, ${requests} requests × ${seeds} seed(s)`,
        );
        const f = simulated(policy, seeds, requests, ssd);
        by[policy] = f;
        const name = policy.replace("-", "_");
        figures[`sim_${tag}${name}_mean_ttft_ms`] = round(f.meanTtftMs);
        figures[`sim_${tag}${name}_max_over_mean_load`] = round(f.maxOverMeanLoad);
        figures[`sim_${tag}${name}_failed`] = f.failed;
      }
      ratios[`${tag}ttft_over_round_robin`] = round(by.ttft!.meanTtftMs / by["round-robin"]!.meanTtftMs);
      ratios[`${tag}ttft_over_prefix_only`] = round(by.ttft!.meanTtftMs / by.prefix!.meanTtftMs);
    }
    return {
      figures,
      ratios,
      env: {
        workers: WORKERS,
        catalog_chunks: FAMILIES * CHUNKS_PER_FAMILY,
        sim_workers: 8,
        sim_requests: requests,
        sim_seeds: seeds,
        kv_bytes_per_token: 128 * 1024,
        // Latency tails on a shared machine are mostly preemption: record how busy it was.
        loadavg_1m: round(loadavg()[0]!),
      },
    };
  },
};
export default bench;
