import {
  type ContinuationId,
  type PageCount,
  type PageId,
  type PrefixHash,
  pagesFor,
  TokenCount,
} from "../../schema/ids.ts";
import type { ResidencyCosts } from "../residency/residency.ts";
import type { ExpectedUse } from "./page-pool.ts";
import { type PageCopy, PageInvariantError, type PageStates, type PageTicket } from "./page-state.ts";

/** An append in flight: rows are written by a step but not yet visible in the route. */
export interface PendingAppend {
  readonly tokens: number;
  /** The route's page table once the append commits (tail possibly replaced by its copy). */
  readonly table: readonly PageId[];
  /** Pages allocated for this append (the copy-on-write destination first, if any). */
  readonly fresh: readonly PageId[];
  /** How many of `fresh` came out of the route's reservation (returned on abort). */
  readonly fromReservation: number;
  readonly copy: PageCopy | null;
}

/** A restore in flight into pages appended after the route's current table. */
export interface PendingLoad {
  readonly tokens: number;
  /** Pages of the rows left released, before the loaded ones (dead for the window at the load's end). */
  readonly skip: number;
  /** How the route's resident pages dead once the load completes are released: kept cached with these costs, or freed. */
  readonly keep: ResidencyCosts | null;
  /** Pages of the load still held by it (a failed page leaves at once, freed). */
  pages: readonly PageId[];
  readonly sealed: readonly PrefixHash[];
  /** Pages whose transfer has neither completed nor failed. */
  readonly outstanding: Set<PageId>;
  failed: boolean;
}

/** A page-table entry whose page the route released: no attention reads it (windowDeadPages). */
export const NO_PAGE = -1 as PageId;

/**
 * Leading pages of a route of `tokens` rows dead under `window` (every layer
 * sliding, the widest window W): the next query, at position `tokens`, reads
 * rows ≥ tokens − W + 1, so page i is dead once (i + 1)·P ≤ tokens − W + 1.
 * The last page is never counted (appends write into it), so at most
 * tablePages − 1. Null window (some layer global): 0.
 */
export function windowDeadPages(
  tokens: number,
  window: number | null,
  P: number,
  tablePages: number,
): number {
  if (window === null) return 0;
  return Math.max(0, Math.min(tablePages - 1, Math.floor((tokens - window + 1) / P)));
}

/**
 * One continuation's claim on the pool. `pages` is its page table: page i
 * holds rows [i·P, (i+1)·P) of every layer (or of one layer group's layers,
 * a route per group: layer-groups.ts). With a window, its first `released`
 * entries are NO_PAGE: pages dead for the window, given back to the pool
 * (cached while findable).
 */
export interface Route {
  readonly id: ContinuationId;
  pages: PageId[];
  /** Leading entries of `pages` released outside the window (NO_PAGE). */
  released: number;
  /**
   * The window its pages are released outside (windowDeadPages): the
   * table's, or its layer group's (worker/pages/layer-groups.ts); null: none.
   */
  readonly window: number | null;
  tokens: number;
  readonly startPosition: number;
  /** Unallocated pages held for this route's future appends and loads. */
  reserved: number;
  pins: number;
  leases: number;
  /** Cancelled: no new work; released once accepted work quiesces. */
  fenced: boolean;
  /** For a release that waits on work in flight: keep its sealed pages cached, priced with these costs. */
  keep: ResidencyCosts | null;
  pending: PendingAppend | null;
  load: PendingLoad | null;
}

/** A route idle and unfenced, holding `pages` (already referenced) and `reserved` pages of reservation. */
export function newRoute(
  id: ContinuationId,
  pages: PageId[],
  tokens: number,
  startPosition: number,
  reserved: number,
  window: number | null,
): Route {
  return {
    id,
    pages,
    released: 0,
    window,
    tokens,
    startPosition,
    reserved,
    pins: 0,
    leases: 0,
    fenced: false,
    keep: null,
    pending: null,
    load: null,
  };
}

export interface RouteSnapshot {
  readonly id: ContinuationId;
  /** The window outside which its pages are released (null: none). */
  readonly window: number | null;
  /** The page table; the first `releasedPages` entries are NO_PAGE. */
  readonly pages: readonly PageId[];
  readonly releasedPages: PageCount;
  readonly tokens: TokenCount;
  readonly startPosition: TokenCount;
  readonly reservedPages: PageCount;
  readonly pinned: boolean;
  readonly leased: boolean;
  /** An append is written but not committed. */
  readonly dirty: boolean;
  readonly loading: boolean;
  readonly fenced: boolean;
}

export type Waiting = "lease" | "append" | "load" | "pin";

/** What keeps a route from being released now. */
export function waitingFor(r: Route): Waiting[] {
  const w: Waiting[] = [];
  if (r.leases > 0) w.push("lease");
  if (r.pending) w.push("append");
  if (r.load) w.push("load");
  if (r.pins > 0) w.push("pin");
  return w;
}

export function snapshotOf(r: Route): RouteSnapshot {
  return {
    id: r.id,
    window: r.window,
    pages: [...r.pages],
    releasedPages: r.released as PageCount,
    tokens: TokenCount(r.tokens),
    startPosition: TokenCount(r.startPosition),
    reservedPages: r.reserved as PageCount,
    pinned: r.pins > 0,
    leased: r.leases > 0,
    dirty: r.pending !== null,
    loading: r.load !== null,
    fenced: r.fenced,
  };
}

/**
 * Checks what is the routes' alone (tables match rows, sealed pages are
 * exactly the full ones, leases agree) and returns what the pool must hold
 * for them: references, readers and loading owners per page, and the sum of
 * reservations. Throws PageInvariantError naming the first broken invariant.
 */
export function expectedUse(
  routes: Iterable<Route>,
  leases: Iterable<readonly ContinuationId[]>,
  captures: Iterable<readonly PageTicket[]>,
  states: PageStates,
  pageTokens: number,
): ExpectedUse & { readonly reserved: number } {
  const fail = (msg: string): never => {
    throw new PageInvariantError(msg);
  };
  const P = pageTokens;
  const refs = new Array<number>(states.size).fill(0);
  const readers = new Array<number>(states.size).fill(0);
  const loading = new Map<PageId, ContinuationId>();
  let reserved = 0;
  const leaseCount = new Map<ContinuationId, number>();
  for (const ids of leases) for (const id of ids) leaseCount.set(id, (leaseCount.get(id) ?? 0) + 1);
  for (const r of routes) {
    reserved += r.reserved;
    if (r.reserved < 0 || r.pins < 0) fail(`route ${r.id}: negative reservation or pins`);
    if (r.fenced && r.reserved !== 0) fail(`route ${r.id}: fenced but holds a reservation`);
    if (r.leases !== (leaseCount.get(r.id) ?? 0))
      fail(`route ${r.id}: lease count ${r.leases} disagrees with leases`);
    if (r.pages.length !== pagesFor(r.tokens as TokenCount, P))
      fail(`route ${r.id}: ${r.pages.length} pages for ${r.tokens} rows`);
    // Released entries lead the table, and only pages dead for the window are released.
    if (r.released > windowDeadPages(r.tokens, r.window, P, r.pages.length))
      fail(
        `route ${r.id}: ${r.released} pages released, only ${windowDeadPages(r.tokens, r.window, P, r.pages.length)} dead`,
      );
    for (let i = 0; i < r.pages.length; i++)
      if ((r.pages[i] === NO_PAGE) !== i < r.released)
        fail(`route ${r.id}: entry ${i} is ${r.pages[i]} with ${r.released} released`);
    const held = r.pages.slice(r.released);
    if (new Set(held).size !== held.length) fail(`route ${r.id}: a page appears twice in its table`);
    for (const p of held) refs[p]!++;
    if (r.pending) for (const p of r.pending.fresh) refs[p]!++;
    if (r.load) {
      for (const p of r.load.pages) {
        const kind = states.kind(p);
        if (kind === "loading") {
          if (!r.load.outstanding.has(p)) fail(`page ${p} is loading but not outstanding`);
          loading.set(p, r.id);
        } else if (kind === "resident") refs[p]!++;
      }
    }
    // Sealed pages are exactly the full ones, each with the row count it closes.
    for (let i = r.released; i < r.pages.length; i++) {
      const page = r.pages[i]!;
      const kind = states.kind(page);
      if (kind !== "resident") fail(`route ${r.id}: page ${page} is ${kind}`);
      const full = (i + 1) * P <= r.tokens;
      const id = states.identity(page);
      if (full !== (id !== null)) fail(`route ${r.id}: page ${page} full=${full} sealed=${id !== null}`);
      if (id && id.tokens !== (i + 1) * P) fail(`route ${r.id}: page ${i} sealed at ${id.tokens} rows`);
    }
  }
  for (const tickets of captures) for (const t of tickets) readers[t.page]!++;
  return { refs, readers, loading, reserved };
}
