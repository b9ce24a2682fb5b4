import type { CandidateSource, DecisionRecord, DropReason } from "../../schema/control.ts";

/**
 * The last routing decisions, for the web view: what the router chose among
 * which candidates, and the TTFT it predicted beside the one measured once
 * the first token came. The catalog keeps every decision (decision.recorded,
 * batched); this ring holds the newest few in memory so the view shows a
 * request the moment it is routed, not after a catalog round trip.
 *
 * Bounds: at most `capacity` decisions, and at most MAX_LISTED candidates of
 * each list (the rest are counted in `omitted`).
 */

export const MAX_LISTED = 16;

export interface DecisionCandidate {
  readonly workerId: string;
  readonly source: CandidateSource;
  readonly cachedTokens: number;
  readonly predictedTtftMs: number;
}

export interface DroppedRow {
  readonly workerId: string;
  readonly source: CandidateSource;
  readonly reason: DropReason;
}

export interface DecisionRow {
  readonly requestId: string;
  readonly attempt: number;
  /** ms since the epoch when it was routed. */
  readonly time: number;
  readonly promptTokens: number;
  /** The chosen worker and source (null: nothing was feasible). */
  readonly workerId: string | null;
  readonly source: CandidateSource | null;
  readonly cachedTokens: number;
  readonly predictedTtftMs: number | null;
  /** From the offer to the first token, once it came (null: not yet, or never). */
  measuredTtftMs: number | null;
  readonly ranked: readonly DecisionCandidate[];
  readonly dropped: readonly DroppedRow[];
  readonly omitted: number;
}

const round = (ms: number) => Math.round(ms * 100) / 100;

export class RecentDecisions {
  private readonly rows: DecisionRow[] = [];
  private readonly listeners = new Set<() => void>();

  constructor(readonly capacity = 50) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError("capacity must be ≥ 1");
  }

  /** A request (attempt) was routed. */
  routed(d: DecisionRecord, timeMs: number): void {
    const c = d.choice;
    this.rows.push({
      requestId: d.requestId,
      attempt: d.attempt,
      time: timeMs,
      promptTokens: d.promptTokens,
      workerId: c?.workerId ?? null,
      source: c?.source ?? null,
      cachedTokens: c?.cachedTokens ?? 0,
      predictedTtftMs: c ? round(c.predictedTtftMs) : null,
      measuredTtftMs: null,
      ranked: d.ranked.slice(0, MAX_LISTED).map((r) => ({
        workerId: r.workerId,
        source: r.source,
        cachedTokens: r.cachedTokens,
        predictedTtftMs: round(r.predictedTtftMs),
      })),
      dropped: d.dropped
        .slice(0, MAX_LISTED)
        .map((r) => ({ workerId: r.workerId, source: r.source, reason: r.reason })),
      omitted: Math.max(0, d.ranked.length - MAX_LISTED) + Math.max(0, d.dropped.length - MAX_LISTED),
    });
    if (this.rows.length > this.capacity) this.rows.shift();
    this.changed();
  }

  /** The attempt's first token came `measuredTtftMs` after its offer (a row already dropped is ignored). */
  measured(requestId: string, attempt: number, measuredTtftMs: number): void {
    for (let i = this.rows.length - 1; i >= 0; i--) {
      const r = this.rows[i]!;
      if (r.requestId === requestId && r.attempt === attempt) {
        r.measuredTtftMs = round(measuredTtftMs);
        this.changed();
        return;
      }
    }
  }

  /** Newest first. */
  list(): readonly DecisionRow[] {
    return [...this.rows].reverse();
  }

  /** Calls `fn` after every change; returns the unsubscribe. */
  onChange(fn: () => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  private changed(): void {
    for (const fn of this.listeners) fn();
  }
}
