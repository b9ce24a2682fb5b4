import { randomInt } from "node:crypto";
import { Effect, Fiber, type Scope } from "effect";
import type { Engine } from "../../native/index.ts";
import { StreamQueue } from "../../schema/channel.ts";
import {
  ContinuationId,
  type ModelFingerprint,
  type PageCount,
  type PrefixHash,
  pagesFor,
  type RequestId,
  TokenCount,
} from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import { type Calibration, type ConfiguredCosts, CostCalibrator } from "../calibration/calibration.ts";
import { initialSamplerState, nextToken, samplingParams } from "../model/sampling.ts";
import { PageManager, type PagePoolSnapshot } from "../pages/page-manager.ts";
import { PageError } from "../pages/page-state.ts";
import {
  applyEviction,
  planEviction,
  type ResidencyInputs,
  type RoutePolicy,
} from "../residency/residency.ts";
import type { PrefixRestorer, RouteCheckpointer } from "../restore/hooks.ts";
import { type Admission, type Preemption, planIteration } from "../scheduler/plan-iteration.ts";
import { type Budgets, phaseOf, type RequestRecord } from "../scheduler/request.ts";
import { buildBatch, type Lane, stepShape } from "./batch.ts";
import { PrefillPacer } from "./prefill-pacer.ts";
import { type RuntimeEvent, Sequence } from "./sequence.ts";

export interface RuntimeOptions {
  readonly fingerprint: ModelFingerprint;
  readonly vocab: number;
  /** Prompt plus generation may not exceed this (the model's positions). */
  readonly maxContext: number;
  readonly pageTokens: number;
  readonly physicalPages: number;
  readonly maxBatchTokens: number;
  readonly maxBatchSeqs: number;
  readonly minPrefillTokens: number;
  readonly prefillTile: number;
  /**
   * Keeps running decodes at pace: while any decodes, prefill tiles shrink
   * (to no less than minPrefillTokens) so a mixed step takes at most this
   * many times a decode-only step, by the measured costs (PrefillPacer).
   * Absent: tiles are always prefillTile.
   */
  readonly decodePace?: number;
  /** Requests admitted or waiting at once; one more is refused (the caller answers 429). */
  readonly maxQueued: number;
  readonly costs: ConfiguredCosts;
  readonly logger: Logger;
  /** Durable prefix restore (worker/restore): absent, only resident pages are reused. */
  readonly restore?: PrefixRestorer;
  /** Checkpoint of retired routes into durable chunks (worker/checkpoint): absent, nothing is captured. */
  readonly checkpoint?: RouteCheckpointer;
}

export interface SubmitRequest {
  readonly requestId: RequestId;
  /** The tenant's cache salt: its prefixes only ever match its own. */
  readonly salt: string | undefined;
  readonly prompt: readonly number[];
  readonly maxTokens: number;
  readonly temperature: number;
  readonly topP: number;
  readonly topK: number;
  /** Absent: a fresh random seed. */
  readonly seed: number | undefined;
  readonly stopTokenIds: readonly number[];
  /** Larger is more important; preemption takes the lowest first. Default 0. */
  readonly priority?: number;
}

export interface RuntimeGeneration {
  readonly events: AsyncIterable<RuntimeEvent>;
  /** Fences the request at once: no token is emitted after this call. */
  cancel(): void;
  /** Where the request's time went so far (the router's terms, measured). */
  timing(): RequestTiming;
}

/**
 * Measured counterparts of the router's TTFT terms (controller/router.ts):
 * queue = submission → first admission (null until admitted); fetch = the
 * durable restore's load, begin → settled (0 without one). The rest of the
 * time to the first token is prefill and the first token's step.
 */
export interface RequestTiming {
  readonly queueMs: number | null;
  readonly fetchMs: number;
}

/** Refused at submission; nothing was queued. `status` is the HTTP status that fits. */
export class SubmitError extends Error {
  override readonly name = "SubmitError";
  constructor(
    readonly status: 400 | 429 | 503,
    message: string,
  ) {
    super(message);
  }
}

export interface RuntimeStats {
  readonly pagesTotal: number;
  readonly pagesAvailable: number;
  readonly waiting: number;
  readonly running: number;
  readonly cachedPromptTokens: number;
  readonly computedPromptTokens: number;
  readonly generatedTokens: number;
  readonly steps: number;
  readonly preemptions: number;
  readonly evictedRoutes: number;
  /** Prompt tokens adopted from pages another running request computed (a subset of cachedPromptTokens). */
  readonly sharedInFlightTokens: number;
  readonly calibration: Calibration;
}

/**
 * Pushes one event to a request's consumer. The channel holds the request's
 * whole output, so a refusal means the runtime emitted more than it promised:
 * a bug, asserted here.
 */
function emit(seq: Sequence, ev: RuntimeEvent): void {
  if (!seq.events.push(ev))
    throw new Error(`request ${seq.id}: event channel refused ${ev.type} (full or closed)`);
}

/** A finished request's full pages, kept as a recomputable prefix cache until evicted. */
interface CacheRoute {
  readonly pages: number;
  hits: number;
}

/**
 * The device loop of one worker: continuous batching over a fixed page pool.
 *
 * Each iteration: fence cancellations; ask the pure scheduler for a plan;
 * preempt and admit as it says (evicting cached prefixes when admission needs
 * their pages); reserve slots for every scheduled row; build one ragged batch;
 * run one native step off the JS thread; commit the rows (sealing full pages
 * with their prefix hash so later requests can share them); sample the decode
 * lanes and stream their tokens. Requests join and leave between steps.
 *
 * Prefix reuse: a request's prompt pages are hashed as a chain; admission
 * adopts the longest run of resident pages with those hashes, so it computes
 * only the rest. When a request ends, its full pages live on in a cache route
 * (recomputable, evicted lowest value first) for the next request that shares
 * its prefix.
 */
export class WorkerRuntime {
  readonly pages: PageManager;
  private readonly seqs = new Map<RequestId, Sequence>();
  private readonly cache = new Map<ContinuationId, CacheRoute>();
  /** Requests whose restore is loading pages: not runnable, not preemptible, until it settles. */
  private readonly restoring = new Set<RequestId>();
  /** Each sequence's restore load, begin → settled, in ms (RequestTiming.fetchMs). */
  private readonly restoreMs = new WeakMap<Sequence, number>();
  private readonly calibrator: CostCalibrator;
  private readonly pacer: PrefillPacer | null;
  private wake: (() => void) | null = null;
  /** A signal arrived since the current iteration began: the loop must not sleep. */
  private signalled = false;
  private loopFiber: Fiber.Fiber<void> | null = null;
  private stopping = false;
  private arrivals = 0;
  private counters = {
    cachedPromptTokens: 0,
    computedPromptTokens: 0,
    generatedTokens: 0,
    steps: 0,
    preemptions: 0,
    evictedRoutes: 0,
    sharedInFlightTokens: 0,
  };

  constructor(
    private readonly engine: Engine,
    private readonly opts: RuntimeOptions,
  ) {
    this.pages = new PageManager({ pageTokens: opts.pageTokens, physicalPages: opts.physicalPages });
    this.calibrator = new CostCalibrator(opts.costs);
    this.pacer =
      opts.decodePace === undefined
        ? null
        : new PrefillPacer(
            opts.decodePace,
            Math.min(opts.minPrefillTokens, opts.prefillTile) || 1,
            opts.prefillTile,
          );
  }

  /**
   * The runtime as a scoped resource: its device loop is a fiber forked in
   * the scope. Closing the scope interrupts the loop (after the step in
   * flight: an iteration is uninterruptible, the wait for work is not), then
   * ends every open request with an error and refuses new ones. The engine is
   * the caller's resource, acquired before (scopedEngine) so it is released
   * after the loop stops.
   */
  static scoped(engine: Engine, opts: RuntimeOptions): Effect.Effect<WorkerRuntime, never, Scope.Scope> {
    return Effect.gen(function* () {
      const rt = new WorkerRuntime(engine, opts);
      // Finalizers run in reverse: the loop's interruption (forked below) first, then this.
      yield* Effect.addFinalizer(() => Effect.sync(() => rt.closeOpen()));
      rt.loopFiber = yield* Effect.forkScoped(rt.loop());
      return rt;
    });
  }

  /** Starts the device loop as a detached fiber (stop() interrupts it); or use scoped(). */
  start(): void {
    if (this.loopFiber) throw new Error("runtime already started");
    this.loopFiber = Effect.runFork(this.loop());
  }

  /** Stops the loop after the step in flight; every open request ends with an error. */
  async stop(): Promise<void> {
    this.stopping = true;
    this.signal();
    if (this.loopFiber) await Effect.runPromise(Fiber.interrupt(this.loopFiber));
    this.closeOpen();
  }

  private closeOpen(): void {
    this.stopping = true;
    for (const seq of [...this.seqs.values()]) this.fail(seq, "the worker is stopping");
  }

  submit(req: SubmitRequest): RuntimeGeneration {
    const o = this.opts;
    if (this.stopping) throw new SubmitError(503, "the worker is stopping");
    if (this.seqs.has(req.requestId))
      throw new SubmitError(400, `request ${req.requestId} is already running`);
    if (req.prompt.length === 0) throw new SubmitError(400, "the prompt is empty");
    for (const t of req.prompt) {
      if (!Number.isInteger(t) || t < 0 || t >= o.vocab)
        throw new SubmitError(400, `token ${t} is outside the vocabulary of ${o.vocab}`);
    }
    const total = req.prompt.length + req.maxTokens;
    if (total > o.maxContext) {
      throw new SubmitError(
        400,
        `prompt (${req.prompt.length}) plus max tokens (${req.maxTokens}) exceeds the context of ${o.maxContext}`,
      );
    }
    // One spare page for a copy-on-write tail.
    if (pagesFor(TokenCount(total), o.pageTokens) + 1 > o.physicalPages) {
      throw new SubmitError(
        400,
        `the request needs ${pagesFor(TokenCount(total), o.pageTokens) + 1} pages; the pool has ${o.physicalPages}`,
      );
    }
    if (this.seqs.size >= o.maxQueued)
      throw new SubmitError(429, `the worker has ${o.maxQueued} requests queued`);
    let params: ReturnType<typeof samplingParams>;
    try {
      params = samplingParams({
        temperature: req.temperature,
        topK: req.topK,
        topP: req.topP,
        seed: req.seed ?? randomInt(2 ** 47),
        stopTokens: req.stopTokenIds,
        maxTokens: req.maxTokens,
      });
    } catch (err) {
      throw new SubmitError(400, (err as Error).message);
    }
    const events = new StreamQueue<RuntimeEvent>(req.maxTokens + 1);
    const seq = new Sequence(
      req.requestId,
      [...req.prompt],
      req.prompt.length,
      initialSamplerState(params),
      req.priority ?? 0,
      this.arrivals++,
      events,
      o.pageTokens,
      req.salt,
      performance.now(),
    );
    this.seqs.set(seq.id, seq);
    this.opts.logger.log("debug", "request.queued", {
      requestId: seq.id,
      prompt: req.prompt.length,
      maxTokens: req.maxTokens,
    });
    this.signal();
    return {
      events,
      cancel: () => {
        if (seq.cancelled || events.isClosed) return;
        seq.cancelled = true;
        this.signal();
      },
      timing: () => ({
        queueMs: seq.cachedTokens < 0 ? null : seq.admittedAt - seq.submittedAt,
        fetchMs: this.restoreMs.get(seq) ?? 0,
      }),
    };
  }

  stats(): RuntimeStats {
    let waiting = 0;
    for (const s of this.seqs.values()) if (s.state === "waiting") waiting++;
    return {
      pagesTotal: this.opts.physicalPages,
      pagesAvailable: this.pages.availablePages,
      waiting,
      running: this.seqs.size - waiting,
      ...this.counters,
      calibration: this.calibrator.value,
    };
  }

  /** Page-prefix boundaries resident here (for heartbeats): the cached routes' hashes and token counts. */
  residentPrefixes(): PagePoolSnapshot["prefixes"] {
    return this.pages.snapshot().prefixes;
  }

  // ---- the loop ------------------------------------------------------------

  private signal(): void {
    this.signalled = true;
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  /**
   * The device loop as an Effect. Each iteration is one uninterruptible
   * step (a native step is never abandoned with its pages leased); the wait
   * for a submit or cancel is interruptible, so interruption lands there or
   * right after the iteration in flight.
   */
  private loop(): Effect.Effect<void> {
    const iteration = Effect.uninterruptible(Effect.promise(() => this.iterateOrFail()));
    const idle = Effect.callback<void>((resume) => {
      // The fiber may have yielded since the loop checked: a signal in between must not be lost.
      if (this.signalled || this.stopping) {
        resume(Effect.void);
        return;
      }
      this.wake = () => resume(Effect.void);
      return Effect.sync(() => {
        this.wake = null;
      });
    });
    const self = this;
    return Effect.gen(function* () {
      while (!self.stopping) {
        // Cleared before the iteration reads any state, so a submit or cancel
        // that lands after this point (during a step, or before the loop first
        // ran) is never lost: the loop iterates again instead of sleeping.
        self.signalled = false;
        const progressed = yield* iteration;
        if (!progressed && !self.stopping && !self.signalled) yield* idle;
      }
    });
  }

  /** One iteration; a thrown error (a bug, not bad input) fails every request rather than spin on it. */
  private async iterateOrFail(): Promise<boolean> {
    try {
      return await this.iterate();
    } catch (err) {
      this.opts.logger.log("error", "runtime.iteration_failed", {
        message: (err as Error).message,
        stack: (err as Error).stack,
      });
      for (const seq of [...this.seqs.values()]) this.fail(seq, `internal error: ${(err as Error).message}`);
      return false;
    }
  }

  /** One iteration; false when there was nothing to do. */
  private async iterate(): Promise<boolean> {
    // Before cancelled routes release their pages: a waiter adopts the pages
    // a cancelled producer sealed in its last step.
    this.adoptInFlightPrefixes();
    this.fenceCancelled();
    if (this.seqs.size === 0) return false;
    const now = this.counters.steps;
    const records = [...this.seqs.values()].map((s) => this.record(s));
    // The pacer's inputs: the decode lanes' rows and keys (a decode row at
    // position p attends p + 1 keys), and the furthest prefill's next row.
    const decodes = { rows: 0, keys: 0 };
    let prefillAt = -1;
    for (const r of records) {
      const phase = phaseOf(r).phase;
      if (phase === "decode" && r.state === "running" && r.runnable) {
        decodes.rows++;
        decodes.keys += r.processed + 1;
      } else if (phase !== "decode") prefillAt = Math.max(prefillAt, r.processed);
    }
    const plan = planIteration(records, this.budgets(decodes, prefillAt));
    for (const p of plan.preempt) this.preempt(p, now);
    let admitted = 0;
    for (const a of plan.admit) if (this.admit(a, now)) admitted++;

    // A lane whose rows moved since planning (its admission adopted a
    // different resident prefix than the plan assumed), or whose admission
    // began a restore, waits for the next plan.
    const scheduled = plan.scheduled.filter((w) => {
      const s = this.seqs.get(w.id);
      return (
        s?.state === "running" && !s.cancelled && w.firstRow === s.processed && !this.restoring.has(w.id)
      );
    });
    if (scheduled.length === 0) return admitted > 0;

    const lanes: Lane[] = [];
    const laneSeqs: Sequence[] = [];
    const copies: Promise<void>[] = [];
    for (const w of scheduled) {
      const seq = this.seqs.get(w.id)!;
      const append = this.pages.beginAppend(seq.route, w.tokens);
      for (const c of append.copies) copies.push(this.engine.copyPage(c.src, c.dst));
      lanes.push({
        tokens: seq.tokens.slice(seq.processed, seq.processed + w.tokens),
        firstPosition: seq.processed,
        slots: append.slots,
        pageTable: append.pageTable,
        wantLogits: w.phase === "decode",
      });
      laneSeqs.push(seq);
    }
    const built = buildBatch(lanes);
    const lease = this.pages.acquireLease(laneSeqs.map((s) => s.route));
    let logits: Float32Array;
    const t0 = performance.now();
    try {
      await Promise.all(copies);
      logits = await this.engine.step(built.batch);
    } catch (err) {
      for (const s of laneSeqs) this.pages.abortAppend(s.route);
      this.releaseLease(lease);
      for (const s of laneSeqs) this.fail(s, `step failed: ${(err as Error).message}`);
      return true;
    }
    const stepMs = performance.now() - t0;
    this.counters.steps++;
    let prefillRows = 0;
    for (const [i, seq] of laneSeqs.entries()) {
      const rows = lanes[i]!.tokens.length;
      const before = Math.floor(seq.processed / this.opts.pageTokens);
      seq.processed += rows;
      const sealed = seq.chain.extend(seq.tokens, seq.processed).slice(before);
      this.pages.commitAppend(seq.route, sealed);
      if (!lanes[i]!.wantLogits) {
        prefillRows += rows;
        this.counters.computedPromptTokens += rows;
      }
    }
    this.releaseLease(lease);
    this.recordCosts(stepMs, prefillRows, built.rows);
    this.pacer?.observe(stepShape(lanes), stepMs);
    const vocab = this.opts.vocab;
    for (const [i, seq] of laneSeqs.entries()) {
      const at = built.logitIndex[i]!;
      if (at < 0 || seq.cancelled) continue;
      const first = seq.generated === 0;
      const next = nextToken(seq.sampler, logits.subarray(at * vocab, (at + 1) * vocab));
      seq.sampler = next.state;
      seq.tokens.push(next.token);
      this.counters.generatedTokens++;
      emit(seq, { type: "token", token: next.token });
      if (first) {
        this.calibrator.record({
          kind: "first-token",
          deviceMs: stepMs,
          queueMs: seq.admittedAt - seq.submittedAt,
        });
      }
      if (next.finish) this.finish(seq, next.finish, now);
    }
    return true;
  }

  private releaseLease(lease: ReturnType<PageManager["acquireLease"]>): void {
    // Routes cancelled during the step are released with the lease.
    this.pages.releaseLease(lease);
  }

  private recordCosts(stepMs: number, prefillRows: number, rows: number): void {
    if (prefillRows === 0) {
      this.calibrator.record({ kind: "decode-step", deviceMs: stepMs, queueMs: 0 });
    } else {
      // The step's time is shared by its rows; prefill's share is its rows' fraction.
      this.calibrator.record({
        kind: "prefill",
        tokens: prefillRows,
        deviceMs: (stepMs * prefillRows) / rows,
        queueMs: 0,
      });
    }
  }

  // ---- scheduler inputs ----------------------------------------------------

  /**
   * `decodes`: the running requests in their decode phase (rows, keys).
   * While there are any, the pacer's tile caps the step's prefill rows, all
   * lanes together (the step's rows are at most decodes + tile), so several
   * prompts prefilling at once cannot stretch the step beyond the pace
   * either; `prefillAt` is the furthest prefill's next position (−1: none).
   */
  private budgets(decodes: { rows: number; keys: number }, prefillAt: number): Budgets {
    const o = this.opts;
    const c = this.calibrator.value;
    const decodeLanes = decodes.rows;
    // (Only prefill beside decodes is paced; prefillAt < 0: no prompt to prefill, no tile to size.)
    const paced = decodeLanes > 0 && prefillAt >= 0;
    const tile = this.pacer ? this.pacer.tile(paced ? decodes : null, prefillAt) : o.prefillTile;
    return {
      model: o.fingerprint,
      pageTokens: o.pageTokens,
      // (Never below the decodes plus the minimum prefill hold, or the hold would defer decodes.)
      maxBatchTokens:
        this.pacer && paced
          ? Math.min(o.maxBatchTokens, decodeLanes + Math.max(tile, o.minPrefillTokens))
          : o.maxBatchTokens,
      maxBatchSeqs: o.maxBatchSeqs,
      minPrefillTokens: o.minPrefillTokens,
      prefillTile: tile,
      repairTile: tile,
      // Cached prefixes give their pages back on demand, so they count as available.
      availablePages: (this.pages.availablePages + this.evictableCachePages()) as PageCount,
      repair: { optIn: false, minQuality: null },
      costs: {
        prefillPerTokenMs: c.prefillPerTokenMs.value,
        // No store is attached to the runtime loop itself: a checkpoint costs as much as a recompute.
        capturePerTokenMs: c.prefillPerTokenMs.value,
        restorePerTokenMs: c.prefillPerTokenMs.value,
      },
    };
  }

  private record(s: Sequence): RequestRecord {
    const hasRoute = this.pages.hasRoute(s.route);
    const route = hasRoute ? this.pages.route(s.route) : undefined;
    let admitPages = 0;
    // A waiting request without a route is planned as admission will leave
    // it: with the resident prefix it is about to adopt already processed.
    let processed = s.processed;
    if (s.state === "waiting") {
      if (route) {
        admitPages = Math.max(
          0,
          this.pages.reservationNeed(s.route, TokenCount(s.totalRows)) - route.reservedPages,
        );
      } else {
        const matched = this.pages.matchPrefix(s.chain.extend(s.tokens, s.tokens.length - 1));
        admitPages = Math.max(0, pagesFor(TokenCount(s.totalRows), this.opts.pageTokens) - matched);
        processed = matched * this.opts.pageTokens;
      }
    }
    let releasable = 0;
    if (route) for (const p of route.pages) if (this.refcount(p) === 1) releasable++;
    return {
      id: s.id,
      model: this.opts.fingerprint,
      tokens: s.tokens,
      processed: TokenCount(processed),
      pendingToken: s.tokens[s.tokens.length - 1]!,
      priority: s.priority,
      deadline: null,
      arrival: s.arrival,
      pageTable: route?.pages ?? [],
      source:
        s.cachedTokens > 0 ? { kind: "resident", tokens: TokenCount(s.cachedTokens) } : { kind: "recompute" },
      repairTokens: TokenCount(0),
      state: s.state,
      nextPageHash:
        processed < s.tokens.length - 1
          ? s.chain.at(s.tokens, s.tokens.length - 1, Math.floor(processed / this.opts.pageTokens))
          : null,
      runnable: !this.restoring.has(s.id),
      admitPages: admitPages as PageCount,
      reservedPages: (route?.reservedPages ?? 0) as PageCount,
      releasablePages: releasable as PageCount,
      preempted: s.preempted,
    };
  }

  private refcount(page: number): number {
    const st = this.pages.pageState(page as never);
    return st.kind === "resident" ? st.refcount : 0;
  }

  // ---- admission, preemption, retirement -----------------------------------

  private admit(a: Admission, now: number): boolean {
    const seq = this.seqs.get(a.id);
    if (seq?.state !== "waiting" || seq.cancelled) return false;
    const tryOnce = (): void => {
      if (this.pages.hasRoute(seq.route)) {
        this.pages.reserve(seq.route, TokenCount(seq.totalRows));
        return;
      }
      const hashes = seq.chain.extend(seq.tokens, seq.tokens.length - 1);
      const matched = this.pages.matchPrefix(hashes);
      this.pages.openRoute(seq.route, {
        prefix: hashes.slice(0, matched),
        reserveTokens: TokenCount(seq.totalRows),
        now,
      });
      seq.processed = matched * this.opts.pageTokens;
      if (matched > 0) this.noteHit(hashes[matched - 1]!, now);
    };
    try {
      tryOnce();
    } catch (err) {
      if (!(err instanceof PageError) || err.code !== "over-capacity") throw err;
      if (!this.evict(a.pages, now)) return false;
      try {
        tryOnce();
      } catch (err2) {
        if (err2 instanceof PageError && err2.code === "over-capacity") return false;
        throw err2;
      }
    }
    if (seq.cachedTokens < 0) {
      seq.cachedTokens = seq.processed;
      seq.admittedAt = performance.now();
      this.counters.cachedPromptTokens += seq.processed;
      this.beginRestore(seq);
    }
    seq.state = "running";
    seq.preempted = null;
    this.opts.logger.log("debug", "request.admitted", { requestId: seq.id, reusedTokens: seq.processed });
    return true;
  }

  private preempt(p: Preemption, now: number): void {
    const seq = this.seqs.get(p.id);
    if (seq?.state !== "running" || this.restoring.has(seq.id)) return;
    this.counters.preemptions++;
    if (p.disposition === "keep-resident") {
      this.pages.reserve(seq.route, TokenCount(seq.processed));
    } else {
      // "checkpoint" needs a chunk store, which the loop itself does not hold:
      // its pages become a recomputable cache route, which a resumption
      // re-adopts if they are still resident, exactly like a drop.
      this.retire(seq, now);
      seq.processed = 0;
    }
    seq.state = "waiting";
    seq.preempted = p.disposition;
    this.opts.logger.log("info", "request.preempted", {
      requestId: seq.id,
      disposition: p.disposition,
      reason: p.reason,
    });
  }

  private finish(seq: Sequence, reason: "stop" | "length", now: number): void {
    this.retire(seq, now);
    this.seqs.delete(seq.id);
    emit(seq, { type: "end", reason, cachedTokens: Math.max(0, seq.cachedTokens) });
    seq.events.close();
  }

  /** Keeps the route's full pages as a cache route, then releases the route. */
  private retire(seq: Sequence, now: number): void {
    if (!this.pages.hasRoute(seq.route)) return;
    const hashes = seq.chain.extend(seq.tokens, seq.processed);
    const shareable = hashes.slice(0, this.pages.matchPrefix(hashes));
    if (shareable.length > 0) {
      const id = ContinuationId(`cache:${shareable[shareable.length - 1]}`);
      if (this.pages.hasRoute(id)) {
        this.pages.touch(id, now);
      } else {
        this.pages.openRoute(id, { prefix: shareable, now });
        this.cache.set(id, { pages: shareable.length, hits: 0 });
      }
      this.opts.checkpoint?.offer({
        route: id,
        tokens: seq.tokens.slice(0, shareable.length * this.opts.pageTokens),
        salt: seq.salt,
        hits: this.cache.get(id)?.hits ?? 0,
        pages: this.pages,
        calibration: this.calibrator.value,
      });
    }
    this.pages.releaseRoute(seq.route);
  }

  /**
   * At first admission, after resident pages were adopted: lets the durable
   * cache restore more of the prompt's prefix into the route. While its load is
   * in flight the request is admitted but not runnable; when it settles the
   * request continues from the restored rows, or (the restore gave up, the
   * load abandoned) from its resident rows, recomputing the rest.
   */
  private beginRestore(seq: Sequence): void {
    const restore = this.opts.restore;
    if (!restore) return;
    const ticket = restore.begin({
      route: seq.route,
      tokens: seq.tokens.slice(0, seq.tokens.length - 1),
      salt: seq.salt,
      residentTokens: seq.processed,
      pages: this.pages,
      availablePages: this.pages.route(seq.route).reservedPages,
      calibration: this.calibrator.value,
      record: (sample) => this.calibrator.record(sample),
    });
    if (!ticket) return;
    this.restoring.add(seq.id);
    const began = performance.now();
    void ticket.done.then((ok) => {
      this.restoring.delete(seq.id);
      this.restoreMs.set(seq, performance.now() - began);
      if (ok && this.seqs.get(seq.id) === seq && !seq.cancelled) {
        this.counters.cachedPromptTokens += ticket.restoreTo - seq.processed;
        seq.processed = ticket.restoreTo;
        seq.cachedTokens = ticket.restoreTo;
      }
      this.signal();
    });
  }

  /**
   * In-flight prefix sharing, the runtime's half (the scheduler decides who
   * waits): a running prompt standing at a page boundary adopts the pages
   * that another request sealed since, continuing its own hash chain, so it
   * computes only what nobody has. Cheap when nothing is new: one index
   * lookup per prefilling request.
   */
  private adoptInFlightPrefixes(): void {
    const P = this.opts.pageTokens;
    for (const seq of this.seqs.values()) {
      if (seq.state !== "running" || seq.cancelled || this.restoring.has(seq.id)) continue;
      const rows = seq.tokens.length - 1;
      if (seq.processed >= rows || seq.processed % P !== 0) continue;
      const page = seq.processed / P;
      const next = seq.chain.at(seq.tokens, rows, page);
      if (next === null || !this.pages.hasSealed(next, (page + 1) * P)) continue;
      const adopted = this.pages.adoptPrefix(seq.route, seq.chain.extend(seq.tokens, rows));
      seq.processed += adopted * P;
      seq.cachedTokens += adopted * P;
      this.counters.cachedPromptTokens += adopted * P;
      this.counters.sharedInFlightTokens += adopted * P;
    }
  }

  private noteHit(lastHash: PrefixHash, now: number): void {
    const id = ContinuationId(`cache:${lastHash}`);
    const c = this.cache.get(id);
    if (!c) return;
    c.hits++;
    this.pages.touch(id, now);
  }

  private fenceCancelled(): void {
    for (const seq of [...this.seqs.values()]) {
      if (!seq.cancelled) continue;
      if (this.pages.hasRoute(seq.route)) this.pages.cancelRoute(seq.route);
      this.seqs.delete(seq.id);
      emit(seq, { type: "end", reason: "cancelled", cachedTokens: Math.max(0, seq.cachedTokens) });
      seq.events.close();
    }
  }

  private fail(seq: Sequence, message: string): void {
    if (this.pages.hasRoute(seq.route)) this.pages.cancelRoute(seq.route);
    this.seqs.delete(seq.id);
    if (!seq.events.isClosed) {
      emit(seq, { type: "error", message });
      seq.events.close();
    }
    this.opts.logger.log("warn", "request.failed", { requestId: seq.id, message });
  }

  // ---- the prefix cache ----------------------------------------------------

  /** Pages that evicting every cache route would free (those no live route shares). */
  private evictableCachePages(): number {
    if (this.cache.size === 0) return 0;
    const refs = new Map<number, number>();
    for (const id of this.cache.keys()) {
      for (const p of this.pages.route(id).pages) refs.set(p, (refs.get(p) ?? 0) + 1);
    }
    let n = 0;
    for (const [p, r] of refs) if (this.refcount(p) === r) n++;
    return n;
  }

  /** Evicts cache routes, lowest value first, until `pagesNeeded` pages are available. */
  private evict(pagesNeeded: number, now: number): boolean {
    if (this.cache.size === 0) return false;
    const prefillMs = this.calibrator.value.prefillPerTokenMs.value;
    const policies = new Map<ContinuationId, RoutePolicy>();
    for (const [id, c] of this.cache) {
      policies.set(id, {
        reuseProbability: c.hits / (c.hits + 1),
        recomputeMs: c.pages * this.opts.pageTokens * prefillMs,
        reloadMs: 0,
        sharingBonus: 0,
        sloBonus: 0,
      });
    }
    const inputs: ResidencyInputs = {
      policies,
      protected: new Set([...this.seqs.values()].map((s) => s.route)),
      recomputable: new Set(this.cache.keys()),
    };
    const plan = planEviction(this.pages.snapshot(), pagesNeeded, inputs);
    if (!plan.admissible) return false;
    const report = applyEviction(this.pages, plan, inputs);
    for (const id of report.evicted) this.cache.delete(id);
    this.counters.evictedRoutes += report.evicted.length;
    this.opts.logger.log("debug", "cache.evicted", {
      routes: report.evicted.length,
      freed: report.freedPages,
      at: now,
    });
    return report.availableAfter >= pagesNeeded;
  }
}
