import type { ContinuationId, PageCount } from "../../schema/ids.ts";
import type { PageManager, PagePoolSnapshot, RouteSnapshot } from "../pages/page-manager.ts";

/**
 * Observed value inputs for one resident route, in milliseconds of device time
 * (calibrated costs) and a reuse probability in [0, 1].
 */
export interface RoutePolicy {
  readonly reuseProbability: number;
  /** Time to recompute the route's rows from scratch. */
  readonly recomputeMs: number;
  /** Time to reload it from its cheapest lower tier. */
  readonly reloadMs: number;
  readonly sharingBonus: number;
  readonly sloBonus: number;
}

export interface ResidencyInputs {
  /** Per-route policy; a route without one is worth zero (evicted first among eligible). */
  readonly policies: ReadonlyMap<ContinuationId, RoutePolicy>;
  /** Routes the scheduler is about to use this iteration; never evicted. */
  readonly protected: ReadonlySet<ContinuationId>;
  /**
   * Routes that may be evicted although not durable: prefix caches of
   * finished requests, which nobody is waiting on and which can be recomputed
   * from their tokens. A live continuation's route is never in this set.
   */
  readonly recomputable?: ReadonlySet<ContinuationId>;
}

export type Ineligible =
  | "not-durable"
  | "dirty"
  | "pinned"
  | "leased"
  | "loading"
  | "fenced"
  | "protected"
  | "gone";

export interface EvictionCandidate {
  readonly id: ContinuationId;
  /** Utility ms per page: value / max(1, pages). */
  readonly valuePerPage: number;
  readonly lastAccess: number;
}

export interface EvictionPlan {
  readonly pagesNeeded: PageCount;
  /** Free, unreserved pages before any eviction. */
  readonly availableBefore: PageCount;
  readonly admissible: boolean;
  /** Routes to evict, in order; empty when not admissible (evicting would not be enough). */
  readonly evict: readonly EvictionCandidate[];
  /** Pages the plan frees, with shared pages counted only once all their routes are gone. */
  readonly freesPages: PageCount;
  readonly shortfall: PageCount;
  readonly ineligible: readonly { readonly id: ContinuationId; readonly reason: Ineligible }[];
}

export interface EvictionReport {
  readonly evicted: readonly ContinuationId[];
  /** Planned routes whose state changed since planning, left alone. */
  readonly skipped: readonly { readonly id: ContinuationId; readonly reason: Ineligible }[];
  readonly freedPages: PageCount;
  readonly availableAfter: number;
}

const ZERO: RoutePolicy = { reuseProbability: 0, recomputeMs: 0, reloadMs: 0, sharingBonus: 0, sloBonus: 0 };

/**
 * value = reuse × max(0, recompute − reload) + sharing + SLO: the device time
 * keeping the route resident is expected to save over reloading it.
 */
export function routeValue(policy: RoutePolicy, id = "route"): number {
  for (const [k, v] of Object.entries(policy))
    if (!Number.isFinite(v) || v < 0)
      throw new RangeError(`${id}: policy ${k} must be a finite number ≥ 0, got ${v}`);
  if (policy.reuseProbability > 1)
    throw new RangeError(`${id}: reuse probability ${policy.reuseProbability} > 1`);
  return (
    policy.reuseProbability * Math.max(0, policy.recomputeMs - policy.reloadMs) +
    policy.sharingBonus +
    policy.sloBonus
  );
}

/** Why a route may not be evicted, or null when it may. Only idle, durable, unprotected routes may. */
export function ineligibility(r: RouteSnapshot, inputs: ResidencyInputs): Ineligible | null {
  if (inputs.protected.has(r.id)) return "protected";
  if (r.fenced) return "fenced";
  if (r.dirty) return "dirty";
  if (r.loading) return "loading";
  if (r.pinned) return "pinned";
  if (r.leased) return "leased";
  if (!r.durable && !inputs.recomputable?.has(r.id)) return "not-durable";
  return null;
}

/**
 * Plan evictions to make `pagesNeeded` pages available: eligible routes by
 * value per page, lowest first, oldest access on ties, then id. Shared
 * refcounts are simulated, so evicting one of two forks frees only the pages
 * it alone held; a page still read by a capture frees later and is not counted.
 */
export function planEviction(
  snapshot: PagePoolSnapshot,
  pagesNeeded: number,
  inputs: ResidencyInputs,
): EvictionPlan {
  if (!Number.isSafeInteger(pagesNeeded) || pagesNeeded < 0)
    throw new RangeError(`pagesNeeded must be a non-negative integer, got ${pagesNeeded}`);
  const available = snapshot.freePages - snapshot.reservedPages;
  const ineligible: { id: ContinuationId; reason: Ineligible }[] = [];
  const candidates: (EvictionCandidate & { pages: readonly number[] })[] = [];
  for (const r of snapshot.routes) {
    const reason = ineligibility(r, inputs);
    if (reason) {
      ineligible.push({ id: r.id, reason });
      continue;
    }
    const value = routeValue(inputs.policies.get(r.id) ?? ZERO, r.id);
    candidates.push({
      id: r.id,
      valuePerPage: value / Math.max(1, r.pages.length),
      lastAccess: r.lastAccess,
      pages: r.pages,
    });
  }
  candidates.sort(
    (a, b) =>
      a.valuePerPage - b.valuePerPage ||
      a.lastAccess - b.lastAccess ||
      (a.id < b.id ? -1 : a.id > b.id ? 1 : 0),
  );
  const left = [...snapshot.refcounts];
  let freed = 0;
  const evict: EvictionCandidate[] = [];
  for (const c of candidates) {
    if (available + freed >= pagesNeeded) break;
    for (const p of c.pages) if (--left[p]! === 0 && snapshot.readers[p] === 0) freed++;
    evict.push({ id: c.id, valuePerPage: c.valuePerPage, lastAccess: c.lastAccess });
  }
  const admissible = available + freed >= pagesNeeded;
  return {
    pagesNeeded: pagesNeeded as PageCount,
    availableBefore: Math.max(0, available) as PageCount,
    admissible,
    evict: admissible ? evict : [],
    freesPages: (admissible ? freed : 0) as PageCount,
    shortfall: Math.max(0, pagesNeeded - available - freed) as PageCount,
    ineligible,
  };
}

/**
 * Apply a plan to the live manager, revalidating each route first: one that
 * became leased, pinned, dirty, protected or was released since planning is
 * skipped and reported, never evicted.
 */
export function applyEviction(
  manager: PageManager,
  plan: EvictionPlan,
  inputs: ResidencyInputs,
): EvictionReport {
  const evicted: ContinuationId[] = [];
  const skipped: { id: ContinuationId; reason: Ineligible }[] = [];
  let freed = 0;
  for (const { id } of plan.evict) {
    if (!manager.hasRoute(id)) {
      skipped.push({ id, reason: "gone" });
      continue;
    }
    const reason = ineligibility(manager.route(id), inputs);
    if (reason) {
      skipped.push({ id, reason });
      continue;
    }
    freed += manager.releaseRoute(id).length;
    evicted.push(id);
  }
  return { evicted, skipped, freedPages: freed as PageCount, availableAfter: manager.availablePages };
}
