import { randomInt } from "node:crypto";
import { Effect, Fiber } from "effect";
import type { Engine, StepBatch } from "../../native/engine.ts";
import { StreamQueue } from "../../schema/channel.ts";
import { type PageCount, pagesFor, type RequestId, TokenCount } from "../../schema/ids.ts";
import { CostCalibrator, type Sample } from "../calibration/calibration.ts";
import { layerGroups, releaseWindow } from "../model/layout.ts";
import { NO_RULES, TokenHistory, tokenLogprob } from "../model/logits.ts";
import { initialSamplerState, nextToken, samplingParams } from "../model/sampling.ts";
import { buildGroupedBatch, GroupedRoutes } from "../pages/layer-groups.ts";
import { type AppendPlan, PageManager } from "../pages/page-manager.ts";
import { type Admission, type Preemption, planIteration } from "../scheduler/plan-iteration.ts";
import { type Budgets, phaseOf } from "../scheduler/request.ts";
import { buildBatch, type Lane, stepShape } from "./batch.ts";
import { PrefillPacer, type StepShape } from "./prefill-pacer.ts";
import {
  type RuntimeGeneration,
  type RuntimeOptions,
  type RuntimeStats,
  SubmitError,
  type SubmitRequest,
} from "./runtime-api.ts";
import { type RuntimeEvent, Sequence } from "./sequence.ts";
import { SequencePages } from "./sequence-pages.ts";

/** `plain`'s rows and logits (its lanes' prompt logits included) over the grouped batch's tables. */
function withTables(plain: StepBatch, grouped: StepBatch): StepBatch {
  return { ...plain, slotMapping: grouped.slotMapping, pageTable: grouped.pageTable };
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

/**
 * The device loop of one worker: continuous batching over a fixed page pool.
 *
 * Each iteration: fence cancellations; ask the pure scheduler for a plan;
 * preempt and admit as it says; reserve slots for every scheduled row (the
 * pool evicts cached prefixes when it needs their pages); build one ragged batch;
 * run one native step off the JS thread; commit the rows (sealing full pages
 * with their prefix hash so later requests can share them); sample the decode
 * lanes and stream their tokens. Requests join and leave between steps.
 *
 * Prefix reuse: a request's prompt pages are hashed as a chain; admission
 * adopts the longest run of resident pages with those hashes, so it computes
 * only the rest. When a request ends (or is cancelled or preempted), its
 * full pages stay in the pool as cached pages, findable by their hashes and
 * evicted lowest residency value first, for the next request that shares its
 * prefix.
 */
export class WorkerRuntime {
  readonly pages: PageManager;
  /** Each sequence's route per layer group (one group: its plain route). */
  readonly routes: GroupedRoutes;
  private readonly seqs = new Map<RequestId, Sequence>();
  private readonly calibrator: CostCalibrator;
  /** The sequences' pages: admission, restore, in-flight adoption, preemption, release into the cache. */
  private readonly held: SequencePages;
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
  };

  constructor(
    private readonly engine: Engine,
    private readonly opts: RuntimeOptions,
  ) {
    this.pages = new PageManager({
      pageTokens: opts.pageTokens,
      physicalPages: opts.physicalPages,
      window: releaseWindow(opts.layers),
    });
    // The engine's pool was made with the same groups (loadEngine).
    this.routes = new GroupedRoutes(this.pages, layerGroups(opts.layers));
    this.calibrator = new CostCalibrator(opts.costs);
    this.held = new SequencePages(this.routes, this.calibrator, {
      fingerprint: opts.fingerprint,
      pageTokens: opts.pageTokens,
      pageBytes: engine.pageBytes,
      logger: opts.logger,
      ...(opts.restore && { restore: opts.restore }),
      ...(opts.checkpoint && { checkpoint: opts.checkpoint }),
      live: (seq) => this.seqs.get(seq.id) === seq && !seq.cancelled,
      signal: () => this.signal(),
    });
    this.pacer =
      opts.decodePace === undefined
        ? null
        : new PrefillPacer(
            opts.decodePace,
            Math.min(opts.minPrefillTokens, opts.prefillTile) || 1,
            opts.prefillTile,
          );
  }

  /** Starts the device loop as a detached fiber (stop() interrupts it). */
  start(): void {
    if (this.loopFiber) throw new Error("runtime already started");
    this.loopFiber = Effect.runFork(this.loop());
  }

  /**
   * Stops the loop after the step in flight (an iteration is uninterruptible,
   * the wait for work is not); every open request ends with an error and new
   * ones are refused. The engine is the caller's: free it after this.
   */
  async stop(): Promise<void> {
    this.stopping = true;
    this.signal();
    if (this.loopFiber) await Effect.runPromise(Fiber.interrupt(this.loopFiber));
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
    // Every layer group's route reserves its whole growth; one spare page for a copy-on-write tail.
    const need = this.routes.windows.length * pagesFor(TokenCount(total), o.pageTokens) + 1;
    if (need > o.physicalPages)
      throw new SubmitError(400, `the request needs ${need} pages; the pool has ${o.physicalPages}`);
    if (this.seqs.size >= o.maxQueued)
      throw new SubmitError(429, `the worker has ${o.maxQueued} requests queued`);
    let params: ReturnType<typeof samplingParams>;
    try {
      params = samplingParams({
        temperature: req.temperature,
        topK: req.topK,
        topP: req.topP,
        minP: req.minP ?? 0,
        seed: req.seed ?? randomInt(2 ** 47),
        rules: req.rules ?? NO_RULES,
        logprobs: req.logprobs ?? null,
        constraint: req.constraint ?? null,
        stopTokens: req.stopTokenIds,
        maxTokens: req.maxTokens,
      });
    } catch (err) {
      throw new SubmitError(400, (err as Error).message);
    }
    if (req.constraint && req.constraint.dfa.minDist(req.constraint.start) > req.maxTokens)
      throw new SubmitError(
        400,
        `max_tokens (${req.maxTokens}) is below the ${req.constraint.dfa.minDist(req.constraint.start)} tokens the constraint's shortest output may need`,
      );
    const promptLogprobs = req.promptLogprobs ?? null;
    if (promptLogprobs !== null && (!Number.isSafeInteger(promptLogprobs) || promptLogprobs < 0))
      throw new SubmitError(400, `prompt_logprobs must be a non-negative integer, got ${promptLogprobs}`);
    const events = new StreamQueue<RuntimeEvent>(req.maxTokens + 1);
    const seq = new Sequence(
      req.requestId,
      [...req.prompt],
      req.prompt.length,
      initialSamplerState(params),
      new TokenHistory(req.prompt, params.rules.repetitionPenalty !== 1),
      req.priority ?? 0,
      this.arrivals++,
      events,
      o.pageTokens,
      req.salt,
      performance.now(),
      promptLogprobs,
    );
    seq.ephemeral = req.ephemeral ?? false;
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
        fetchMs: seq.fetchMs,
      }),
    };
  }

  /** Prompt tokens through the forward (resident, restored or computed) of a request here; undefined when it is not. */
  prefilled(id: RequestId): number | undefined {
    const seq = this.seqs.get(id);
    return seq === undefined ? undefined : Math.min(seq.processed, seq.promptLength);
  }

  /** A cost measured outside the loop (warm start's tier probe) folded into the calibration. */
  calibrate(sample: Sample): void {
    this.calibrator.record(sample);
  }

  stats(): RuntimeStats {
    let waiting = 0;
    for (const s of this.seqs.values()) if (s.state === "waiting") waiting++;
    return {
      pagesTotal: this.opts.physicalPages,
      pagesAvailable: this.pages.availablePages,
      pagesFree: this.pages.freePages,
      pagesEvictable: this.pages.evictablePages,
      waiting,
      running: this.seqs.size - waiting,
      ...this.counters,
      ...this.held.counters,
      evictedPages: this.pages.evictions,
      windowReleasedPages: this.pages.windowReleases,
      calibration: this.calibrator.value,
      batching: { stepTokens: this.opts.maxBatchTokens, prefillTile: this.opts.prefillTile },
    };
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
    this.held.adoptInFlight(this.seqs.values());
    this.fenceCancelled();
    if (this.seqs.size === 0) return false;
    const records = [...this.seqs.values()].map((s) => this.held.record(s));
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
    for (const p of plan.preempt) this.preempt(p);
    let admitted = 0;
    for (const a of plan.admit) if (this.admit(a)) admitted++;

    // A lane whose rows moved since planning (its admission adopted a
    // different resident prefix than the plan assumed), or whose admission
    // began a restore, waits for the next plan.
    const scheduled = plan.scheduled.filter((w) => {
      const s = this.seqs.get(w.id);
      return (
        s?.state === "running" && !s.cancelled && w.firstRow === s.processed && !this.held.isRestoring(w.id)
      );
    });
    if (scheduled.length === 0) return admitted > 0;

    const lanes: Lane[] = [];
    const plans: AppendPlan[][] = [];
    const laneSeqs: Sequence[] = [];
    const copies: Promise<void>[] = [];
    for (const w of scheduled) {
      const seq = this.seqs.get(w.id)!;
      const append = this.routes.beginAppend(seq.route, w.tokens);
      for (const a of append) for (const c of a.copies) copies.push(this.engine.copyPage(c.src, c.dst));
      lanes.push({
        tokens: seq.tokens.slice(seq.processed, seq.processed + w.tokens),
        firstPosition: seq.processed,
        slots: append[0]!.slots,
        pageTable: append[0]!.pageTable,
        wantLogits: w.phase === "decode",
        promptLogits: w.phase !== "decode" && seq.promptLogprobs !== null,
      });
      plans.push([...append]);
      laneSeqs.push(seq);
    }
    const built = buildBatch(lanes);
    const G = this.routes.windows.length;
    // Several groups: the engine reads every group's table and slots ([G, S, ptStride], [G, T]).
    const batch =
      G === 1
        ? built.batch
        : withTables(
            built.batch,
            buildGroupedBatch(
              lanes.map((l, i) => ({ ...l, plans: plans[i]! })),
              G,
            ),
          );
    const lease = this.pages.acquireLease(laneSeqs.flatMap((s) => this.routes.routes(s.route)));
    let logits: Float32Array;
    const t0 = performance.now();
    try {
      await Promise.all(copies);
      logits = await this.engine.step(batch);
    } catch (err) {
      for (const s of laneSeqs) this.routes.abortAppend(s.route);
      this.releaseLease(lease);
      for (const s of laneSeqs) this.fail(s, `step failed: ${(err as Error).message}`);
      return true;
    }
    const stepMs = performance.now() - t0;
    this.counters.steps++;
    for (const [i, seq] of laneSeqs.entries()) {
      const rows = lanes[i]!.tokens.length;
      const before = Math.floor(seq.processed / this.opts.pageTokens);
      seq.processed += rows;
      const sealed = seq.chain.extend(seq.tokens, seq.processed).slice(before);
      this.routes.commitAppend(seq.route, sealed, { cache: this.held.residencyCosts() });
      if (!lanes[i]!.wantLogits) this.counters.computedPromptTokens += rows;
    }
    this.releaseLease(lease);
    const shape = stepShape(lanes);
    this.recordCosts(stepMs, shape);
    this.pacer?.observe(shape, stepMs);
    const vocab = this.opts.vocab;
    for (const [i, seq] of laneSeqs.entries()) {
      const lane = lanes[i]!;
      if (lane.promptLogits && !seq.cancelled) this.scorePrompt(seq, lane, logits, built.logitIndex[i]!);
    }
    for (const [i, seq] of laneSeqs.entries()) {
      const at = built.logitIndex[i]!;
      if (at < 0 || seq.cancelled || lanes[i]!.promptLogits) continue;
      const first = seq.generated === 0;
      const next = nextToken(seq.sampler, logits.subarray(at * vocab, (at + 1) * vocab), seq.history);
      seq.sampler = next.state;
      seq.history.add(next.token);
      seq.tokens.push(next.token);
      this.counters.generatedTokens++;
      emit(seq, {
        type: "token",
        token: next.token,
        logprob: next.logprob,
        ...(first && seq.promptLogprobs !== null ? { promptLogprobs: seq.promptEntries } : {}),
      });
      if (first) {
        this.calibrator.record({
          kind: "first-token",
          deviceMs: stepMs,
          queueMs: seq.admittedAt - seq.submittedAt,
        });
      }
      if (next.finish) this.finish(seq, next.finish);
    }
    return true;
  }

  /**
   * A prefill lane's rows of a request that scores its prompt: row k at
   * position p predicts the token at p + 1. Each prompt position is scored
   * once, even when a preemption recomputes it; the first generated token
   * carries them all.
   */
  private scorePrompt(seq: Sequence, lane: Lane, logits: Float32Array, at: number): void {
    const vocab = this.opts.vocab;
    const topN = seq.promptLogprobs ?? 0;
    for (let k = 0; k < lane.tokens.length; k++) {
      const q = lane.firstPosition + k + 1;
      if (q !== seq.promptEntries.length + 1 || q >= seq.promptLength) continue;
      const row = logits.subarray((at + k) * vocab, (at + k + 1) * vocab);
      seq.promptEntries.push(tokenLogprob(row, seq.tokens[q]!, topN));
    }
  }

  private releaseLease(lease: ReturnType<PageManager["acquireLease"]>): void {
    // Routes cancelled during the step are released with the lease.
    this.pages.releaseLease(lease);
  }

  private recordCosts(stepMs: number, shape: StepShape): void {
    if (shape.prefillRows === 0) {
      this.calibrator.record({ kind: "decode-step", deviceMs: stepMs, queueMs: 0 });
    } else {
      this.calibrator.record({
        kind: "prefill-step",
        rows: shape.decodeRows + shape.prefillRows,
        keys: shape.decodeKeys + shape.prefillKeys,
        prefillRows: shape.prefillRows,
        prefillKeys: shape.prefillKeys,
        deviceMs: stepMs,
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
      // Cached pages are evicted on demand, so the pool counts them as available.
      availablePages: this.pages.availablePages as PageCount,
    };
  }

  // ---- admission, preemption, retirement -----------------------------------

  private admit(a: Admission): boolean {
    const seq = this.seqs.get(a.id);
    if (seq?.state !== "waiting" || seq.cancelled) return false;
    return this.held.admit(seq);
  }

  private preempt(p: Preemption): void {
    const seq = this.seqs.get(p.id);
    if (!seq || !this.held.preempt(seq, p.disposition)) return;
    this.opts.logger.log("info", "request.preempted", {
      requestId: seq.id,
      disposition: p.disposition,
      reason: p.reason,
    });
  }

  private finish(seq: Sequence, reason: "stop" | "length"): void {
    this.held.retire(seq);
    this.seqs.delete(seq.id);
    emit(seq, { type: "end", reason, cachedTokens: Math.max(0, seq.cachedTokens) });
    seq.events.close();
  }

  private fenceCancelled(): void {
    for (const seq of [...this.seqs.values()]) {
      if (!seq.cancelled) continue;
      this.held.cancel(seq, true);
      this.seqs.delete(seq.id);
      emit(seq, { type: "end", reason: "cancelled", cachedTokens: Math.max(0, seq.cachedTokens) });
      seq.events.close();
    }
  }

  private fail(seq: Sequence, message: string): void {
    this.held.cancel(seq, false);
    this.seqs.delete(seq.id);
    if (!seq.events.isClosed) {
      emit(seq, { type: "error", message });
      seq.events.close();
    }
    this.opts.logger.log("warn", "request.failed", { requestId: seq.id, message });
  }
}
