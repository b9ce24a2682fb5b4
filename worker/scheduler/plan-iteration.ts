import { type PageCount, type PrefixHash, type RequestId, TokenCount } from "../../schema/ids.ts";
import {
  type Budgets,
  type Phase,
  type PreemptDisposition,
  phaseOf,
  type RequestRecord,
  SchedulerInputError,
} from "./request.ts";

/** One lane of the next step: rows [firstRow, firstRow + tokens) of request `id`. */
export interface ScheduledWork {
  readonly id: RequestId;
  readonly phase: Phase;
  readonly firstRow: TokenCount;
  readonly tokens: TokenCount;
}

export type DeferReason =
  | "token-budget"
  | "sequence-budget"
  | "awaiting-pages"
  | "not-admitted"
  | "preempted"
  /** Its next page is being computed, in this same plan, by the request named `producer`. */
  | "awaiting-prefix";

export interface Deferral {
  readonly id: RequestId;
  readonly reason: DeferReason;
  /** For "awaiting-prefix": the request computing the page it waits for. */
  readonly producer?: RequestId;
}

export interface Preemption {
  readonly id: RequestId;
  readonly disposition: PreemptDisposition;
  /** Pages this preemption returns: its reservation, plus its pages unless kept resident. */
  readonly freesPages: PageCount;
  /** The waiting request it makes room for. */
  readonly forRequest: RequestId;
  readonly reason: string;
}

export interface Admission {
  readonly id: RequestId;
  readonly pages: PageCount;
  /** For a resumption: how the request was preempted, so how its state comes back. */
  readonly resumedFrom: PreemptDisposition | null;
}

export interface IterationPlan {
  /** Decode lanes first, then prefill tiles. */
  readonly scheduled: readonly ScheduledWork[];
  readonly deferred: readonly Deferral[];
  /** Waiting requests to admit (reserve pages for), in order; resumptions included. */
  readonly admit: readonly Admission[];
  readonly preempt: readonly Preemption[];
  readonly unusedTokens: number;
  readonly unusedSeqs: number;
}

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Service order: priority (high first), arrival, id. */
function serviceOrder(a: RequestRecord, b: RequestRecord): number {
  return b.priority - a.priority || a.arrival - b.arrival || cmp(a.id, b.id);
}

/** Victim order: lowest priority first, then the latest arrival, then the larger id. */
function victimOrder(a: RequestRecord, b: RequestRecord): number {
  return a.priority - b.priority || b.arrival - a.arrival || cmp(b.id, a.id);
}

/** Age order, which alone decides who gets the minimum prefill budget: arrival, then id. */
function ageOrder(a: RequestRecord, b: RequestRecord): number {
  return a.arrival - b.arrival || cmp(a.id, b.id);
}

function positiveInt(what: string, n: number, allowZero = false): void {
  if (!Number.isSafeInteger(n) || n < (allowZero ? 0 : 1))
    throw new SchedulerInputError(
      `${what} must be a ${allowZero ? "non-negative" : "positive"} integer, got ${n}`,
    );
}

function validate(requests: readonly RequestRecord[], b: Budgets): void {
  positiveInt("budgets.maxBatchTokens", b.maxBatchTokens);
  positiveInt("budgets.maxBatchSeqs", b.maxBatchSeqs);
  positiveInt("budgets.minPrefillTokens", b.minPrefillTokens, true);
  positiveInt("budgets.prefillTile", b.prefillTile);
  positiveInt("budgets.pageTokens", b.pageTokens);
  positiveInt("budgets.availablePages", b.availablePages, true);
  const seen = new Set<RequestId>();
  for (const r of requests) {
    const at = `request ${r.id}`;
    if (seen.has(r.id)) throw new SchedulerInputError(`${at} appears twice`);
    seen.add(r.id);
    if (r.model !== b.model)
      throw new SchedulerInputError(`${at}: model ${r.model} is not this worker's ${b.model}`);
    if (r.tokens.length === 0) throw new SchedulerInputError(`${at}: empty token history`);
    positiveInt(`${at}: processed`, r.processed, true);
    if (r.processed > r.tokens.length - 1)
      throw new SchedulerInputError(
        `${at}: processed ${r.processed} beyond the ${r.tokens.length - 1} rows before the pending token`,
      );
    if (r.pendingToken !== r.tokens[r.tokens.length - 1])
      throw new SchedulerInputError(
        `${at}: pending token ${r.pendingToken} is not the last token of its history`,
      );
    if (!Number.isFinite(r.priority) || !Number.isFinite(r.arrival))
      throw new SchedulerInputError(`${at}: priority and arrival must be finite`);
    if (
      r.nextPageHash !== null &&
      (Math.floor(r.processed / b.pageTokens) + 1) * b.pageTokens > r.tokens.length - 1
    )
      throw new SchedulerInputError(
        `${at}: nextPageHash given, but page ${Math.floor(r.processed / b.pageTokens)} is not a full page of its ${r.tokens.length - 1} rows`,
      );
    positiveInt(`${at}: admitPages`, r.admitPages, true);
    positiveInt(`${at}: reservedPages`, r.reservedPages, true);
    positiveInt(`${at}: releasablePages`, r.releasablePages, true);
    if (r.state === "running" && r.preempted !== null)
      throw new SchedulerInputError(`${at}: running but marked preempted`);
  }
}

/**
 * How a victim gives up pages to cover `shortfall`: keep its pages resident if
 * its reservation alone covers it; otherwise drop its route (its unshared
 * pages become cached, so available, and its resumption adopts whatever of
 * them is still cached when it is admitted again).
 */
function disposition(
  v: RequestRecord,
  shortfall: number,
): { d: PreemptDisposition; frees: number; why: string } {
  if (v.reservedPages >= shortfall)
    return {
      d: "keep-resident",
      frees: v.reservedPages,
      why: `its ${v.reservedPages} reserved pages cover the shortfall`,
    };
  return {
    d: "drop",
    frees: v.reservedPages + v.releasablePages,
    why: `its ${v.reservedPages} reserved pages do not cover the shortfall of ${shortfall}`,
  };
}

/**
 * In-flight prefix sharing: among prefill requests whose next page has the
 * same prefix hash (so the same tokens from position 0), the one furthest
 * into that page, then the oldest, computes it. The others that hold none of
 * its rows yet (they stand at a page boundary) are waiters: they would
 * compute exactly the same rows. One already part-way into the page keeps
 * computing, since dropping its rows would waste them.
 */
function prefixWaiters(others: readonly RequestRecord[], pageTokens: number): Set<RequestRecord> {
  const sharable = others.filter((r) => r.nextPageHash !== null);
  const producer = new Map<PrefixHash, RequestRecord>();
  for (const r of sharable) {
    const p = producer.get(r.nextPageHash!);
    if (!p || r.processed > p.processed || (r.processed === p.processed && ageOrder(r, p) < 0))
      producer.set(r.nextPageHash!, r);
  }
  return new Set(
    sharable.filter((r) => producer.get(r.nextPageHash!) !== r && r.processed % pageTokens === 0),
  );
}

/**
 * Plan one continuous-batching iteration. Pure: the same requests and budgets
 * give a deep-equal plan.
 *
 * 1. Admission: waiting requests in service order reserve their pages while
 *    they fit. One that does not fit may preempt running requests of strictly
 *    lower priority (lowest priority, latest arrival first); if even that is
 *    not enough, admission stops there so nobody behind it jumps the queue.
 * 2. Decode lanes take one row each, first, from the budget minus the minimum
 *    prefill reservation (rows and one lane) held while a prefill waits.
 * 3. The oldest prefill (by arrival, then id) takes its tile next, so under
 *    any decode load it advances ≥ min(minPrefillTokens, tile) rows per
 *    iteration: every prompt finishes within a bounded number of iterations.
 * 4. Other prefill tiles share what is left in service order.
 * 5. Prefix waiters (see prefixWaiters) come last: one whose next page a
 *    scheduled lane is computing is deferred ("awaiting-prefix") and spends
 *    no budget; the caller shares that page with it once sealed. If no lane
 *    computes it (its producer is deferred, cancelled or preempted), the
 *    waiter computes it itself, and later waiters of that page wait on it.
 */
export function planIteration(requests: readonly RequestRecord[], budgets: Budgets): IterationPlan {
  validate(requests, budgets);
  const admit: Admission[] = [];
  const preempt: Preemption[] = [];
  const preempted = new Set<RequestId>();
  const admitted = new Set<RequestId>();

  let free = budgets.availablePages as number;
  const waiting = requests.filter((r) => r.state === "waiting").sort(serviceOrder);
  for (const w of waiting) {
    if (w.admitPages <= free) {
      free -= w.admitPages;
      admit.push({ id: w.id, pages: w.admitPages, resumedFrom: w.preempted });
      admitted.add(w.id);
      continue;
    }
    const victims = requests
      .filter((r) => r.state === "running" && !preempted.has(r.id) && r.priority < w.priority)
      .sort(victimOrder);
    const chosen: Preemption[] = [];
    let room = free;
    for (const v of victims) {
      if (room >= w.admitPages) break;
      const { d, frees, why } = disposition(v, w.admitPages - room);
      if (frees === 0) continue;
      chosen.push({
        id: v.id,
        disposition: d,
        freesPages: frees as PageCount,
        forRequest: w.id,
        reason: `priority ${v.priority} < ${w.priority}, arrival ${v.arrival}; ${why}`,
      });
      room += frees;
    }
    if (room < w.admitPages) break;
    for (const c of chosen) {
      preempt.push(c);
      preempted.add(c.id);
    }
    free = room - w.admitPages;
    admit.push({ id: w.id, pages: w.admitPages, resumedFrom: w.preempted });
    admitted.add(w.id);
  }

  const deferred: Deferral[] = [];
  const candidates: RequestRecord[] = [];
  for (const r of [...requests].sort(serviceOrder)) {
    if (preempted.has(r.id)) deferred.push({ id: r.id, reason: "preempted" });
    else if (r.state === "waiting" && !admitted.has(r.id))
      deferred.push({ id: r.id, reason: "not-admitted" });
    else if (!r.runnable) deferred.push({ id: r.id, reason: "awaiting-pages" });
    else candidates.push(r);
  }

  const decodes = candidates.filter((r) => phaseOf(r).phase === "decode");
  const others = candidates.filter((r) => phaseOf(r).phase !== "decode");
  const holdTokens = others.length > 0 ? Math.min(budgets.minPrefillTokens, budgets.maxBatchTokens) : 0;
  const holdSeqs = holdTokens > 0 ? 1 : 0;
  let tokens = budgets.maxBatchTokens;
  let seqs = budgets.maxBatchSeqs;
  const scheduled: ScheduledWork[] = [];

  for (const r of decodes) {
    if (seqs - holdSeqs < 1) deferred.push({ id: r.id, reason: "sequence-budget" });
    else if (tokens - holdTokens < 1) deferred.push({ id: r.id, reason: "token-budget" });
    else {
      scheduled.push({
        id: r.id,
        phase: "decode",
        firstRow: r.processed,
        tokens: TokenCount(1),
      });
      tokens--;
      seqs--;
    }
  }

  /** Schedules r's next prefill tile if the budgets allow; true when scheduled. */
  const tile = (r: RequestRecord): boolean => {
    const n = Math.min(phaseOf(r).remaining, budgets.prefillTile, tokens);
    if (seqs < 1) deferred.push({ id: r.id, reason: "sequence-budget" });
    else if (n < 1) deferred.push({ id: r.id, reason: "token-budget" });
    else {
      scheduled.push({ id: r.id, phase: "prefill", firstRow: r.processed, tokens: TokenCount(n) });
      tokens -= n;
      seqs--;
      return true;
    }
    return false;
  };

  const waiters = prefixWaiters(others, budgets.pageTokens);
  /** Page hash → the request this plan has computing that page. */
  const computing = new Map<PrefixHash, RequestId>();
  const computes = (r: RequestRecord) => {
    if (r.nextPageHash !== null) computing.set(r.nextPageHash, r.id);
  };
  const ahead = others.filter((r) => !waiters.has(r));
  const oldest = [...ahead].sort(ageOrder)[0];
  const order = oldest ? [oldest, ...ahead.filter((r) => r !== oldest)] : [];
  for (const r of order) if (tile(r)) computes(r);
  // A waiter whose page some scheduled lane computes waits for it (bounded:
  // each iteration it waits, that page gains ≥ 1 row, so it waits at most
  // pageTokens iterations per page it then shares); otherwise it takes over.
  for (const r of others) {
    if (!waiters.has(r)) continue;
    const producer = computing.get(r.nextPageHash!);
    if (producer !== undefined) deferred.push({ id: r.id, reason: "awaiting-prefix", producer });
    else if (tile(r)) computes(r);
  }
  return { scheduled, deferred, admit, preempt, unusedTokens: tokens, unusedSeqs: seqs };
}
