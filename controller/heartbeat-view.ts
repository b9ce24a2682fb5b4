import { compareVersion, type Heartbeat } from "../schema/control.ts";
import type { RequestId, WorkerId } from "../schema/ids.ts";

/**
 * The controller's view of live workers, built only from heartbeats (never
 * written to the catalog). Pure: every operation takes the view and a logical
 * `nowMs` and returns a new view; nothing reads a clock.
 *
 * Invariants:
 * - versions per worker only grow: an observation whose (epoch, sequence) is
 *   not newer than the last one seen from that worker is dropped, even after
 *   the worker's connection closed (so a delayed frame from a dead connection
 *   never resurrects it);
 * - an observation older than `ttlMs` is not live;
 * - a closed connection removes the worker's observation at once.
 */
export interface ViewEntry {
  /** The newest observation; null once the connection closed or it expired. */
  readonly heartbeat: Heartbeat | null;
  /** Logical time the newest observation arrived. */
  readonly receivedAtMs: number;
  /** Newest version ever seen from this worker (kept after loss, for ordering). */
  readonly epoch: number;
  readonly sequence: number;
}

export interface HeartbeatView {
  readonly entries: ReadonlyMap<WorkerId, ViewEntry>;
}

export type ObserveOutcome = "accepted" | "stale";

export const emptyView: HeartbeatView = { entries: new Map() };

/** Applies one observation; a version not newer than the last seen is dropped. */
export function observe(
  view: HeartbeatView,
  heartbeat: Heartbeat,
  nowMs: number,
): { view: HeartbeatView; outcome: ObserveOutcome } {
  const prev = view.entries.get(heartbeat.workerId);
  if (prev && compareVersion(heartbeat, prev) <= 0) return { view, outcome: "stale" };
  const entries = new Map(view.entries);
  entries.set(heartbeat.workerId, {
    heartbeat,
    receivedAtMs: nowMs,
    epoch: heartbeat.epoch,
    sequence: heartbeat.sequence,
  });
  return { view: { entries }, outcome: "accepted" };
}

/** The worker's connection closed: its observation is gone (its version is remembered). */
export function disconnect(view: HeartbeatView, workerId: WorkerId): HeartbeatView {
  const prev = view.entries.get(workerId);
  if (!prev || prev.heartbeat === null) return view;
  const entries = new Map(view.entries);
  entries.set(workerId, { ...prev, heartbeat: null });
  return { entries };
}

/**
 * Drops observations older than `ttlMs` at `nowMs`; returns the new view and
 * the workers that just expired (the caller fails over their assignments).
 */
export function expire(
  view: HeartbeatView,
  nowMs: number,
  ttlMs: number,
): { view: HeartbeatView; expired: WorkerId[] } {
  const expired: WorkerId[] = [];
  for (const [id, e] of view.entries) {
    if (e.heartbeat !== null && nowMs - e.receivedAtMs > ttlMs) expired.push(id);
  }
  if (expired.length === 0) return { view, expired };
  const entries = new Map(view.entries);
  for (const id of expired) entries.set(id, { ...entries.get(id)!, heartbeat: null });
  expired.sort();
  return { view: { entries }, expired };
}

/** A live observation with its age. */
export interface LiveWorker {
  readonly heartbeat: Heartbeat;
  readonly ageMs: number;
}

/** Live observations at `nowMs` (age ≤ ttlMs), in worker id order. */
export function liveWorkers(view: HeartbeatView, nowMs: number, ttlMs: number): LiveWorker[] {
  const out: LiveWorker[] = [];
  for (const e of view.entries.values()) {
    if (e.heartbeat === null) continue;
    const ageMs = nowMs - e.receivedAtMs;
    if (ageMs <= ttlMs) out.push({ heartbeat: e.heartbeat, ageMs });
  }
  out.sort((a, b) => (a.heartbeat.workerId < b.heartbeat.workerId ? -1 : 1));
  return out;
}

export function isLive(view: HeartbeatView, workerId: WorkerId, nowMs: number, ttlMs: number): boolean {
  const e = view.entries.get(workerId);
  return e !== undefined && e.heartbeat !== null && nowMs - e.receivedAtMs <= ttlMs;
}

/**
 * Per attempt, the prompt tokens its worker last reported still to prefill
 * (heartbeat `queue.prefilling`), for the controller's outstanding count.
 */
export function prefillRemaining(
  view: HeartbeatView,
): (workerId: WorkerId, requestId: RequestId, attempt: number) => number | undefined {
  const byWorker = new Map<WorkerId, Map<string, number>>();
  return (workerId, requestId, attempt) => {
    let m = byWorker.get(workerId);
    if (m === undefined) {
      m = new Map();
      for (const p of view.entries.get(workerId)?.heartbeat?.queue.prefilling ?? [])
        m.set(`${p.requestId}#${p.attempt}`, p.remainingTokens);
      byWorker.set(workerId, m);
    }
    return m.get(`${requestId}#${attempt}`);
  };
}
