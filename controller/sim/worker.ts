import {
  type AdmissionLimits,
  type AdmissionState,
  admit,
  cancel,
  checkAdmission,
  complete,
  freshAdmission,
} from "../../schema/admission.ts";
import type {
  Accept,
  Cancel,
  Decline,
  Heartbeat,
  PrefillProgress,
  ResidentPrefix,
  Result,
  StoreTier,
  Tokens,
} from "../../schema/control.ts";
import { MAX_PREFILLING_ATTEMPTS } from "../../schema/control.ts";
import type { ModelFingerprint, NodeId, RequestId, TokenCount, WorkerId } from "../../schema/ids.ts";
import {
  type CatalogAnswer,
  type ChainBoundary,
  type ChunkReplica,
  deriveCandidates,
} from "../candidates.ts";
import { predictTerms } from "../router.ts";

/**
 * A simulated worker: the real worker admission machine over a modelled page
 * pool (reservations + a resident prefix cache with refcounts and LRU
 * eviction), one prefill engine serving jobs in FIFO order, and batched
 * decode emitting tokens frames. Its work takes its true `costs`; its
 * heartbeat reports `reported` costs (default: the true ones, perfect
 * calibration) with its real pages and queue, and it plans each job's source
 * by what it reports, as a real worker plans by its calibration.
 */

export interface SimCosts {
  readonly prefillPerTokenMs: number;
  readonly firstTokenMs: number;
  readonly decodeMsPerToken: number;
  readonly uploadMsPerMiB: number;
  readonly restoreMsPerMiB: {
    readonly ram: number;
    readonly ssd: number;
    readonly peer: number;
    readonly s3: number;
  };
}

export interface SimWorkerShape {
  readonly fingerprint: ModelFingerprint;
  readonly totalPages: number;
  readonly pageTokens: number;
  readonly kvBytesPerToken: number;
  readonly maxContext: number;
  /** Tokens per tokens frame during decode. */
  readonly frameTokens: number;
  /** Bound on the engine queue (jobs admitted, prefill not started). */
  readonly maxQueuedJobs: number;
  /** Chunks the host RAM tier holds; older ones are demoted to the SSD tier (unbounded here) or dropped. */
  readonly ramChunks: number;
  /** Whether the worker has a local SSD tier. */
  readonly ssdTier: boolean;
}

/** What the simulated controller offers (the Offer message minus the prompt bytes). */
export interface SimOffer {
  readonly requestId: RequestId;
  readonly attempt: number;
  readonly modelFingerprint: ModelFingerprint;
  readonly promptTokens: number;
  readonly maxTokens: TokenCount;
  readonly chain: readonly ChainBoundary[];
}

export type WorkerMessage =
  | { readonly kind: "heartbeat"; readonly msg: Heartbeat }
  | { readonly kind: "accept"; readonly msg: Accept }
  | { readonly kind: "decline"; readonly msg: Decline }
  | { readonly kind: "tokens"; readonly msg: Tokens }
  | { readonly kind: "result"; readonly msg: Result };

export type WorkerTimer =
  | { readonly k: "first"; readonly epoch: number; readonly requestId: RequestId; readonly attempt: number }
  | { readonly k: "decode"; readonly epoch: number; readonly requestId: RequestId; readonly attempt: number };

/** The fleet's published chunks: S3 for all; RAM or SSD per worker (lost with the worker). */
export class SimCatalog {
  private readonly local = new Map<NodeId, Map<WorkerId, StoreTier>>();
  private readonly s3 = new Set<NodeId>();

  /** Records a ready replica of `nodeId` on `workerId`'s `tier`, and its S3 copy. */
  publish(nodeId: NodeId, workerId: WorkerId, tier: "ram" | "ssd"): void {
    let holders = this.local.get(nodeId);
    if (!holders) {
      holders = new Map();
      this.local.set(nodeId, holders);
    }
    holders.set(workerId, tier);
    this.s3.add(nodeId);
  }

  /** The worker no longer holds a local replica (its S3 copy stays). */
  unpublish(nodeId: NodeId, workerId: WorkerId): void {
    this.local.get(nodeId)?.delete(workerId);
  }

  dropWorker(workerId: WorkerId): void {
    for (const holders of this.local.values()) holders.delete(workerId);
  }

  /** The catalog answer for a chain: replicas of each node of the longest published prefix. */
  answer(chain: readonly ChainBoundary[]): CatalogAnswer {
    const replicas: ChunkReplica[][] = [];
    for (const node of chain) {
      if (!this.s3.has(node.nodeId)) break;
      const list: ChunkReplica[] = [{ tier: "s3", workerId: null }];
      for (const [w, tier] of this.local.get(node.nodeId) ?? []) list.push({ tier, workerId: w });
      replicas.push(list);
    }
    return { replicas };
  }
}

export interface WorkerIO {
  send(m: WorkerMessage): void;
  schedule(atMs: number, timer: WorkerTimer): void;
  readonly catalog: SimCatalog;
}

interface CacheChunk {
  readonly nodeId: NodeId;
  readonly depth: number;
  readonly pages: number;
  pins: number;
  lastUseMs: number;
}

interface Job {
  readonly requestId: RequestId;
  readonly attempt: number;
  readonly readyAtMs: number;
  /** upload + prefill + first token, on the engine. */
  readonly serviceMs: number;
  readonly missingTokens: number;
  readonly maxTokens: number;
  readonly chain: readonly ChainBoundary[];
  readonly pinned: NodeId[];
  emitted: number;
  released: boolean;
}

export class SimWorker {
  alive = true;
  epoch = 1;
  private sequence = 0;
  private samples = 0;
  admission: AdmissionState = freshAdmission(1);
  private readonly cache = new Map<NodeId, CacheChunk>();
  /** Host RAM tier, least recently used first (Map insertion order). */
  private readonly ramTier = new Map<NodeId, true>();
  private cachedPages = 0;
  private readonly queue: Job[] = [];
  private current: Job | null = null;
  private readonly jobs = new Map<RequestId, Job>();
  private readonly limits: AdmissionLimits;

  constructor(
    readonly id: WorkerId,
    readonly costs: SimCosts,
    private readonly shape: SimWorkerShape,
    private readonly tenantChains: readonly (readonly ChainBoundary[])[],
    readonly reported: SimCosts = costs,
  ) {
    this.limits = {
      workerId: id,
      modelFingerprint: shape.fingerprint,
      maxContext: shape.maxContext as TokenCount,
      pageTokens: shape.pageTokens,
      fenceMemory: 4096,
    };
  }

  /** No admitted work left (reservations, queued, prefilling or decoding jobs). */
  quiescent(): boolean {
    return this.admission.reservations.size === 0 && this.jobs.size === 0 && this.current === null;
  }

  private freePages(): number {
    return this.shape.totalPages - this.admission.reservedPages - this.cachedPages;
  }

  private residentDepth(chain: readonly ChainBoundary[]): number {
    let d = 0;
    while (d < chain.length && this.cache.has(chain[d]!.nodeId)) d++;
    return d;
  }

  heartbeat(): Heartbeat {
    const residentPrefixes: ResidentPrefix[] = [];
    for (const chain of this.tenantChains) {
      const d = this.residentDepth(chain);
      for (let i = 0; i < d; i++)
        residentPrefixes.push({ nodeId: chain[i]!.nodeId, tokens: chain[i]!.tokens });
    }
    let evictable = 0;
    for (const c of this.cache.values()) if (c.pins === 0) evictable += c.pages;
    let queuedTokens = 0;
    let queuedRequests = 0;
    const prefilling: PrefillProgress[] = [];
    for (const j of [...(this.current ? [this.current] : []), ...this.queue]) {
      if (j.released) continue;
      queuedTokens += j.missingTokens;
      queuedRequests++;
      if (prefilling.length < MAX_PREFILLING_ATTEMPTS)
        prefilling.push({
          requestId: j.requestId,
          attempt: j.attempt,
          remainingTokens: j.missingTokens as TokenCount,
        });
    }
    return {
      workerId: this.id,
      epoch: this.epoch,
      sequence: this.sequence++,
      modelFingerprint: this.shape.fingerprint,
      maxContext: this.shape.maxContext as TokenCount,
      pageTokens: this.shape.pageTokens,
      kvBytesPerToken: this.shape.kvBytesPerToken,
      freePages: this.freePages() as never,
      evictablePages: evictable as never,
      residentPrefixes,
      durableTiers: this.shape.ssdTier ? ["ram", "ssd", "s3"] : ["ram", "s3"],
      ready: true,
      queue: {
        queuedTokens: queuedTokens as TokenCount,
        queuedRequests,
        runningRequests: this.jobs.size - queuedRequests,
        prefilling,
      },
      costs: {
        prefillPerTokenMs: this.reported.prefillPerTokenMs,
        firstTokenMs: this.reported.firstTokenMs,
        uploadMsPerMiB: this.reported.uploadMsPerMiB,
        restoreMsPerMiB: this.reported.restoreMsPerMiB,
        samples: this.samples,
      },
    };
  }

  onOffer(offer: SimOffer, nowMs: number, io: WorkerIO): void {
    const d = this.residentDepth(offer.chain);
    let ownUnpinned = 0;
    for (let i = 0; i < d; i++) {
      const c = this.cache.get(offer.chain[i]!.nodeId)!;
      if (c.pins === 0) ownUnpinned += c.pages;
    }
    let evictable = 0;
    for (const c of this.cache.values()) if (c.pins === 0) evictable += c.pages;
    const queueFull = this.queue.length >= this.shape.maxQueuedJobs;
    const step = admit(
      this.admission,
      offer,
      {
        freePages: Math.max(0, this.freePages()),
        // The request's own resident chunks are shared, not evicted for it.
        evictablePages: evictable - ownUnpinned,
        sharedPages: d === 0 ? 0 : Math.floor(offer.chain[d - 1]!.tokens / this.shape.pageTokens),
      },
      this.limits,
    );
    if (step.decision.type === "accept" && queueFull && step.state !== this.admission) {
      io.send({
        kind: "decline",
        msg: {
          requestId: offer.requestId,
          attempt: offer.attempt,
          workerId: this.id,
          reason: "draining",
          detail: `engine queue full (${this.shape.maxQueuedJobs} jobs)`,
        },
      });
      return;
    }
    if (step.superseded) this.stop(step.superseded.requestId);
    const fresh = step.decision.type === "accept" && step.state !== this.admission;
    this.admission = step.state;
    if (fresh) this.startJob(offer, d, nowMs, io);
    io.send(
      step.decision.type === "accept"
        ? { kind: "accept", msg: step.decision.msg }
        : { kind: "decline", msg: step.decision.msg },
    );
  }

  /** Plans the job with the worker's own real state (resident, own RAM, peers, S3 or recompute) and queues it. */
  private startJob(offer: SimOffer, residentDepth: number, nowMs: number, io: WorkerIO): void {
    const pinned: NodeId[] = [];
    for (let i = 0; i < residentDepth; i++) {
      const c = this.cache.get(offer.chain[i]!.nodeId)!;
      c.pins++;
      c.lastUseMs = nowMs;
      pinned.push(c.nodeId);
    }
    this.makeRoom(0);
    const hb = this.heartbeat();
    const { candidates } = deriveCandidates(
      { ...offer, promptTokens: offer.promptTokens as TokenCount },
      [{ heartbeat: hb, ageMs: 0 }],
      io.catalog.answer(offer.chain),
      { residentFreshMs: Number.POSITIVE_INFINITY },
    );
    // Chosen by the reported costs, timed by the true ones.
    const truth: Heartbeat =
      this.costs === this.reported ? hb : { ...hb, costs: { ...hb.costs, ...this.costs } };
    let best = { fetchMs: 0, serviceMs: Number.POSITIVE_INFINITY, missing: offer.promptTokens };
    let bestPlanned = Number.POSITIVE_INFINITY;
    for (const c of candidates) {
      const p = predictTerms(hb, c, offer.promptTokens, undefined);
      const planned = p.fetchMs + p.uploadMs + p.prefillMs + p.firstTokenMs;
      if (planned < bestPlanned) {
        bestPlanned = planned;
        const t = truth === hb ? p : predictTerms(truth, c, offer.promptTokens, undefined);
        best = {
          fetchMs: t.fetchMs,
          serviceMs: t.uploadMs + t.prefillMs + t.firstTokenMs,
          missing: offer.promptTokens - c.cachedTokens,
        };
      }
    }
    const job: Job = {
      requestId: offer.requestId,
      attempt: offer.attempt,
      readyAtMs: nowMs + best.fetchMs,
      serviceMs: best.serviceMs,
      missingTokens: best.missing,
      maxTokens: offer.maxTokens,
      chain: offer.chain,
      pinned,
      emitted: 0,
      released: false,
    };
    this.jobs.set(offer.requestId, job);
    this.queue.push(job);
    this.kick(nowMs, io);
  }

  /** Evicts unpinned chunks, least recently used and deepest first, until `extra` pages are free. */
  private makeRoom(extra: number): boolean {
    while (this.freePages() < extra) {
      let victim: CacheChunk | null = null;
      for (const c of this.cache.values()) {
        if (c.pins > 0) continue;
        if (
          victim === null ||
          c.lastUseMs < victim.lastUseMs ||
          (c.lastUseMs === victim.lastUseMs && c.depth > victim.depth)
        ) {
          victim = c;
        }
      }
      if (victim === null) return false;
      this.cache.delete(victim.nodeId);
      this.cachedPages -= victim.pages;
    }
    return true;
  }

  private holds(job: Job): boolean {
    return !job.released && this.admission.reservations.get(job.requestId)?.attempt === job.attempt;
  }

  private kick(nowMs: number, io: WorkerIO): void {
    while (this.current === null && this.queue.length > 0) {
      const job = this.queue.shift()!;
      if (!this.holds(job)) continue;
      this.current = job;
      const start = Math.max(nowMs, job.readyAtMs);
      io.schedule(start + job.serviceMs, {
        k: "first",
        epoch: this.epoch,
        requestId: job.requestId,
        attempt: job.attempt,
      });
    }
  }

  onTimer(t: WorkerTimer, nowMs: number, io: WorkerIO): void {
    if (!this.alive || t.epoch !== this.epoch) return;
    const job = this.jobs.get(t.requestId);
    if (t.k === "first") {
      if (
        this.current !== null &&
        this.current.requestId === t.requestId &&
        this.current.attempt === t.attempt
      ) {
        this.current = null;
      }
      this.kick(nowMs, io);
    }
    if (!job || job.attempt !== t.attempt || !this.holds(job)) return;
    const n = t.k === "first" ? 1 : Math.min(this.shape.frameTokens, job.maxTokens - job.emitted);
    const tokens: number[] = [];
    for (let i = 0; i < n; i++) tokens.push((job.emitted + i) * 31 + job.attempt);
    io.send({
      kind: "tokens",
      msg: { requestId: job.requestId, attempt: job.attempt, workerId: this.id, index: job.emitted, tokens },
    });
    job.emitted += n;
    if (t.k === "first") this.samples++;
    if (job.emitted < job.maxTokens) {
      const next = Math.min(this.shape.frameTokens, job.maxTokens - job.emitted);
      io.schedule(nowMs + next * this.costs.decodeMsPerToken, { ...t, k: "decode" });
      return;
    }
    io.send({
      kind: "result",
      msg: {
        requestId: job.requestId,
        attempt: job.attempt,
        workerId: this.id,
        outcome: "completed",
        finishReason: "length",
        tokensTotal: job.emitted,
        measuredTtftMs: null,
        reason: "",
      },
    });
    this.admission = complete(this.admission, job.requestId, job.attempt, this.limits).state;
    this.stop(job.requestId);
    this.publish(job.chain, nowMs, io);
  }

  /** After a request's prefill the worker holds its whole shared chain: cache it and publish it. */
  private publish(chain: readonly ChainBoundary[], nowMs: number, io: WorkerIO): void {
    for (let i = 0; i < chain.length; i++) {
      const node = chain[i]!;
      this.storeInRam(node.nodeId, io);
      const had = this.cache.get(node.nodeId);
      if (had) {
        had.lastUseMs = nowMs;
        continue;
      }
      const pages = Math.ceil((node.tokens - (i === 0 ? 0 : chain[i - 1]!.tokens)) / this.shape.pageTokens);
      // Make room without evicting this chain's own earlier chunks (they were just touched).
      if (!this.makeRoom(pages)) break;
      this.cache.set(node.nodeId, { nodeId: node.nodeId, depth: i, pages, pins: 0, lastUseMs: nowMs });
      this.cachedPages += pages;
    }
  }

  /** Puts a chunk in the RAM tier (most recent); the least recent beyond capacity moves to SSD. */
  private storeInRam(nodeId: NodeId, io: WorkerIO): void {
    this.ramTier.delete(nodeId);
    this.ramTier.set(nodeId, true);
    io.catalog.publish(nodeId, this.id, "ram");
    while (this.ramTier.size > this.shape.ramChunks) {
      const oldest = this.ramTier.keys().next().value as NodeId;
      this.ramTier.delete(oldest);
      if (this.shape.ssdTier) io.catalog.publish(oldest, this.id, "ssd");
      else io.catalog.unpublish(oldest, this.id);
    }
  }

  /** Ends a job locally (completed, cancelled or superseded): unpins its chunks once. */
  private stop(requestId: RequestId): void {
    const job = this.jobs.get(requestId);
    if (!job || job.released) return;
    job.released = true;
    for (const id of job.pinned) {
      const c = this.cache.get(id);
      if (c) c.pins--;
    }
    this.jobs.delete(requestId);
  }

  onCancel(msg: Cancel): void {
    const r = cancel(this.admission, msg, this.limits);
    this.admission = r.state;
    if (r.released) this.stop(msg.requestId);
  }

  /** The process dies: pages, cache, queue and reservations are gone. */
  crash(io: WorkerIO): void {
    this.alive = false;
    this.cache.clear();
    this.ramTier.clear();
    this.cachedPages = 0;
    this.queue.length = 0;
    this.current = null;
    this.jobs.clear();
    this.admission = freshAdmission(this.epoch);
    io.catalog.dropWorker(this.id);
  }

  /** A new process: a new epoch, sequence from 0. */
  restart(): void {
    this.alive = true;
    this.epoch++;
    this.sequence = 0;
    this.admission = freshAdmission(this.epoch);
  }

  /** Page accounting invariants; throws on violation. */
  check(): void {
    checkAdmission(this.admission);
    let cached = 0;
    let pins = 0;
    for (const c of this.cache.values()) {
      cached += c.pages;
      pins += c.pins;
      if (c.pins < 0) throw new Error(`${this.id}: chunk ${c.nodeId.slice(0, 8)} pinned ${c.pins} times`);
    }
    if (cached !== this.cachedPages)
      throw new Error(`${this.id}: cache holds ${cached} pages, counted ${this.cachedPages}`);
    if (this.freePages() < 0) throw new Error(`${this.id}: ${-this.freePages()} pages over-committed`);
    let jobPins = 0;
    for (const j of this.jobs.values()) for (const id of j.pinned) if (this.cache.has(id)) jobPins++;
    if (pins !== jobPins) throw new Error(`${this.id}: ${pins} pins on cached chunks, jobs hold ${jobPins}`);
    if (this.jobs.size !== this.admission.reservations.size) {
      throw new Error(
        `${this.id}: ${this.jobs.size} jobs but ${this.admission.reservations.size} reservations`,
      );
    }
  }
}
