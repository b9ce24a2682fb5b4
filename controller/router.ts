import type {
  CandidateRecord,
  DecisionRecord,
  DroppedCandidate,
  Heartbeat,
  TtftTerms,
} from "../schema/control.ts";
import { pagesFor, type TokenCount, type WorkerId } from "../schema/ids.ts";
import { type Candidate, type CatalogAnswer, deriveCandidates, type RouteRequest } from "./candidates.ts";
import { type HeartbeatView, liveWorkers } from "./heartbeat-view.ts";

/**
 * The TTFT router (pure). For each candidate:
 *
 *   queue    = sharedTokens × prefillPerTokenMs         (a worker that reports its batching)
 *            = queuedTokens × prefillPerTokenMs + queuedRequests × firstTokenMs   (otherwise: serial)
 *   fetch    = Σ_tier bytes[tier] / MiB × restoreMsPerMiB[tier]
 *   upload   = Σ bytes / MiB × uploadMsPerMiB
 *   prefill  = (promptTokens − cachedTokens) × prefillPerTokenMs
 *   TTFT     = max(wq·queue, wf·fetch) + wu·upload + wp·prefill + w1·firstTokenMs
 *
 * with the policy's weights w (all 1 by default: the cost model as measured;
 * `continuum replay` shows which term the measured outcomes say is off, and
 * what changed weights would have predicted under the recorded workload).
 *
 * (a fetch overlaps the wait in the worker's queue; the upload and the prefill
 * need the device). Hard constraints drop a candidate; the rest rank by TTFT,
 * then more cached tokens, then worker id, then source.
 *
 * Load terms. (1) The controller's own count of outstanding assignments
 * (offered or accepted, first token not yet seen), with each attempt's
 * tokens still to prefill as its worker last reported them, is the queue: so
 * each assignment raises a worker's predicted queue at once, and a first
 * token lowers it at once (a worker that reports no per-attempt progress
 * gets max(heartbeat queue, outstanding) — max, not sum, because a
 * heartbeat sent after an accept already counts that work). (2) Bounded load
 * (consistent hashing with bounded loads, Mirrokni et al. 2018): with
 * load_w = requests in flight on w (queued + running, the larger of the
 * heartbeat's and the controller's count) and n eligible workers, a worker
 * takes the request only if
 *
 *   load_w + 1 ≤ max(loadSlack, loadFactor × (Σ load + 1) / n)
 *
 * so a hot prefix resident on one worker cannot pin all traffic there (a
 * known failure of cache-aware routers): once that worker carries more than
 * its bounded share, the next request goes to the best other worker, which
 * fetches or recomputes the prefix and becomes a second home for it.
 *
 * Batching. A worker does not serve prompts one after another: each step,
 * its decode lanes take a row each and the prefill lanes, in arrival order,
 * take up to a tile of the step's row budget (worker/scheduler/plan-iteration.ts).
 * A new prompt's rows join the steps of the prompts ahead of it, and its first
 * token comes with the step that finishes its own rows, so what it waits for
 * is the rows of others in those steps (sharedTokens, see sharedPrefillTokens),
 * not all their rows plus each one's first-token step.
 */

const MIB = 1024 * 1024;

/** Assigned, not yet started work the controller knows of on one worker. */
export interface Outstanding {
  /** Assigned, first token not yet seen. */
  readonly requests: number;
  /** Prompt tokens still to prefill (promptTokens − cachedTokens of each). */
  readonly tokens: number;
  /** Streaming (decoding) now. */
  readonly running: number;
}

/** Multipliers of the TTFT terms (controller.ttftWeights); 1 each is the cost model as measured. */
export interface TtftWeights {
  readonly queue: number;
  readonly fetch: number;
  readonly upload: number;
  readonly prefill: number;
  readonly firstToken: number;
}

export const unitWeights: TtftWeights = { queue: 1, fetch: 1, upload: 1, prefill: 1, firstToken: 1 };

export interface RouterPolicy {
  /** Name recorded in decision records. */
  readonly name: string;
  /** Term weights of the predicted TTFT. */
  readonly weights: TtftWeights;
  /**
   * "ttft": the best-ranked candidate of any worker. "round_robin": the live
   * workers in turn (RouteInput.turn), each request's candidate the best one on
   * that worker — what a cache-unaware balancer gets (the worker still reuses
   * what it happens to hold).
   */
  readonly order: "ttft" | "round_robin";
  /** Heartbeats older than this are offline. */
  readonly heartbeatTtlMs: number;
  /** Resident prefixes older than this are not trusted (durable alternatives stay). */
  readonly residentFreshMs: number;
  /** Bounded load: a worker's share of in-flight requests, over the mean, it may reach (≥ 1; Infinity: off). */
  readonly loadFactor: number;
  /** Below this many in-flight requests (counting the new one) a worker is never overloaded. */
  readonly loadSlack: number;
  /** Workers read each other's RAM/SSD chunks (worker.peerTransfer): peer candidates exist. */
  readonly peers: boolean;
}

export const defaultRouterPolicy: RouterPolicy = {
  name: "ttft/v1",
  weights: unitWeights,
  order: "ttft",
  heartbeatTtlMs: 3_000,
  residentFreshMs: 1_500,
  loadFactor: 1.25,
  loadSlack: 4,
  peers: true,
};

/**
 * Whether the controller's outstanding count is the worker's load: the
 * worker reports progress per attempt (`queue.prefilling`), so the count's
 * tokens are joined to it, and its membership is fresher than any heartbeat
 * (a heartbeat sent just before an attempt's first token still counts it: in
 * a closed loop the client's next request arrives inside that window). A
 * worker that does not report per attempt gets the larger of both.
 */
function ownCountIsLoad(hb: Heartbeat): boolean {
  return hb.queue.prefilling !== undefined;
}

/** Requests in flight on a worker (see ownCountIsLoad). */
export function inFlight(hb: Heartbeat, out: Outstanding | undefined): number {
  const own = (out?.requests ?? 0) + (out?.running ?? 0);
  return ownCountIsLoad(hb) ? own : Math.max(hb.queue.queuedRequests + hb.queue.runningRequests, own);
}

export interface RouteInput {
  readonly request: RouteRequest;
  /** The attempt this decision is for (1 for the first offer). */
  readonly attempt: number;
  readonly view: HeartbeatView;
  readonly nowMs: number;
  readonly catalog: CatalogAnswer;
  readonly outstanding: ReadonlyMap<WorkerId, Outstanding>;
  /** Workers that already declined, timed out or failed this request. */
  readonly exclude: ReadonlySet<WorkerId>;
  readonly policy: RouterPolicy;
  /** Round-robin position: the caller's count of requests routed so far (only order "round_robin" reads it). */
  readonly turn?: number;
}

/** The round-robin policy (config controller.routing: round_robin). */
export const roundRobinRouterPolicy: RouterPolicy = {
  ...defaultRouterPolicy,
  name: "round_robin/v1",
  order: "round_robin",
};

/** Steps sharedPrefillTokens follows; past it the rest ahead counts whole, as if served first. */
export const MAX_SHARED_STEPS = 64;

/**
 * Others' prefill rows in the steps that carry a new prompt's `own` rows
 * (at least one: a fully cached prompt still runs its last token). The
 * `aheadRequests` attempts ahead, `aheadTokens` rows in all (the controller
 * counts per worker, not per attempt), take up to a tile each of the step's
 * budget first (stepTokens less one row per decode lane); the new prompt
 * takes up to a tile of what is left. Pure; at most MAX_SHARED_STEPS steps.
 */
export function sharedPrefillTokens(
  aheadTokens: number,
  aheadRequests: number,
  decodeRows: number,
  own: number,
  batching: { readonly stepTokens: number; readonly prefillTile: number },
): number {
  if (aheadTokens <= 0) return 0;
  const budget = Math.max(1, batching.stepTokens - decodeRows);
  const tile = Math.max(1, batching.prefillTile);
  const aheadPerStep = Math.min(budget, Math.max(1, aheadRequests) * tile);
  let ahead = aheadTokens;
  let mine = Math.max(1, own);
  let shared = 0;
  for (let step = 0; step < MAX_SHARED_STEPS && mine > 0; step++) {
    const taken = Math.min(ahead, aheadPerStep);
    ahead -= taken;
    shared += taken;
    mine -= Math.min(mine, tile, budget - taken);
  }
  return mine > 0 ? shared + ahead : shared;
}

/** The predicted terms of one candidate on one worker. */
export function predictTerms(
  hb: Heartbeat,
  candidate: Pick<Candidate, "cachedTokens" | "bytesByTier">,
  promptTokens: number,
  outstanding: Outstanding | undefined,
): TtftTerms {
  const c = hb.costs;
  const own = ownCountIsLoad(hb);
  const queuedTokens = own
    ? (outstanding?.tokens ?? 0)
    : Math.max(hb.queue.queuedTokens, outstanding?.tokens ?? 0);
  const queuedRequests = own
    ? (outstanding?.requests ?? 0)
    : Math.max(hb.queue.queuedRequests, outstanding?.requests ?? 0);
  const b = candidate.bytesByTier;
  const r = c.restoreMsPerMiB;
  const fetchMs = (b.ram * r.ram + b.ssd * r.ssd + b.peer * r.peer + b.s3 * r.s3) / MIB;
  const bytes = b.ram + b.ssd + b.peer + b.s3;
  const uncached = Math.max(0, promptTokens - candidate.cachedTokens);
  const batching = own ? hb.queue.batching : undefined;
  const queueMs =
    batching === undefined
      ? queuedTokens * c.prefillPerTokenMs + queuedRequests * c.firstTokenMs
      : sharedPrefillTokens(queuedTokens, queuedRequests, outstanding?.running ?? 0, uncached, batching) *
        c.prefillPerTokenMs;
  return {
    queueMs,
    fetchMs,
    uploadMs: (bytes / MIB) * c.uploadMsPerMiB,
    prefillMs: uncached * c.prefillPerTokenMs,
    firstTokenMs: c.firstTokenMs,
  };
}

export function ttftOf(t: TtftTerms, w: TtftWeights = unitWeights): number {
  return (
    Math.max(w.queue * t.queueMs, w.fetch * t.fetchMs) +
    w.upload * t.uploadMs +
    w.prefill * t.prefillMs +
    w.firstToken * t.firstTokenMs
  );
}

const SOURCE_ORDER = { resident: 0, ram: 1, ssd: 2, peer: 3, s3: 4, recompute: 5 } as const;

/** Rank order: TTFT ascending, then cached tokens descending, then worker id, then source. */
export function compareCandidates(a: CandidateRecord, b: CandidateRecord): number {
  if (a.predictedTtftMs !== b.predictedTtftMs) return a.predictedTtftMs - b.predictedTtftMs;
  if (a.cachedTokens !== b.cachedTokens) return b.cachedTokens - a.cachedTokens;
  if (a.workerId !== b.workerId) return a.workerId < b.workerId ? -1 : 1;
  return SOURCE_ORDER[a.source] - SOURCE_ORDER[b.source];
}

/** The hard constraint a candidate breaks on a worker, or null. */
export function violatedConstraint(
  hb: Heartbeat,
  request: RouteRequest,
  candidate: Candidate,
): Pick<DroppedCandidate, "reason" | "detail"> | null {
  if (hb.modelFingerprint !== request.modelFingerprint) {
    return { reason: "wrong_model", detail: `worker serves ${hb.modelFingerprint.slice(0, 12)}` };
  }
  const total = request.promptTokens + request.maxTokens;
  if (total > hb.maxContext) {
    return {
      reason: "context_too_long",
      detail: `prompt + max tokens = ${total} > context ${hb.maxContext}`,
    };
  }
  // Whole pages of a resident prefix are shared, not allocated again.
  const shared = candidate.source === "resident" ? Math.floor(candidate.cachedTokens / hb.pageTokens) : 0;
  const need = pagesFor(total as TokenCount, hb.pageTokens) - shared;
  const have = hb.freePages + hb.evictablePages;
  if (need > have) {
    return {
      reason: "pages_short",
      detail: `needs ${need} pages, has ${hb.freePages} free + ${hb.evictablePages} evictable`,
    };
  }
  return null;
}

/**
 * Routes one request: derives candidates from the live view and the catalog
 * answer, drops those breaking a hard constraint, predicts and ranks the
 * rest. The returned record holds the inputs and reasons; `choice` is the
 * best candidate (null when nothing is feasible).
 */
export function route(input: RouteInput): DecisionRecord {
  const { request, policy } = input;
  const live = liveWorkers(input.view, input.nowMs, policy.heartbeatTtlMs);
  const dropped: DroppedCandidate[] = [];
  const liveIds = new Set(live.map((l) => l.heartbeat.workerId));
  const offline = [...input.view.entries.keys()].filter((id) => !liveIds.has(id)).sort();
  for (const id of offline) {
    dropped.push({ workerId: id, source: "recompute", reason: "offline", detail: "no live heartbeat" });
  }
  const eligible = live.filter((l) => {
    if (!l.heartbeat.ready) {
      dropped.push({
        workerId: l.heartbeat.workerId,
        source: "recompute",
        reason: "warming",
        detail: "the worker has not finished warming up",
      });
      return false;
    }
    if (!input.exclude.has(l.heartbeat.workerId)) return true;
    dropped.push({
      workerId: l.heartbeat.workerId,
      source: "recompute",
      reason: "already_tried",
      detail: "failed an earlier attempt of this request",
    });
    return false;
  });
  const derived = deriveCandidates(request, eligible, input.catalog, {
    residentFreshMs: policy.residentFreshMs,
    liveHolders: liveIds,
    peers: policy.peers,
  });
  dropped.push(...derived.dropped);

  const byWorker = new Map<WorkerId, Heartbeat>(eligible.map((l) => [l.heartbeat.workerId, l.heartbeat]));
  // Bounded load: cap = max(slack, factor × (Σ load + 1) / n).
  let totalLoad = 0;
  const loadOf = new Map<WorkerId, number>();
  for (const l of eligible) {
    const load = inFlight(l.heartbeat, input.outstanding.get(l.heartbeat.workerId));
    loadOf.set(l.heartbeat.workerId, load);
    totalLoad += load;
  }
  const cap = Math.max(
    policy.loadSlack,
    (policy.loadFactor * (totalLoad + 1)) / Math.max(1, eligible.length),
  );
  const ranked: CandidateRecord[] = [];
  for (const c of derived.candidates) {
    const hb = byWorker.get(c.workerId)!;
    const load = loadOf.get(c.workerId)!;
    const bad: Pick<DroppedCandidate, "reason" | "detail"> | null =
      violatedConstraint(hb, request, c) ??
      (load + 1 > cap
        ? { reason: "overloaded", detail: `${load} in flight; bounded share is ${cap.toFixed(2)}` }
        : null);
    if (bad) {
      dropped.push({ workerId: c.workerId, source: c.source, ...bad });
      continue;
    }
    const terms = predictTerms(hb, c, request.promptTokens, input.outstanding.get(c.workerId));
    ranked.push({
      workerId: c.workerId,
      source: c.source,
      cachedTokens: c.cachedTokens,
      boundary: c.boundary,
      terms,
      predictedTtftMs: ttftOf(terms, policy.weights),
    });
  }
  ranked.sort(compareCandidates);
  return {
    ...record(input, ranked, dropped),
    choice: policy.order === "round_robin" ? roundRobinChoice(ranked, input.turn ?? 0) : (ranked[0] ?? null),
  };
}

/**
 * The workers with a feasible candidate, by id, taken in turn: worker
 * (turn mod n); its best-ranked candidate (ranked is in rank order).
 */
export function roundRobinChoice(ranked: readonly CandidateRecord[], turn: number): CandidateRecord | null {
  if (!Number.isSafeInteger(turn) || turn < 0)
    throw new RangeError(`turn must be an integer ≥ 0, got ${turn}`);
  const workers = [...new Set(ranked.map((c) => c.workerId))].sort();
  if (workers.length === 0) return null;
  const w = workers[turn % workers.length]!;
  return ranked.find((c) => c.workerId === w)!;
}

function record(
  input: RouteInput,
  ranked: CandidateRecord[],
  dropped: DroppedCandidate[],
): Omit<DecisionRecord, "choice"> {
  const { request, policy } = input;
  return {
    requestId: request.requestId,
    attempt: input.attempt,
    modelFingerprint: request.modelFingerprint,
    promptTokens: request.promptTokens,
    maxTokens: request.maxTokens,
    policy: policy.name,
    ranked,
    dropped,
    measuredTtftMs: null,
  };
}
