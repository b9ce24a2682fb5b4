import { createHash, type Hash } from "node:crypto";
import type { CandidateRecord, CandidateSource, DecisionRecord } from "../../schema/control.ts";
import type { RequestId, WorkerId } from "../../schema/ids.ts";
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
import {
  disconnect,
  emptyView,
  expire,
  type HeartbeatView,
  observe,
  prefillRemaining,
} from "../heartbeat-view.ts";
import { defaultRouterPolicy, type RouterPolicy, route } from "../router.ts";
import { Agenda } from "./heap.ts";
import { Prng } from "./prng.ts";
import { SimCatalog, type SimOffer, type WorkerMessage, type WorkerTimer } from "./worker.ts";
import { makeWorkload, type SimRequest, type WorkloadShape } from "./workload.ts";
import { makeWorkers, type SimWorld } from "./world.ts";

/**
 * The deterministic failure simulator: the real router, assignment machine
 * and worker admission machine under logical time, with a seeded network
 * (delay, loss, duplication, partitions) and worker crashes and restarts.
 * One seed gives one event trace; its sha256 is the run's fingerprint.
 *
 * Invariants, checked after every step (an InvariantViolation names the seed
 * and step):
 * 1. no request delivers tokens from two attempts, and delivered tokens are
 *    contiguous;
 * 2. every request ends (completed, or failed with a reason) within
 *    `requestDeadlineMs` + one controller tick of its arrival;
 * 3. attempts offered for a request strictly increase;
 * 4. every worker's page accounting holds (Σ reservations, cache pages, pins;
 *    nothing over-committed); after quiescence no reservation, job or pin is
 *    left on any worker.
 */

export const Faults = ["delay", "loss", "dup", "partition", "crash", "restart"] as const;
export type Fault = (typeof Faults)[number];

export const RoutingPolicies = ["ttft", "round-robin", "prefix"] as const;
export type RoutingPolicy = (typeof RoutingPolicies)[number];

export interface SimOptions {
  readonly seed: number;
  readonly workers: number;
  readonly requests: number;
  readonly faults: ReadonlySet<Fault>;
  /** ttft: this router; round-robin and prefix (most cached tokens, ignoring load) are baselines. */
  readonly policy: RoutingPolicy;
  readonly workload: WorkloadShape;
  readonly limits: AssignmentLimits;
  readonly heartbeatMs: number;
  readonly tickMs: number;
  readonly router: RouterPolicy;
  /** Pages per worker. */
  readonly totalPages: number;
  /** Host RAM tier per worker (the configuration's store.ram.maxBytes); overflow goes to SSD. */
  readonly ramBytes: number;
  /** Whether workers have a local SSD tier below RAM. */
  readonly ssdTier: boolean;
  /**
   * A recorded world instead of the generated one (continuum replay): its
   * workload and its workers (then `workers`, `requests`, `workload`,
   * `totalPages`, `ramBytes` and `ssdTier` are not read).
   */
  readonly world?: SimWorld;
}

/** Defaults sized so the workload keeps a fleet busy but not saturated. */
export function defaultSimOptions(seed: number, workers: number, requests: number): SimOptions {
  return {
    seed,
    workers,
    requests,
    faults: new Set(),
    policy: "ttft",
    workload: {
      tenants: Math.max(4, workers * 6),
      chunkTokens: 256,
      sharedChunks: [4, 24],
      suffixTokens: [16, 512],
      maxTokens: [8, 48],
      meanGapMs: 600 / workers,
    },
    limits: { maxAttempts: 4, offerTimeoutMs: 250, progressTimeoutMs: 5_000, requestDeadlineMs: 30_000 },
    heartbeatMs: 100,
    tickMs: 50,
    router: { ...defaultRouterPolicy, heartbeatTtlMs: 350, residentFreshMs: 250 },
    totalPages: 2048,
    ramBytes: 1 << 30,
    ssdTier: true,
  };
}

export type { SimWorld, SimWorldWorker } from "./world.ts";

export class InvariantViolation extends Error {
  override readonly name = "InvariantViolation";
  constructor(
    readonly seed: number,
    readonly step: number,
    what: string,
  ) {
    super(`invariant violated (seed ${seed}, step ${step}): ${what}`);
  }
}

export interface SimSummary {
  readonly seed: number;
  readonly policy: RoutingPolicy;
  readonly faults: readonly Fault[];
  readonly traceHash: string;
  readonly steps: number;
  readonly endMs: number;
  readonly requests: number;
  readonly completed: number;
  readonly failed: Readonly<Record<string, number>>;
  /** Mean client-observed time to first token (arrival → first delivered token) over requests that got one. */
  readonly meanTtftMs: number;
  readonly p99TtftMs: number;
  /** Completed requests per worker (the worker whose attempt streamed). */
  readonly load: Readonly<Record<string, number>>;
  readonly maxOverMeanLoad: number;
  /** Completed requests by the source the router predicted for them (resident, ram, peer, s3, recompute). */
  readonly sources: Readonly<Partial<Record<CandidateSource, number>>>;
  readonly lateIgnored: number;
  readonly duplicates: number;
  readonly attempts: number;
  readonly messages: { readonly sent: number; readonly lost: number; readonly duplicated: number };
  readonly crashes: number;
  readonly restarts: number;
  readonly partitions: number;
}

type ToWorker =
  | { readonly kind: "offer"; readonly msg: SimOffer }
  | { readonly kind: "cancel"; readonly msg: { requestId: RequestId; attempt: number; reason: string } };

type SimEvent =
  | { readonly k: "arrive"; readonly req: SimRequest }
  | { readonly k: "to-controller"; readonly from: number; readonly m: WorkerMessage }
  | { readonly k: "to-worker"; readonly to: number; readonly m: ToWorker }
  | { readonly k: "heartbeat"; readonly w: number }
  | { readonly k: "tick" }
  | { readonly k: "timer"; readonly w: number; readonly t: WorkerTimer }
  | { readonly k: "crash"; readonly w: number }
  | { readonly k: "restart"; readonly w: number }
  | { readonly k: "closed"; readonly w: number }
  | { readonly k: "partition"; readonly w: number; readonly on: boolean };

/** Bound on agenda events (a runaway schedule is a bug, not a long run). */
const MAX_AGENDA = 1 << 20;
const MAX_STEPS = 50_000_000;

class Network {
  sent = 0;
  lost = 0;
  duplicated = 0;
  /** Per link, the latest delivery time scheduled: a link (one WebSocket) delivers in order. */
  private readonly lastUp: number[];
  private readonly lastDown: number[];
  readonly partitioned: boolean[];

  constructor(
    private readonly rng: Prng,
    private readonly faults: ReadonlySet<Fault>,
    workers: number,
  ) {
    this.lastUp = new Array(workers).fill(0);
    this.lastDown = new Array(workers).fill(0);
    this.partitioned = new Array(workers).fill(false);
  }

  /** Delivery times for one message on worker w's link (empty: lost; two: duplicated). */
  deliveries(nowMs: number, w: number, up: boolean): number[] {
    this.sent++;
    if (this.partitioned[w] || (this.faults.has("loss") && this.rng.chance(0.005))) {
      this.lost++;
      return [];
    }
    const last = up ? this.lastUp : this.lastDown;
    let delay = 1 + this.rng.float() * 4;
    if (this.faults.has("delay") && this.rng.chance(0.05)) delay += this.rng.exponential(80);
    const at = Math.max(nowMs + delay, last[w]!);
    last[w] = at;
    const out = [at];
    if (this.faults.has("dup") && this.rng.chance(0.02)) {
      this.duplicated++;
      out.push(at + this.rng.float() * 50);
    }
    return out;
  }
}

interface RequestRecord {
  readonly req: SimRequest;
  state: AssignmentState;
  lastOfferedAttempt: number;
  /** Attempt whose tokens reached the client, and how many. */
  deliveredAttempt: number | null;
  deliveredTokens: number;
  deliveredBy: WorkerId | null;
  /** Source the router predicted for the latest offer. */
  source: CandidateSource | null;
}

/** Runs one simulation to quiescence; throws InvariantViolation on the first broken invariant. */
export function simulate(opts: SimOptions): SimSummary {
  if (!Number.isSafeInteger(opts.workers) || opts.workers < 1 || opts.workers > 1024) {
    throw new RangeError(`workers must be 1..1024, got ${opts.workers}`);
  }
  if (!Number.isSafeInteger(opts.requests) || opts.requests < 0 || opts.requests > 1_000_000) {
    throw new RangeError(`requests must be 0..1000000, got ${opts.requests}`);
  }
  const root = new Prng(opts.seed);
  const workloadRng = root.fork();
  const netRng = root.fork();
  const faultRng = root.fork();
  const costRng = root.fork();
  const workload = opts.world?.workload ?? makeWorkload(workloadRng, opts.seed, opts.requests, opts.workload);
  const catalog = new SimCatalog();
  const workers = makeWorkers(opts, workload, costRng);
  const indexOf = new Map<WorkerId, number>(workers.map((w, i) => [w.id, i]));
  const net = new Network(netRng, opts.faults, workers.length);
  const agenda = new Agenda<SimEvent>(MAX_AGENDA);
  const trace: Hash = createHash("sha256");
  const records = new Map<RequestId, RequestRecord>();
  const active = new Set<RequestRecord>();
  let view: HeartbeatView = emptyView;
  let now = 0;
  let step = 0;
  let arrived = 0;
  let rr = 0;
  let lateIgnored = 0;
  let duplicates = 0;
  let attempts = 0;
  let crashes = 0;
  let restarts = 0;
  let partitions = 0;
  let completed = 0;
  const sources: Partial<Record<CandidateSource, number>> = {};
  const failed: Record<string, number> = {};
  const ttfts: number[] = [];
  const load: Record<string, number> = {};
  for (const w of workers) load[w.id] = 0;

  const violation = (what: string): never => {
    throw new InvariantViolation(opts.seed, step, what);
  };
  const log = (line: string): void => {
    trace.update(`${now.toFixed(3)} ${line}\n`);
  };

  const io = (w: number) => ({
    catalog,
    send: (m: WorkerMessage) => {
      for (const at of net.deliveries(now, w, true)) agenda.push(at, { k: "to-controller", from: w, m });
    },
    schedule: (at: number, t: WorkerTimer) => agenda.push(at, { k: "timer", w, t }),
  });
  const ios = workers.map((_, i) => io(i));

  const sendToWorker = (w: number, m: ToWorker): void => {
    for (const at of net.deliveries(now, w, false)) agenda.push(at, { k: "to-worker", to: w, m });
  };

  /** Picks a candidate under the configured policy; the ttft policy takes the router's first. */
  const choose = (decision: DecisionRecord): CandidateRecord | null => {
    const ranked = decision.ranked;
    if (ranked.length === 0) return null;
    if (opts.policy === "ttft") return ranked[0]!;
    if (opts.policy === "prefix") {
      let best = ranked[0]!;
      for (const c of ranked) {
        if (
          c.cachedTokens > best.cachedTokens ||
          (c.cachedTokens === best.cachedTokens && c.workerId < best.workerId)
        ) {
          best = c;
        }
      }
      return best;
    }
    const ids = [...new Set(ranked.map((c) => c.workerId))].sort();
    const pick = ids[rr++ % ids.length]!;
    return ranked.find((c) => c.workerId === pick)!;
  };

  const apply = (rec: RequestRecord, event: AssignmentEvent): void => {
    const pending: AssignmentEvent[] = [event];
    while (pending.length > 0) {
      const r = stepAssignment(rec.state, pending.shift()!, now, opts.limits);
      lateIgnored += r.state.lateIgnored - rec.state.lateIgnored;
      duplicates += r.state.duplicates - rec.state.duplicates;
      rec.state = r.state;
      for (const c of r.commands) {
        const routed = run(rec, c);
        if (routed) pending.push(routed);
      }
    }
    if (isTerminal(rec.state)) active.delete(rec);
  };

  /** Carries out one command; a route command yields the `routed` event to apply next. */
  const run = (rec: RequestRecord, c: AssignmentCommand): AssignmentEvent | null => {
    const id = rec.req.requestId;
    switch (c.type) {
      case "route": {
        const decision = route({
          request: { ...rec.req, modelFingerprint: workload.fingerprint },
          attempt: c.attempt,
          view,
          nowMs: now,
          catalog: catalog.answer(rec.req.chain),
          outstanding: outstandingByWorker(
            [...active].map((r) => r.state),
            prefillRemaining(view),
          ),
          exclude: new Set(c.exclude),
          // Baselines route without the bounded-load term (they are what it is compared to).
          policy:
            opts.policy === "ttft" ? opts.router : { ...opts.router, loadFactor: Number.POSITIVE_INFINITY },
        });
        const choice = choose(decision);
        log(`route ${id} #${c.attempt} -> ${choice ? `${choice.workerId}/${choice.source}` : "none"}`);
        return { type: "routed", choice };
      }
      case "offer": {
        if (c.attempt <= rec.lastOfferedAttempt) {
          violation(`${id}: attempt ${c.attempt} offered after attempt ${rec.lastOfferedAttempt}`);
        }
        rec.lastOfferedAttempt = c.attempt;
        rec.source = c.choice.source;
        attempts++;
        log(`offer ${id} #${c.attempt} ${c.workerId}`);
        sendToWorker(indexOf.get(c.workerId)!, {
          kind: "offer",
          msg: {
            requestId: id,
            attempt: c.attempt,
            modelFingerprint: workload.fingerprint,
            promptTokens: rec.req.promptTokens,
            maxTokens: rec.req.maxTokens,
            chain: rec.req.chain,
          },
        });
        return null;
      }
      case "cancel":
        log(`cancel ${id} #${c.attempt} ${c.workerId}`);
        sendToWorker(indexOf.get(c.workerId)!, {
          kind: "cancel",
          msg: { requestId: id, attempt: c.attempt, reason: c.reason },
        });
        return null;
      case "deliver": {
        if (rec.deliveredAttempt !== null && rec.deliveredAttempt !== c.attempt) {
          violation(`${id}: tokens of attempt ${c.attempt} after tokens of attempt ${rec.deliveredAttempt}`);
        }
        if (c.index !== rec.deliveredTokens) {
          violation(`${id}: delivered token ${c.index} after ${rec.deliveredTokens} tokens`);
        }
        if (rec.deliveredAttempt === null) ttfts.push(now - rec.req.arrivalMs);
        rec.deliveredAttempt = c.attempt;
        rec.deliveredTokens += c.tokens.length;
        rec.deliveredBy = rec.state.workerId;
        return null;
      }
      case "finish": {
        log(`finish ${id} ${c.outcome} ${c.reason ?? ""}`);
        if (c.outcome === "completed") {
          completed++;
          sources[rec.source!] = (sources[rec.source!] ?? 0) + 1;
          load[rec.deliveredBy!] = (load[rec.deliveredBy!] ?? 0) + 1;
        } else {
          failed[c.reason!] = (failed[c.reason!] ?? 0) + 1;
        }
        return null;
      }
    }
  };

  const workerLost = (w: number): void => {
    const id = workers[w]!.id;
    for (const rec of [...active]) {
      if (rec.state.workerId === id) apply(rec, { type: "worker_lost", workerId: id });
    }
  };

  const quiescent = (): boolean =>
    arrived === workload.requests.length &&
    active.size === 0 &&
    workers.every((w) => !w.alive || w.quiescent());

  // ---- schedule the world
  // Traffic starts after every worker's first heartbeat could have arrived.
  const warmupMs = 2 * opts.heartbeatMs;
  for (const r of workload.requests) {
    const req = { ...r, arrivalMs: r.arrivalMs + warmupMs };
    agenda.push(req.arrivalMs, { k: "arrive", req });
  }
  for (let w = 0; w < workers.length; w++)
    agenda.push(faultRng.float() * opts.heartbeatMs, { k: "heartbeat", w });
  agenda.push(opts.tickMs, { k: "tick" });
  const horizon = (workload.requests.at(-1)?.arrivalMs ?? 0) + warmupMs;
  if (opts.faults.has("crash")) {
    const n = faultRng.int(1, Math.max(1, Math.floor(workers.length / 2)));
    for (let i = 0; i < n; i++) {
      const w = faultRng.int(0, workers.length - 1);
      const at = faultRng.float() * horizon;
      agenda.push(at, { k: "crash", w });
      if (opts.faults.has("restart")) agenda.push(at + 200 + faultRng.float() * 2_000, { k: "restart", w });
    }
  }
  if (opts.faults.has("partition")) {
    const n = faultRng.int(1, Math.max(1, workers.length));
    for (let i = 0; i < n; i++) {
      const w = faultRng.int(0, workers.length - 1);
      const at = faultRng.float() * horizon;
      agenda.push(at, { k: "partition", w, on: true });
      agenda.push(at + 100 + faultRng.exponential(800), { k: "partition", w, on: false });
    }
  }

  // ---- run
  for (;;) {
    const next = agenda.pop();
    if (!next) break;
    if (next.time < now) violation(`time went back from ${now} to ${next.time}`);
    now = next.time;
    step++;
    if (step > MAX_STEPS) violation(`no quiescence after ${MAX_STEPS} steps`);
    const e = next.item;
    switch (e.k) {
      case "arrive": {
        arrived++;
        log(`arrive ${e.req.requestId} t${e.req.tenant} p${e.req.promptTokens} m${e.req.maxTokens}`);
        const s = startAssignment(e.req.requestId, e.req.promptTokens, now);
        const rec: RequestRecord = {
          req: e.req,
          state: s.state,
          lastOfferedAttempt: 0,
          deliveredAttempt: null,
          deliveredTokens: 0,
          deliveredBy: null,
          source: null,
        };
        records.set(e.req.requestId, rec);
        active.add(rec);
        for (const c of s.commands) {
          const routed = run(rec, c);
          if (routed) apply(rec, routed);
        }
        break;
      }
      case "heartbeat": {
        const w = workers[e.w]!;
        if (w.alive) ios[e.w]!.send({ kind: "heartbeat", msg: w.heartbeat() });
        if (!quiescent()) agenda.push(now + opts.heartbeatMs, e);
        break;
      }
      case "tick": {
        const r = expire(view, now, opts.router.heartbeatTtlMs);
        view = r.view;
        for (const id of r.expired) {
          log(`expired ${id}`);
          workerLost(indexOf.get(id)!);
        }
        for (const rec of [...active]) apply(rec, { type: "tick" });
        if (!quiescent()) agenda.push(now + opts.tickMs, e);
        break;
      }
      case "to-controller": {
        const m = e.m;
        log(
          `recv ${m.kind} ${"requestId" in m.msg ? `${m.msg.requestId} #${m.msg.attempt}` : ""} ${workers[e.from]!.id}`,
        );
        if (m.kind === "heartbeat") {
          view = observe(view, m.msg, now).view;
          break;
        }
        const rec = records.get(m.msg.requestId);
        if (rec) apply(rec, { type: m.kind, msg: m.msg } as AssignmentEvent);
        break;
      }
      case "to-worker": {
        const w = workers[e.to]!;
        if (!w.alive) break;
        log(`deliver ${e.m.kind} ${e.m.msg.requestId} #${e.m.msg.attempt} ${w.id}`);
        if (e.m.kind === "offer") w.onOffer(e.m.msg, now, ios[e.to]!);
        else w.onCancel(e.m.msg);
        break;
      }
      case "timer":
        workers[e.w]!.onTimer(e.t, now, ios[e.w]!);
        break;
      case "crash": {
        const w = workers[e.w]!;
        if (!w.alive) break;
        crashes++;
        log(`crash ${w.id}`);
        w.crash(ios[e.w]!);
        // The controller sees the socket close shortly after (unless partitioned: then only the TTL tells).
        if (!net.partitioned[e.w]) agenda.push(now + 1 + netRng.float() * 4, { k: "closed", w: e.w });
        break;
      }
      case "closed":
        log(`closed ${workers[e.w]!.id}`);
        view = disconnect(view, workers[e.w]!.id);
        workerLost(e.w);
        break;
      case "restart": {
        const w = workers[e.w]!;
        if (w.alive) break;
        restarts++;
        w.restart();
        log(`restart ${w.id} epoch ${w.epoch}`);
        if (quiescent()) break;
        agenda.push(now, { k: "heartbeat", w: e.w });
        break;
      }
      case "partition":
        if (net.partitioned[e.w] !== e.on) {
          net.partitioned[e.w] = e.on;
          if (e.on) partitions++;
          log(`partition ${workers[e.w]!.id} ${e.on ? "on" : "off"}`);
        }
        break;
    }

    // ---- invariants after every step
    for (const w of workers) {
      try {
        w.check();
      } catch (err) {
        violation((err as Error).message);
      }
    }
    for (const rec of active) {
      if (now - rec.req.arrivalMs > opts.limits.requestDeadlineMs + opts.tickMs) {
        violation(
          `${rec.req.requestId} still ${rec.state.phase} ${now - rec.req.arrivalMs} ms after arrival`,
        );
      }
    }
  }

  // ---- quiescence
  if (arrived !== workload.requests.length || active.size > 0) {
    violation(`agenda drained with ${active.size} open requests`);
  }
  for (const w of workers) {
    if (w.alive && !w.quiescent()) {
      violation(`${w.id} holds ${w.admission.reservations.size} reservations after quiescence`);
    }
  }

  const sorted = [...ttfts].sort((a, b) => a - b);
  const loads = Object.values(load);
  const meanLoad = loads.reduce((a, b) => a + b, 0) / Math.max(1, loads.length);
  return {
    seed: opts.seed,
    policy: opts.policy,
    faults: Faults.filter((f) => opts.faults.has(f)),
    traceHash: trace.digest("hex"),
    steps: step,
    endMs: Math.round(now),
    requests: workload.requests.length,
    completed,
    failed,
    meanTtftMs: sorted.length === 0 ? 0 : sorted.reduce((a, b) => a + b, 0) / sorted.length,
    p99TtftMs:
      sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.ceil(0.99 * sorted.length) - 1)]!,
    load,
    maxOverMeanLoad: meanLoad === 0 ? 0 : Math.max(...loads) / meanLoad,
    sources,
    lateIgnored,
    duplicates,
    attempts,
    messages: { sent: net.sent, lost: net.lost, duplicated: net.duplicated },
    crashes,
    restarts,
    partitions,
  };
}
