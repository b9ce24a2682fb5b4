import {
  type ContinuationId,
  type PageCount,
  type PageId,
  type PrefixHash,
  pagesFor,
  TokenCount,
} from "../../schema/ids.ts";
import type { ResidencyCosts } from "../residency/residency.ts";
import { PagePool } from "./page-pool.ts";
import {
  type CaptureId,
  type LeaseId,
  type PageCopy,
  PageError,
  PageInvariantError,
  type PageTicket,
} from "./page-state.ts";
import {
  expectedUse,
  NO_PAGE,
  newRoute,
  type Route,
  type RouteSnapshot,
  snapshotOf,
  type Waiting,
  waitingFor,
  windowDeadPages,
} from "./route.ts";

function checkedWindow(window: number | null): number | null {
  if (window !== null && (!Number.isSafeInteger(window) || window < 1))
    throw new PageError("invalid", `window must be a positive integer or null, got ${window}`);
  return window;
}

export interface PageManagerOptions {
  /** Tokens (rows) per page. */
  readonly pageTokens: number;
  /** Physical pages on the device: page ids are [0, physicalPages). */
  readonly physicalPages: number;
  /** Run checkInvariants() after every mutation (tests, debug builds). */
  readonly debugInvariants?: boolean;
  /**
   * The widest window when every layer is sliding (layout.ts releaseWindow):
   * each commit releases a route's leading pages dead for it. Absent or null
   * (some layer is global): nothing is released.
   */
  readonly window?: number | null;
}

/** What the engine executes for one append: copy first, then write each row into its slot. */
export interface AppendPlan {
  readonly route: ContinuationId;
  /** Row index (relative to the route's start) of the first appended row. */
  readonly firstRow: TokenCount;
  readonly tokens: TokenCount;
  /** slot = page × pageTokens + offset, one per appended row. */
  readonly slots: readonly number[];
  readonly copies: readonly PageCopy[];
  /** The page table attention reads once these rows are written. */
  readonly pageTable: readonly PageId[];
}

export interface CancelOutcome {
  readonly released: boolean;
  /** Why release waits: in-flight leases, a pending append, a load, or pins. */
  readonly waitingFor: readonly Waiting[];
}

/** How a released route's sealed pages leave it: kept cached, or forgotten. */
export interface ReleaseOptions {
  /** Keep the route's sealed pages findable, evicted lazily by residency value priced with these costs. */
  readonly cache?: ResidencyCosts;
}

/**
 * The route table over one page pool: per-continuation page tables,
 * reservations, pins, leases, appends with copy-on-write of a shared partial
 * tail, and release (keeping sealed pages cached, or not). PageManager adds
 * the transfers (restore loads, checkpoint captures) and the views.
 *
 * Every public operation validates completely before it mutates, so a thrown
 * PageError leaves the state exactly as it was; each is O(pages it touches).
 */
export class RouteTable {
  readonly pageTokens: number;
  readonly physicalPages: number;
  private readonly debug: boolean;
  private readonly window: number | null;
  protected readonly pool: PagePool;
  protected readonly routes = new Map<ContinuationId, Route>();
  /** Lease → the routes one in-flight step holds. */
  private readonly leases = new Map<LeaseId, readonly ContinuationId[]>();
  /** Capture → the pages one checkpoint download reads. */
  protected readonly captures = new Map<CaptureId, readonly PageTicket[]>();
  private nextLease = 1;
  protected nextCapture = 1;
  /** Page-table entries released outside the window, since the table was made. */
  windowReleases = 0;

  constructor(options: PageManagerOptions) {
    const { pageTokens, physicalPages } = options;
    if (!Number.isSafeInteger(pageTokens) || pageTokens < 1)
      throw new PageError("invalid", `pageTokens must be a positive integer, got ${pageTokens}`);
    if (!Number.isSafeInteger(physicalPages) || physicalPages < 1 || physicalPages > 2 ** 31 - 1)
      throw new PageError("invalid", `physicalPages must be an integer in [1, 2^31), got ${physicalPages}`);
    this.pageTokens = pageTokens;
    this.physicalPages = physicalPages;
    this.debug = options.debugInvariants ?? false;
    this.window = checkedWindow(options.window ?? null);
    this.pool = new PagePool(physicalPages, pageTokens);
  }

  // ---- queries ----------------------------------------------------------

  /** Free or evictable pages not promised to any reservation. */
  get availablePages(): number {
    return this.pool.available;
  }

  hasRoute(id: ContinuationId): boolean {
    return this.routes.has(id);
  }

  route(id: ContinuationId): RouteSnapshot {
    return snapshotOf(this.getRoute(id));
  }

  /** Leading hashes of `prefix` whose pages are resident or cached: the longest exact cache hit. */
  matchPrefix(prefix: readonly PrefixHash[]): number {
    return this.pool.match(prefix);
  }

  /**
   * Pages a route needs reserved to grow to `totalTokens` rows: the pages it
   * lacks (its resident pages are credited) plus one for a copy-on-write of a
   * shared partial tail.
   */
  reservationNeed(id: ContinuationId, totalTokens: TokenCount): PageCount {
    return this.needFor(this.getRoute(id), totalTokens) as PageCount;
  }

  // ---- routes -----------------------------------------------------------

  /**
   * Create a route. `prefix` names sealed resident or cached pages to share
   * (refcount++), from the route's first row; `reserveTokens` reserves
   * capacity for the route's whole life (prompt + max generation).
   */
  openRoute(
    id: ContinuationId,
    options: {
      readonly startPosition?: TokenCount;
      readonly prefix?: readonly PrefixHash[];
      readonly reserveTokens?: TokenCount;
      /** The route's own release window (a layer group's, layer-groups.ts); default the table's. */
      readonly window?: number | null;
      /**
       * Leading pages of `prefix` left released, not shared: at most those
       * dead for the window at the prefix's end (a sliding group needs only
       * the pages its window reaches, so the earlier ones need not be held).
       */
      readonly released?: number;
    } = {},
  ): RouteSnapshot {
    if (this.routes.has(id)) throw new PageError("route-exists", `route ${id} already exists`);
    const window = options.window === undefined ? this.window : checkedWindow(options.window);
    const prefix = options.prefix ?? [];
    const startPosition = options.startPosition ?? 0;
    if (!Number.isSafeInteger(startPosition) || startPosition < 0)
      throw new PageError("invalid", `route ${id}: startPosition must be a non-negative integer`);
    const P = this.pageTokens;
    const released = options.released ?? 0;
    const dead = windowDeadPages(prefix.length * P, window, P, prefix.length);
    if (!Number.isSafeInteger(released) || released < 0 || released > dead)
      throw new PageError(
        "invalid",
        `route ${id}: ${released} prefix pages left released; at most the ${dead} dead for window ${window}`,
      );
    let matched = released;
    while (matched < prefix.length && this.pool.lookup(prefix[matched]!, (matched + 1) * P) !== undefined)
      matched++;
    if (matched < prefix.length)
      throw new PageError(
        "unknown-prefix",
        `route ${id}: prefix page ${matched} (${prefix[matched]}) is not resident; match first`,
      );
    const pages = this.lookupAll(prefix, released, prefix.length);
    const tokens = prefix.length * P;
    const reserveTokens = options.reserveTokens ?? tokens;
    this.checkTokens(id, "reserveTokens", reserveTokens);
    // Adopted pages are full, so no copy-on-write page is needed.
    const need = Math.max(0, pagesFor(reserveTokens as TokenCount, P) - prefix.length);
    const taken = this.pool.evictableAmong(pages);
    if (need + taken > this.availablePages)
      throw new PageError(
        "over-capacity",
        `route ${id}: reserving ${need} pages and adopting ${taken} cached ones, only ${this.availablePages} available`,
      );
    this.pool.tick();
    for (const p of pages) this.pool.reference(p, true);
    const table = [...Array.from({ length: released }, () => NO_PAGE), ...pages];
    const route = newRoute(id, table, tokens, startPosition, need, window);
    route.released = released;
    this.pool.reserved += need;
    this.routes.set(route.id, route);
    this.afterMutation();
    return snapshotOf(route);
  }

  /** Set the route's reservation to cover growth to `totalTokens` rows. May shrink it. */
  reserve(id: ContinuationId, totalTokens: TokenCount): PageCount {
    const r = this.getRoute(id);
    this.checkAcceptsWork(r);
    this.checkTokens(id, "totalTokens", totalTokens);
    if (r.pending || r.load)
      throw new PageError("busy", `route ${id}: cannot re-reserve during an append or load`);
    const need = this.needFor(r, totalTokens);
    const delta = need - r.reserved;
    if (delta > this.availablePages)
      throw new PageError(
        "over-capacity",
        `route ${id}: needs ${delta} more pages, only ${this.availablePages} available`,
      );
    r.reserved = need;
    this.pool.reserved += delta;
    this.afterMutation();
    return need as PageCount;
  }

  /**
   * `dst` shares every page of `src` (refcount++). If the shared tail is
   * partial and `src` holds a reservation (it will append), `src` reserves one
   * more page for its possible copy-on-write.
   */
  fork(
    src: ContinuationId,
    dst: ContinuationId,
    options: { readonly reserveTokens?: TokenCount } = {},
  ): RouteSnapshot {
    const s = this.getRoute(src);
    this.checkAcceptsWork(s);
    if (s.pending || s.load)
      throw new PageError("busy", `route ${src}: cannot fork during an append or load`);
    if (this.routes.has(dst)) throw new PageError("route-exists", `route ${dst} already exists`);
    const partial = s.tokens % this.pageTokens !== 0;
    const srcExtra = partial && s.reserved > 0 && !this.tailShared(s) ? 1 : 0;
    const reserveTokens = options.reserveTokens ?? s.tokens;
    this.checkTokens(dst, "reserveTokens", reserveTokens);
    const dstNeed =
      Math.max(0, pagesFor(reserveTokens as TokenCount, this.pageTokens) - s.pages.length) +
      (partial && reserveTokens > s.tokens ? 1 : 0);
    if (srcExtra + dstNeed > this.availablePages)
      throw new PageError(
        "over-capacity",
        `fork ${src} → ${dst}: needs ${srcExtra + dstNeed} pages, only ${this.availablePages} available`,
      );
    for (const p of s.pages.slice(s.released)) this.pool.reference(p, false);
    s.reserved += srcExtra;
    const route = newRoute(dst, [...s.pages], s.tokens, s.startPosition, dstNeed, s.window);
    route.released = s.released;
    this.pool.reserved += srcExtra + dstNeed;
    this.routes.set(route.id, route);
    this.afterMutation();
    return snapshotOf(route);
  }

  /**
   * Release an idle route now: its references drop, its reservation returns.
   * Returns the pages no route references any more (free, or cached when kept).
   */
  releaseRoute(id: ContinuationId, options: ReleaseOptions = {}): readonly PageId[] {
    const r = this.getRoute(id);
    const waiting = waitingFor(r);
    if (waiting.length > 0)
      throw new PageError("busy", `route ${id}: cannot release while ${waiting.join(", ")}`);
    const freed = this.dropRoute(r, options.cache ?? null);
    this.afterMutation();
    return freed;
  }

  /**
   * Fence the route at once (no new work) and return its unallocated
   * reservation; its pages are released now if nothing is in flight, else when
   * the last lease, append, load or pin ends (kept cached per `options` then too).
   */
  cancelRoute(id: ContinuationId, options: ReleaseOptions = {}): CancelOutcome {
    const r = this.getRoute(id);
    r.fenced = true;
    r.keep = options.cache ?? null;
    this.pool.reserved -= r.reserved;
    r.reserved = 0;
    const waiting = waitingFor(r);
    if (waiting.length === 0) this.dropRoute(r, r.keep);
    this.afterMutation();
    return { released: waiting.length === 0, waitingFor: waiting };
  }

  pin(id: ContinuationId): void {
    const r = this.getRoute(id);
    this.checkAcceptsWork(r);
    r.pins++;
    this.afterMutation();
  }

  /** Returns true when the unpin released a cancelled route. */
  unpin(id: ContinuationId): boolean {
    const r = this.getRoute(id);
    if (r.pins === 0) throw new PageError("invalid", `route ${id} is not pinned`);
    r.pins--;
    const released = this.releaseIfQuiesced(r);
    this.afterMutation();
    return released;
  }

  // ---- appends (compute writes rows) -------------------------------------

  /**
   * Allocate the slots for `tokens` more rows. A shared partial tail is copied
   * first (returned as a copy instruction) so no other route's rows change.
   * Nothing is visible until commitAppend.
   */
  beginAppend(id: ContinuationId, tokens: TokenCount): AppendPlan {
    const r = this.getRoute(id);
    this.checkAcceptsWork(r);
    if (r.pending) throw new PageError("busy", `route ${id}: an append is already pending`);
    if (r.load) throw new PageError("busy", `route ${id}: a load is in flight`);
    if (!Number.isSafeInteger(tokens) || tokens < 1)
      throw new PageError("invalid", `route ${id}: append of ${tokens} rows; must be a positive integer`);
    const P = this.pageTokens;
    const cow = r.tokens % P !== 0 && this.tailShared(r);
    const grow = pagesFor((r.tokens + tokens) as TokenCount, P) - r.pages.length;
    const allocations = grow + (cow ? 1 : 0);
    if (allocations > r.reserved + this.availablePages)
      throw new PageError(
        "over-capacity",
        `route ${id}: append needs ${allocations} pages, reservation ${r.reserved} + available ${this.availablePages}`,
      );
    const fromReservation = Math.min(allocations, r.reserved);
    const fresh: PageId[] = [];
    for (let i = 0; i < allocations; i++) fresh.push(this.allocate(r, () => this.pool.allocate()));
    const table = [...r.pages];
    let copy: PageCopy | null = null;
    let next = 0;
    if (cow) {
      const src = table[table.length - 1]!;
      const dst = fresh[next++]!;
      table[table.length - 1] = dst;
      copy = { src, dst };
    }
    while (next < fresh.length) table.push(fresh[next++]!);
    r.pending = { tokens, table, fresh, fromReservation, copy };
    const slots: number[] = [];
    for (let row = r.tokens; row < r.tokens + tokens; row++) {
      slots.push(table[Math.floor(row / P)]! * P + (row % P));
    }
    this.afterMutation();
    return {
      route: id,
      firstRow: TokenCount(r.tokens),
      tokens,
      slots,
      copies: copy ? [copy] : [],
      pageTable: table,
    };
  }

  /**
   * Make the pending rows visible. `sealed` gives the prefix-chain hash of each
   * page this append filled, in order; a sealed page's identity never changes.
   * Then the route's pages dead for the window are released (kept cached per
   * `options`). Returns true when the commit released a cancelled route.
   */
  commitAppend(id: ContinuationId, sealed: readonly PrefixHash[], options: ReleaseOptions = {}): boolean {
    const r = this.getRoute(id);
    const p = r.pending;
    if (!p) throw new PageError("invalid", `route ${id}: no pending append to commit`);
    const P = this.pageTokens;
    const before = Math.floor(r.tokens / P);
    const after = Math.floor((r.tokens + p.tokens) / P);
    if (sealed.length !== after - before)
      throw new PageError(
        "invalid",
        `route ${id}: append fills ${after - before} pages but ${sealed.length} hashes were given`,
      );
    if (p.copy) this.pool.dereference(p.copy.src, null);
    r.pages = [...p.table];
    r.tokens += p.tokens;
    r.pending = null;
    for (let i = before; i < after; i++) this.pool.seal(r.pages[i]!, sealed[i - before]!, (i + 1) * P);
    this.releaseOutsideWindow(r, options.cache ?? null);
    const released = this.releaseIfQuiesced(r);
    this.afterMutation();
    return released;
  }

  /** Discard a pending append (the step failed): its pages free, its reservation returns. */
  abortAppend(id: ContinuationId): boolean {
    const r = this.getRoute(id);
    const p = r.pending;
    if (!p) throw new PageError("invalid", `route ${id}: no pending append to abort`);
    r.pending = null;
    for (const page of p.fresh) this.pool.dereference(page, null);
    if (!r.fenced) {
      r.reserved += p.fromReservation;
      this.pool.reserved += p.fromReservation;
    }
    const released = this.releaseIfQuiesced(r);
    this.afterMutation();
    return released;
  }

  // ---- leases (a batch step in flight) -----------------------------------

  /** Hold routes for one in-flight step: they cannot be released until the lease ends. */
  acquireLease(ids: readonly ContinuationId[]): LeaseId {
    if (ids.length === 0) throw new PageError("invalid", "a lease needs at least one route");
    if (new Set(ids).size !== ids.length) throw new PageError("invalid", "a lease names each route once");
    const routes = ids.map((id) => this.getRoute(id));
    for (const r of routes) {
      this.checkAcceptsWork(r);
      if (r.load) throw new PageError("busy", `route ${r.id}: a load is in flight`);
    }
    for (const r of routes) r.leases++;
    const lease = this.nextLease++ as LeaseId;
    this.leases.set(lease, [...ids]);
    this.afterMutation();
    return lease;
  }

  /** End a lease; returns the cancelled routes whose release it completed. */
  releaseLease(lease: LeaseId): readonly ContinuationId[] {
    const ids = this.leases.get(lease);
    if (!ids) throw new PageError("unknown-lease", `lease ${lease} is not held`);
    this.leases.delete(lease);
    const released: ContinuationId[] = [];
    for (const id of ids) {
      const r = this.getRoute(id);
      r.leases--;
      if (this.releaseIfQuiesced(r)) released.push(id);
    }
    this.afterMutation();
    return released;
  }

  // ---- invariants -----------------------------------------------------------

  /** Throws PageInvariantError naming the first broken invariant. */
  checkInvariants(): void {
    const P = this.pageTokens;
    const expected = expectedUse(
      this.routes.values(),
      this.leases.values(),
      this.captures.values(),
      this.pool.states,
      P,
    );
    if (expected.reserved !== this.pool.reserved)
      throw new PageInvariantError(
        `reservations ${this.pool.reserved} ≠ sum over routes ${expected.reserved}`,
      );
    this.pool.checkInvariants(expected);
  }

  // ---- internals ----------------------------------------------------------

  protected getRoute(id: ContinuationId): Route {
    const r = this.routes.get(id);
    if (!r) throw new PageError("unknown-route", `route ${id} does not exist`);
    return r;
  }

  protected afterMutation(): void {
    if (this.debug) this.checkInvariants();
  }

  private checkTokens(id: ContinuationId, what: string, n: number): void {
    if (!Number.isSafeInteger(n) || n < 0)
      throw new PageError("invalid", `route ${id}: ${what} must be a non-negative integer, got ${n}`);
  }

  protected checkAcceptsWork(r: Route): void {
    if (r.fenced) throw new PageError("fenced", `route ${r.id} is cancelled; no new work is accepted`);
  }

  /** The pages sealed with prefix[from, to) (each matched: the caller checked). */
  protected lookupAll(prefix: readonly PrefixHash[], from: number, to: number): PageId[] {
    const pages: PageId[] = [];
    for (let i = from; i < to; i++) pages.push(this.pool.lookup(prefix[i]!, (i + 1) * this.pageTokens)!);
    return pages;
  }

  private tailShared(r: Route): boolean {
    const tail = r.pages[r.pages.length - 1];
    return tail !== undefined && this.pool.states.refcount(tail) > 1;
  }

  private needFor(r: Route, totalTokens: number): number {
    const lacking = Math.max(0, pagesFor(totalTokens as TokenCount, this.pageTokens) - r.pages.length);
    const cow = r.tokens % this.pageTokens !== 0 && totalTokens > r.tokens && this.tailShared(r) ? 1 : 0;
    return lacking + cow;
  }

  protected releaseIfQuiesced(r: Route): boolean {
    if (!r.fenced || waitingFor(r).length > 0 || !this.routes.has(r.id)) return false;
    this.dropRoute(r, r.keep);
    return true;
  }

  /** Take one page for `r`, from its reservation when it has one. Caller checked capacity. */
  protected allocate(r: Route, take: () => PageId): PageId {
    if (r.reserved > 0) {
      r.reserved--;
      this.pool.reserved--;
    } else if (this.availablePages < 1)
      throw new PageInvariantError(`allocation for ${r.id} without capacity`);
    return take();
  }

  /**
   * Releases the route's leading pages dead for the window (windowDeadPages):
   * O(pages released). Their rows are sealed, so one left unreferenced is
   * kept cached with `keep` (still findable for a prefix hit) or freed.
   */
  protected releaseOutsideWindow(r: Route, keep: ResidencyCosts | null): void {
    const dead = windowDeadPages(r.tokens, r.window, this.pageTokens, r.pages.length);
    if (dead <= r.released) return;
    this.pool.tick();
    for (let i = r.released; i < dead; i++) {
      // (A load's skipped entries hold no page.)
      if (r.pages[i] !== NO_PAGE) this.pool.dereference(r.pages[i]!, keep);
      r.pages[i] = NO_PAGE;
    }
    this.windowReleases += dead - r.released;
    r.released = dead;
  }

  /** Drops the route: O(its pages). Returns the pages it left unreferenced (free or cached). */
  private dropRoute(r: Route, keep: ResidencyCosts | null): PageId[] {
    this.pool.reserved -= r.reserved;
    r.reserved = 0;
    this.routes.delete(r.id);
    this.pool.tick();
    const freed: PageId[] = [];
    for (const p of r.pages.slice(r.released)) {
      const kind = this.pool.dereference(p, keep);
      if (kind === "free" || kind === "cached") freed.push(p);
    }
    return freed;
  }
}
