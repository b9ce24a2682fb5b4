import type { Accept, Cancel, Decline, Offer } from "./control.ts";
import {
  type ModelFingerprint,
  type PageCount,
  pagesFor,
  type RequestId,
  type TokenCount,
  type WorkerId,
} from "./ids.ts";

/**
 * The worker's half of fenced assignments (pure; imports only schema/, so the
 * worker can use it as is). The worker is authoritative: whatever the
 * controller's heartbeat view said, it re-runs admission against its real
 * pages before accepting, holds one reservation per request (the newest
 * attempt) and releases it on completion, cancel, or when a newer attempt of
 * the same request supersedes it.
 *
 * Fencing memory: the highest attempt cancelled or superseded per request is
 * remembered (bounded, oldest forgotten first), so an offer delayed past its
 * own cancel is declined instead of reserving pages nobody will use.
 */

export interface AdmissionLimits {
  readonly workerId: WorkerId;
  readonly modelFingerprint: ModelFingerprint;
  readonly maxContext: TokenCount;
  readonly pageTokens: number;
  /** Requests whose fencing attempt is remembered. */
  readonly fenceMemory: number;
}

export interface Reservation {
  readonly requestId: RequestId;
  readonly attempt: number;
  readonly pages: PageCount;
}

export interface AdmissionState {
  readonly epoch: number;
  readonly reservations: ReadonlyMap<RequestId, Reservation>;
  /** Σ reservations' pages. */
  readonly reservedPages: number;
  /** Highest attempt fenced per request (insertion order = age). */
  readonly fenced: ReadonlyMap<RequestId, number>;
}

/** The worker's real page state when an offer arrives (from its page manager). */
export interface PagePool {
  readonly freePages: number;
  readonly evictablePages: number;
  /** Whole pages of this request's prefix already resident (shared, not allocated again). */
  readonly sharedPages: number;
}

export function freshAdmission(epoch: number): AdmissionState {
  return { epoch, reservations: new Map(), reservedPages: 0, fenced: new Map() };
}

export type AdmissionDecision =
  | { readonly type: "accept"; readonly msg: Accept }
  | { readonly type: "decline"; readonly msg: Decline };

export interface AdmissionStep {
  readonly state: AdmissionState;
  readonly decision: AdmissionDecision;
  /** A reservation of an older attempt released by this offer (its work must stop). */
  readonly superseded: Reservation | null;
}

function withFence(fenced: ReadonlyMap<RequestId, number>, id: RequestId, attempt: number, cap: number) {
  const next = new Map(fenced);
  next.delete(id);
  next.set(id, Math.max(attempt, fenced.get(id) ?? 0));
  while (next.size > cap) next.delete(next.keys().next().value as RequestId);
  return next;
}

/** What admission reads of an offer (`promptTokens` = offer.prompt.length). */
export type AdmissionRequest = Pick<Offer, "requestId" | "attempt" | "modelFingerprint" | "maxTokens"> & {
  readonly promptTokens: number;
};

/** Re-runs admission for an offer against the real pool. */
export function admit(
  s: AdmissionState,
  offer: AdmissionRequest,
  pool: PagePool,
  limits: AdmissionLimits,
): AdmissionStep {
  const decline = (reason: Decline["reason"], detail: string): AdmissionStep => ({
    state: s,
    decision: {
      type: "decline",
      msg: { requestId: offer.requestId, attempt: offer.attempt, workerId: limits.workerId, reason, detail },
    },
    superseded: null,
  });
  const held = s.reservations.get(offer.requestId);
  if (held && held.attempt === offer.attempt) {
    // A repeated offer of the attempt already held: answer again, reserve nothing more.
    return {
      state: s,
      decision: {
        type: "accept",
        msg: {
          requestId: offer.requestId,
          attempt: offer.attempt,
          workerId: limits.workerId,
          epoch: s.epoch,
          reservedPages: held.pages,
        },
      },
      superseded: null,
    };
  }
  const fence = Math.max(s.fenced.get(offer.requestId) ?? 0, held?.attempt ?? 0);
  if (offer.attempt <= fence) {
    return decline("stale_attempt", `attempt ${offer.attempt} is fenced by attempt ${fence}`);
  }
  if (offer.modelFingerprint !== limits.modelFingerprint) {
    return decline("wrong_model", `this worker serves ${limits.modelFingerprint.slice(0, 12)}`);
  }
  const total = offer.promptTokens + offer.maxTokens;
  if (total > limits.maxContext) {
    return decline("context_too_long", `prompt + max tokens = ${total} > context ${limits.maxContext}`);
  }
  // Pages: the whole sequence (prompt + generation) minus shared resident pages.
  // A superseded reservation of this request is released first, so it counts as free.
  const need = Math.max(0, pagesFor(total as TokenCount, limits.pageTokens) - pool.sharedPages);
  const have = pool.freePages + pool.evictablePages + (held?.pages ?? 0);
  if (need > have) {
    return decline(
      "pages_short",
      `needs ${need} pages, has ${pool.freePages} free + ${pool.evictablePages} evictable`,
    );
  }
  const reservations = new Map(s.reservations);
  const reservation: Reservation = {
    requestId: offer.requestId,
    attempt: offer.attempt,
    pages: need as PageCount,
  };
  reservations.set(offer.requestId, reservation);
  const fenced = held ? withFence(s.fenced, offer.requestId, held.attempt, limits.fenceMemory) : s.fenced;
  return {
    state: {
      epoch: s.epoch,
      reservations,
      reservedPages: s.reservedPages - (held?.pages ?? 0) + need,
      fenced,
    },
    decision: {
      type: "accept",
      msg: {
        requestId: offer.requestId,
        attempt: offer.attempt,
        workerId: limits.workerId,
        epoch: s.epoch,
        reservedPages: need as PageCount,
      },
    },
    superseded: held ?? null,
  };
}

function release(s: AdmissionState, id: RequestId): AdmissionState {
  const held = s.reservations.get(id)!;
  const reservations = new Map(s.reservations);
  reservations.delete(id);
  return { ...s, reservations, reservedPages: s.reservedPages - held.pages };
}

/**
 * A cancel fences its attempt and every older one; it releases the
 * reservation only if it names the held attempt or a newer one (an old
 * cancel never stops newer work).
 */
export function cancel(
  s: AdmissionState,
  msg: Cancel,
  limits: AdmissionLimits,
): { state: AdmissionState; released: Reservation | null } {
  const fenced = withFence(s.fenced, msg.requestId, msg.attempt, limits.fenceMemory);
  const held = s.reservations.get(msg.requestId);
  if (!held || held.attempt > msg.attempt) return { state: { ...s, fenced }, released: null };
  return { state: { ...release(s, msg.requestId), fenced }, released: held };
}

/**
 * The attempt's work quiesced (completed or failed locally): its reservation
 * goes, and the attempt is fenced so a duplicated offer of it is not run twice.
 */
export function complete(
  s: AdmissionState,
  requestId: RequestId,
  attempt: number,
  limits: AdmissionLimits,
): { state: AdmissionState; released: Reservation | null } {
  const held = s.reservations.get(requestId);
  if (!held || held.attempt !== attempt) return { state: s, released: null };
  const fenced = withFence(s.fenced, requestId, attempt, limits.fenceMemory);
  return { state: { ...release(s, requestId), fenced }, released: held };
}

/** Asserts the page accounting (TigerBeetle style): Σ reservations = reservedPages. */
export function checkAdmission(s: AdmissionState): void {
  let sum = 0;
  for (const r of s.reservations.values()) sum += r.pages;
  if (sum !== s.reservedPages)
    throw new Error(`admission: reservations sum ${sum} ≠ reservedPages ${s.reservedPages}`);
}
