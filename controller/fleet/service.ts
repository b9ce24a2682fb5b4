import type { CatalogDb } from "../../catalog/db.ts";
import { StreamQueue } from "../../schema/channel.ts";
import type { DecisionRecord, Offer } from "../../schema/control.ts";
import type { ModelFingerprint, TokenCount, WorkerId } from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import { ApiError, unavailable } from "../api/errors.ts";
import {
  type FleetWorkerView,
  type Generation,
  type GenerationEvent,
  type GenerationRequest,
  type InferenceService,
  type ModelInfo,
  prefixSalt,
  type ServiceGauges,
  type TextCodec,
} from "../api/service.ts";
import {
  type AssignmentCommand,
  type AssignmentEvent,
  type AssignmentLimits,
  type AssignmentState,
  isTerminal,
  outstandingByWorker,
  startAssignment,
  stepAssignment,
} from "../assignments.ts";
import { type ChainBoundary, noCatalogAnswer, planChain, type RouteRequest } from "../candidates.ts";
import { catalogAnswer } from "../catalog-answer.ts";
import { liveWorkers, prefillRemaining } from "../heartbeat-view.ts";
import { type RouterPolicy, route } from "../router.ts";
import type { RecentDecisions } from "../ui/recent-decisions.ts";
import { type DecisionContext, decisionContext, type MeasuredOutcome } from "./decision-text.ts";
import { type DecisionRecorder, decisionOps } from "./decisions.ts";
import type { DemandWindow } from "./demand.ts";
import type { AssignmentMessage, WorkerHub } from "./hub.ts";

/**
 * The fleet's inference service: the HTTP front door's requests routed to
 * WebSocket-connected workers.
 *
 * Per request: plan the chunk chain (the tenant's salt), derive candidates
 * from the live heartbeat view and the controller's own catalog replica,
 * route (controller/router.ts), then drive the fenced assignment machine
 * (controller/assignments.ts): offer with a timeout, and on a decline,
 * timeout, failed result or lost worker offer the next candidate with
 * attempt + 1. Late messages of old attempts are ignored, counted and — for
 * an accept or tokens — answered with a cancel so the worker stops.
 *
 * Decisions (candidates, choice, predicted and measured TTFT) go to the
 * catalog through the DecisionRecorder, one record per offered attempt.
 *
 * Time: the hub's monotonic clock. Timeouts are checked by a tick every
 * `tickMs`, so an offer timeout fires within tickMs of its deadline.
 */

export interface FleetModel {
  readonly id: string;
  readonly fingerprint: ModelFingerprint;
  readonly maxContext: number;
  readonly codec: TextCodec;
}

export interface FleetCatalog {
  /** The replica's db now. */
  db(): CatalogDb;
  /** Transactions in the log not yet applied here. */
  lag(): number;
}

export interface FleetOptions {
  readonly model: FleetModel;
  readonly chunkTokens: number;
  readonly limits: AssignmentLimits;
  readonly policy: RouterPolicy;
  /** Requests routed or running at once; one more is refused with 429. */
  readonly maxActive: number;
  readonly tickMs: number;
  readonly log: Logger;
  /** The web view's ring of recent decisions (absent: no web view). */
  readonly recent?: Pick<RecentDecisions, "routed" | "measured">;
  /** Demand observations for placement, proposed through the recorder every `everyMs` (absent: none). */
  readonly demand?: { readonly window: DemandWindow; readonly everyMs: number };
}

interface Flight {
  readonly req: GenerationRequest;
  readonly salt: string;
  readonly routeRequest: RouteRequest;
  readonly stream: StreamQueue<GenerationEvent>;
  state: AssignmentState;
  /** The decision of the current attempt, until it ends, with the inputs it was made from. */
  decision: DecisionRecord | null;
  context: DecisionContext | null;
  /** The worker's split of its time to first token, from its result (current attempt). */
  measuredTerms: MeasuredOutcome["terms"] | null;
  offeredAtMs: number;
  firstTokenAtMs: number | null;
}

export interface FleetCounters {
  requests: number;
  completed: number;
  failed: number;
  attempts: number;
  declines: number;
  timeouts: number;
  workerLost: number;
  lateIgnored: number;
  refusedNoWorker: number;
}

export class FleetService implements InferenceService {
  private readonly active = new Map<string, Flight>();
  /** Requests routed so far (first attempts): the round-robin position. */
  private turn = 0;
  private readonly info: ModelInfo;
  private readonly timer: NodeJS.Timeout;
  private readonly demandTimer: NodeJS.Timeout | null;
  private readonly cacheTokens: Record<string, number> = {
    resident: 0,
    ram: 0,
    ssd: 0,
    peer: 0,
    s3: 0,
    recompute: 0,
  };
  readonly counters: FleetCounters = {
    requests: 0,
    completed: 0,
    failed: 0,
    attempts: 0,
    declines: 0,
    timeouts: 0,
    workerLost: 0,
    lateIgnored: 0,
    refusedNoWorker: 0,
  };

  constructor(
    private readonly hub: WorkerHub,
    private readonly catalog: FleetCatalog | null,
    private readonly recorder: DecisionRecorder | null,
    private readonly opts: FleetOptions,
  ) {
    this.info = {
      id: opts.model.id,
      created: Math.floor(Date.now() / 1000),
      maxContext: opts.model.maxContext,
      codec: opts.model.codec,
    };
    hub.setListener({
      onAssignment: (m) => this.onAssignment(m),
      onWorkerLost: (id, reason) => this.onWorkerLost(id, reason),
    });
    this.timer = setInterval(() => this.tick(), opts.tickMs);
    const demand = opts.demand;
    this.demandTimer =
      demand && recorder
        ? setInterval(() => recorder.add(demand.window.drain(Date.now())), demand.everyMs)
        : null;
  }

  models(): readonly ModelInfo[] {
    return [this.info];
  }

  /** Fails every open request and stops the tick (the hub and recorder are closed by their owners). */
  close(): void {
    clearInterval(this.timer);
    if (this.demandTimer) clearInterval(this.demandTimer);
    const demand = this.opts.demand;
    if (demand && this.recorder) this.recorder.add(demand.window.drain(Date.now()));
    for (const f of [...this.active.values()])
      this.apply(f, { type: "cancel", reason: "the controller is stopping" });
  }

  generate(req: GenerationRequest): Generation {
    if (req.model !== this.info.id) throw new ApiError(404, `model ${req.model} is not served here`);
    if (this.active.has(req.requestId))
      throw new ApiError(400, `request ${req.requestId} is already running`);
    if (this.active.size >= this.opts.maxActive)
      throw new ApiError(429, `the controller has ${this.opts.maxActive} requests in flight`);
    const now = this.hub.nowMs();
    const live = liveWorkers(this.hub.view, now, this.opts.policy.heartbeatTtlMs);
    if (!live.some((l) => l.heartbeat.ready)) {
      this.counters.refusedNoWorker++;
      throw live.length === 0
        ? unavailable("no live worker is connected to the controller", 1, "no_live_worker")
        : unavailable(`no worker is ready: ${live.length} connected, still warming up`, 1, "no_ready_worker");
    }
    const salt = prefixSalt(req.tenant, req.cacheSalt) ?? "";
    const chain: ChainBoundary[] = planChain(
      this.opts.model.fingerprint,
      req.prompt,
      this.opts.chunkTokens,
      salt === "" ? undefined : salt,
    );
    // Tokens, one end or error: bounded by the request's own output.
    const stream = new StreamQueue<GenerationEvent>(req.maxTokens + 2);
    const started = startAssignment(req.requestId, req.prompt.length, now);
    const flight: Flight = {
      req,
      salt,
      routeRequest: {
        requestId: req.requestId,
        modelFingerprint: this.opts.model.fingerprint,
        chain,
        promptTokens: req.prompt.length as TokenCount,
        maxTokens: req.maxTokens as TokenCount,
      },
      stream,
      state: started.state,
      decision: null,
      context: null,
      measuredTerms: null,
      offeredAtMs: now,
      firstTokenAtMs: null,
    };
    this.active.set(req.requestId, flight);
    this.counters.requests++;
    this.run(flight, started.commands);
    return {
      events: stream,
      cancel: () => this.apply(flight, { type: "cancel", reason: "the client went away" }),
    };
  }

  gauges(): ServiceGauges {
    const live = liveWorkers(this.hub.view, this.hub.nowMs(), this.opts.policy.heartbeatTtlMs);
    let free = 0;
    let evictable = 0;
    let queue = 0;
    for (const { heartbeat: hb } of live) {
      free += hb.freePages;
      evictable += hb.evictablePages;
      queue += hb.queue.queuedRequests + hb.queue.runningRequests;
    }
    let routing = 0;
    for (const f of this.active.values())
      if (f.state.phase === "routing" || f.state.phase === "offered") routing++;
    return {
      pagesFree: free,
      // Heartbeats report free and evictable pages, not pool sizes: the sum is what the fleet could hand out now.
      pagesTotal: free + evictable,
      queueDepth: queue + routing,
      catalogLag: this.catalog?.lag() ?? 0,
      cacheTokensBySource: { ...this.cacheTokens },
    };
  }

  workers(): readonly FleetWorkerView[] {
    const now = this.hub.nowMs();
    const live = new Set(
      liveWorkers(this.hub.view, now, this.opts.policy.heartbeatTtlMs).map((l) => l.heartbeat.workerId),
    );
    return [...this.hub.view.entries]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([workerId, e]) => {
        const hb = e.heartbeat;
        return {
          workerId,
          live: live.has(workerId),
          ready: hb?.ready ?? null,
          heartbeatAgeMs: hb ? Math.max(0, now - e.receivedAtMs) : null,
          freePages: hb?.freePages ?? null,
          evictablePages: hb?.evictablePages ?? null,
          queuedRequests: hb?.queue.queuedRequests ?? null,
          runningRequests: hb?.queue.runningRequests ?? null,
          status: hb?.status ?? null,
        };
      });
  }

  /** Workers placement may put copies on: live and ready now. */
  placeableWorkers(): WorkerId[] {
    return liveWorkers(this.hub.view, this.hub.nowMs(), this.opts.policy.heartbeatTtlMs)
      .filter((l) => l.heartbeat.ready)
      .map((l) => l.heartbeat.workerId);
  }

  /** Requests routed or running now. */
  get inFlight(): number {
    return this.active.size;
  }

  // ---- the assignment driver ---------------------------------------------------

  private apply(f: Flight, event: AssignmentEvent): void {
    if (this.active.get(f.req.requestId) !== f) return;
    const before = f.state.lateIgnored;
    const step = stepAssignment(f.state, event, this.hub.nowMs(), this.opts.limits);
    f.state = step.state;
    if (step.state.lateIgnored > before) {
      this.counters.lateIgnored += step.state.lateIgnored - before;
      const msg = "msg" in event ? event.msg : null;
      this.opts.log.log("info", "assignment.late_ignored", {
        requestId: f.req.requestId,
        attempt: msg?.attempt,
        current: f.state.attempt,
        workerId: msg?.workerId,
        kind: event.type,
      });
    }
    this.run(f, step.commands);
  }

  /** Executes commands; a route answers with a `routed` event at once (routing is synchronous). */
  private run(f: Flight, commands: AssignmentCommand[]): void {
    for (const cmd of commands) {
      switch (cmd.type) {
        case "route":
          this.endAttempt(f);
          this.routeNext(f, cmd.attempt, cmd.exclude);
          break;
        case "offer":
          this.offer(f, cmd);
          break;
        case "cancel":
          this.hub.sendCancel(cmd.workerId, {
            requestId: f.req.requestId,
            attempt: cmd.attempt,
            reason: cmd.reason,
          });
          break;
        case "deliver":
          if (f.firstTokenAtMs === null) {
            f.firstTokenAtMs = this.hub.nowMs();
            this.opts.recent?.measured(f.req.requestId, cmd.attempt, f.firstTokenAtMs - f.offeredAtMs);
            this.opts.log.log("info", "assignment.first_token", {
              requestId: f.req.requestId,
              attempt: cmd.attempt,
              workerId: f.state.workerId,
              ttftMs: Math.round(f.firstTokenAtMs - f.state.arrivalMs),
            });
          }
          for (const [i, token] of cmd.tokens.entries())
            f.stream.push({
              type: "token",
              token,
              logprob: cmd.logprobs?.[i] ?? null,
              ...(i === 0 && cmd.promptLogprobs ? { promptLogprobs: cmd.promptLogprobs } : {}),
            });

          break;
        case "finish":
          this.finish(f, cmd);
          break;
      }
    }
  }

  private routeNext(f: Flight, attempt: number, exclude: readonly WorkerId[]): void {
    const now = this.hub.nowMs();
    const answer = this.catalog ? catalogAnswer(this.catalog.db(), f.routeRequest.chain) : noCatalogAnswer;
    // Demand, once per request: the deepest chunk of its chain published now.
    const published = answer.replicas.length;
    if (attempt === 1 && published > 0)
      this.opts.demand?.window.observe(f.routeRequest.chain[published - 1]!.nodeId, f.req.tenant);
    const outstanding = outstandingByWorker(
      [...this.active.values()].filter((x) => x !== f).map((x) => x.state),
      prefillRemaining(this.hub.view),
    );
    const turn = attempt === 1 ? this.turn++ : this.turn - 1;
    const decision = route({
      request: f.routeRequest,
      attempt,
      view: this.hub.view,
      nowMs: now,
      catalog: answer,
      outstanding,
      exclude: new Set(exclude),
      policy: this.opts.policy,
      turn,
    });
    f.decision = decision;
    f.measuredTerms = null;
    f.context = decisionContext({
      routedAtMs: Date.now(),
      turn,
      weights: this.opts.policy.weights,
      chain: f.routeRequest.chain,
      published,
      live: liveWorkers(this.hub.view, now, this.opts.policy.heartbeatTtlMs),
      outstanding,
    });
    this.opts.recent?.routed(decision, Date.now());
    this.opts.log.log("info", "assignment.routed", {
      requestId: f.req.requestId,
      attempt,
      workerId: decision.choice?.workerId ?? null,
      source: decision.choice?.source ?? null,
      cachedTokens: decision.choice?.cachedTokens ?? 0,
      predictedTtftMs: decision.choice ? Math.round(decision.choice.predictedTtftMs * 100) / 100 : null,
      ranked: decision.ranked.length,
      dropped: decision.dropped.map((d) => `${d.workerId}:${d.source}:${d.reason}`),
    });
    // The best few candidates with their terms: why this worker won (debug; the full record goes to the catalog).
    this.opts.log.log("debug", "assignment.ranked", {
      requestId: f.req.requestId,
      attempt,
      ranked: decision.ranked.slice(0, 4).map((c) => ({
        workerId: c.workerId,
        source: c.source,
        cachedTokens: c.cachedTokens,
        predictedTtftMs: Math.round(c.predictedTtftMs * 100) / 100,
        terms: c.terms,
      })),
    });
    this.apply(f, { type: "routed", choice: decision.choice });
  }

  private offer(f: Flight, cmd: Extract<AssignmentCommand, { type: "offer" }>): void {
    this.counters.attempts++;
    f.offeredAtMs = this.hub.nowMs();
    const s = f.req.sampling;
    const sent = this.hub.sendOffer(cmd.workerId, {
      requestId: f.req.requestId,
      attempt: cmd.attempt,
      workerId: cmd.workerId,
      modelFingerprint: this.opts.model.fingerprint,
      prompt: f.req.prompt,
      maxTokens: f.req.maxTokens as TokenCount,
      cacheSalt: f.salt,
      sampling: offerSampling(s),
      plan: {
        source: cmd.choice.source,
        cachedTokens: cmd.choice.cachedTokens,
        predictedTtftMs: cmd.choice.predictedTtftMs,
      },
      ...offerExtras(f.req, this.info.codec.eosTokenIds),
    });
    this.opts.log.log("info", "assignment.offered", {
      requestId: f.req.requestId,
      attempt: cmd.attempt,
      workerId: cmd.workerId,
      sent,
    });
    if (!sent) this.apply(f, { type: "worker_lost", workerId: cmd.workerId });
  }

  /** The current attempt is over (failed over or finished): its decision goes to the catalog. */
  private endAttempt(f: Flight): void {
    const d = f.decision;
    if (d === null) return;
    f.decision = null;
    const streamed = f.state.streamAttempt === d.attempt && f.firstTokenAtMs !== null;
    const measured: MeasuredOutcome | null = streamed
      ? { ttftMs: f.firstTokenAtMs! - f.offeredAtMs, ...(f.measuredTerms ? { terms: f.measuredTerms } : {}) }
      : null;
    const ctx = f.context;
    f.context = null;
    this.recorder?.add(decisionOps(d, f.req.tenant, ctx?.routedAtMs ?? Date.now(), measured, ctx));
  }

  private finish(f: Flight, cmd: Extract<AssignmentCommand, { type: "finish" }>): void {
    this.endAttempt(f);
    this.active.delete(f.req.requestId);
    const fields = { requestId: f.req.requestId, attempt: f.state.attempt, workerId: f.state.workerId };
    if (cmd.outcome === "completed") {
      this.counters.completed++;
      const choice = f.state.choice;
      const cached = choice?.cachedTokens ?? 0;
      if (choice) this.cacheTokens[choice.source] = (this.cacheTokens[choice.source] ?? 0) + cached;
      this.cacheTokens.recompute = (this.cacheTokens.recompute ?? 0) + f.req.prompt.length - cached;
      this.opts.log.log("info", "assignment.completed", { ...fields, tokens: f.state.delivered });
      f.stream.push({
        type: "end",
        reason: cmd.detail === "length" ? "length" : "stop",
        cachedTokens: cached,
      });
    } else {
      this.counters.failed++;
      this.opts.log.log("warn", "assignment.failed", { ...fields, reason: cmd.reason, detail: cmd.detail });
      if (cmd.reason === "cancelled") {
        f.stream.push({ type: "end", reason: "cancelled", cachedTokens: f.state.choice?.cachedTokens ?? 0 });
      } else {
        f.stream.push({
          type: "error",
          message: `request failed (${cmd.reason}): ${cmd.detail}`,
          failure: cmd.reason === "deadline" ? "deadline" : "unavailable",
        });
      }
    }
    f.stream.close();
  }

  // ---- hub events ------------------------------------------------------------

  private onAssignment(m: AssignmentMessage): void {
    const f = this.active.get(m.msg.requestId);
    if (m.type === "decline") {
      this.counters.declines++;
      this.opts.log.log("info", "assignment.declined", {
        requestId: m.msg.requestId,
        attempt: m.msg.attempt,
        workerId: m.msg.workerId,
        reason: m.msg.reason,
        detail: m.msg.detail,
      });
    }
    if (m.type === "result" && f?.decision?.attempt === m.msg.attempt && m.msg.measuredTerms)
      f.measuredTerms = m.msg.measuredTerms;
    if (f === undefined || isTerminal(f.state)) {
      // A message for a request that already ended: late. An accept or tokens
      // means the worker is spending pages on it, so it is told to stop.
      this.counters.lateIgnored++;
      this.opts.log.log("info", "assignment.late_ignored", {
        requestId: m.msg.requestId,
        attempt: m.msg.attempt,
        workerId: m.msg.workerId,
        kind: m.type,
      });
      if (m.type === "accept" || m.type === "tokens") {
        this.hub.sendCancel(m.msg.workerId, {
          requestId: m.msg.requestId,
          attempt: m.msg.attempt,
          reason: "fenced: the request has ended",
        });
      }
      return;
    }
    this.apply(f, m as AssignmentEvent);
  }

  private onWorkerLost(workerId: WorkerId, reason: string): void {
    this.opts.log.log("warn", "fleet.worker_lost", { workerId, reason });
    for (const f of [...this.active.values()]) {
      if (f.state.workerId !== workerId) continue;
      this.counters.workerLost++;
      this.apply(f, { type: "worker_lost", workerId });
    }
  }

  private tick(): void {
    for (const f of [...this.active.values()]) {
      const { attempt, workerId, phase } = f.state;
      this.apply(f, { type: "tick" });
      if (f.state.attempt !== attempt || isTerminal(f.state)) {
        this.counters.timeouts++;
        this.opts.log.log("warn", "assignment.timeout", {
          requestId: f.req.requestId,
          attempt,
          workerId,
          phase,
        });
      }
    }
  }
}

/**
 * The offer's sampling: only what differs from the neutral value is sent, so
 * a request that sets none of issue 17's fields is offered as before.
 */
function offerSampling(s: GenerationRequest["sampling"]): Offer["sampling"] {
  return {
    temperature: s.temperature,
    topP: s.topP,
    topK: s.topK,
    ...(s.seed === undefined ? {} : { seed: s.seed }),
    ...(s.minP === 0 ? {} : { minP: s.minP }),
    ...(s.repetitionPenalty === 1 ? {} : { repetitionPenalty: s.repetitionPenalty }),
    ...(s.presencePenalty === 0 ? {} : { presencePenalty: s.presencePenalty }),
    ...(s.frequencyPenalty === 0 ? {} : { frequencyPenalty: s.frequencyPenalty }),
    ...(s.logitBias.length === 0 ? {} : { logitBias: s.logitBias.map(([t, b]) => [t, b] as const) }),
    ...(s.minTokens === 0 ? {} : { minTokens: s.minTokens }),
    ...(s.allowedTokenIds === null ? {} : { allowedTokenIds: s.allowedTokenIds }),
  };
}

/** The offer's other request fields, each only when the request sets it. */
function offerExtras(req: GenerationRequest, eos: readonly number[]) {
  const set = (xs: readonly number[]) => [...new Set(xs)].sort((a, b) => a - b).join(",");
  return {
    ...(set(req.stopTokenIds) === set(eos) ? {} : { stopTokenIds: req.stopTokenIds }),
    ...(req.priority === 0 ? {} : { priority: req.priority }),
    ...(req.logprobs === null ? {} : { logprobs: req.logprobs }),
    ...(req.promptLogprobs === null ? {} : { promptLogprobs: req.promptLogprobs }),
    ...(req.constraint === null ? {} : { constraint: req.constraint as Offer["constraint"] & object }),
  };
}
