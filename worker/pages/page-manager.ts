import {
  type ContinuationId,
  type PageCount,
  type PageId,
  type PrefixHash,
  pagesFor,
  type TokenCount,
} from "../../schema/ids.ts";
import type { ResidencyCosts } from "../residency/residency.ts";
import type { PrefixBoundary } from "./page-pool.ts";
import { type CaptureId, PageError, type PageState, type PageTicket } from "./page-state.ts";
import { NO_PAGE, type Route, type RouteSnapshot, snapshotOf, windowDeadPages } from "./route.ts";
import { RouteTable } from "./route-table.ts";

export type { PrefixBoundary } from "./page-pool.ts";
export type { RouteSnapshot } from "./route.ts";
export type { AppendPlan, CancelOutcome, PageManagerOptions, ReleaseOptions } from "./route-table.ts";

export interface LoadTicket extends PageTicket {
  readonly route: ContinuationId;
}

/** Outcome of a transfer completion: stale events are reported, never applied. */
export type TransferOutcome =
  | {
      readonly applied: true;
      readonly route: ContinuationId;
      readonly routeReady: boolean;
      readonly released: boolean;
    }
  | { readonly applied: false; readonly reason: "stale-generation" | "not-loading" };

/** An immutable view for tests and debugging; O(pool). */
export interface PagePoolSnapshot {
  readonly pageTokens: number;
  readonly physicalPages: number;
  /** Pages holding nothing. */
  readonly freePages: PageCount;
  /** Cached pages: sealed, unreferenced, findable until evicted. */
  readonly cachedPages: PageCount;
  /** Cached pages an allocation may evict now (those no capture reads). */
  readonly evictablePages: PageCount;
  /** Free or evictable pages promised to routes' reservations. */
  readonly reservedPages: PageCount;
  readonly residentPages: PageCount;
  readonly loadingPages: PageCount;
  readonly evictingPages: PageCount;
  /** refcounts[page] for every page id (0 unless resident). */
  readonly refcounts: readonly number[];
  /** readers[page]: captures reading the page; a released, unkept page with readers waits in `evicting`. */
  readonly readers: readonly number[];
  readonly routes: readonly RouteSnapshot[];
  /** Sealed, indexed prefixes (resident or cached), by token count then hash. */
  readonly prefixes: readonly PrefixBoundary[];
}

/**
 * The one owner of a device's physical pages: the pool (page states, free
 * and cached pages in eviction order, the prefix index), the route table
 * (RouteTable: page tables, reservations, leases, copy-on-write tails), the
 * in-flight adoption of pages another route sealed, and the transfers that
 * move page bytes beside compute: restore loads and checkpoint captures.
 * Policy lives here (which page, refcounts, generations); the engine owns
 * the bytes and executes the copies, slots and transfers this class hands
 * out.
 *
 * Every public operation validates completely before it mutates, so a thrown
 * PageError leaves the manager exactly as it was; each is O(pages it touches).
 */
export class PageManager extends RouteTable {
  // ---- queries ----------------------------------------------------------

  pageState(page: PageId): PageState {
    return this.pool.states.view(this.checkPageId(page));
  }

  /** Pages holding nothing (some may be promised to reservations). */
  get freePages(): number {
    return this.pool.freePages;
  }

  /** Cached pages an allocation may evict (counted in availablePages). */
  get evictablePages(): number {
    return this.pool.evictablePages;
  }

  /** Cached pages evicted for reuse since the manager was made. */
  get evictions(): number {
    return this.pool.evictions;
  }

  /** Page slots visited by the pool's operations so far: a cost counter for complexity tests. */
  get work(): number {
    return this.pool.work;
  }

  /**
   * The longest hit of `prefix`, and how many of its pages are evictable
   * cached pages: adopting those takes them out of capacity, so admitting a
   * route on this prefix costs its reservation plus that many.
   */
  prefixHit(prefix: readonly PrefixHash[]): { readonly pages: number; readonly evictable: number } {
    const pages = this.pool.match(prefix);
    return { pages, evictable: this.pool.evictableAmong(this.lookupAll(prefix, 0, pages)) };
  }

  /** Evictable cached pages among those sealed with prefix[from, prefix.length) (every one held: matched first). */
  evictableIn(prefix: readonly PrefixHash[], from: number): number {
    return this.pool.evictableAmong(this.lookupAll(prefix, from, prefix.length));
  }

  /** A resident or cached page is sealed with `hash` at `tokens` rows (a cheap one-page match). */
  hasSealed(hash: PrefixHash, tokens: number): boolean {
    return this.pool.lookup(hash, tokens) !== undefined;
  }

  /** Some resident or cached page holds the prefix `hash` (any length). */
  holdsPrefix(hash: PrefixHash): boolean {
    return this.pool.holds(hash);
  }

  /** Times the page sealed with `hash` at `tokens` rows was adopted by its hash (0 when not held). */
  hitsOf(hash: PrefixHash, tokens: number): number {
    const page = this.pool.lookup(hash, tokens);
    return page === undefined ? 0 : this.pool.hitsOf(page);
  }

  /** Pages only this route references: what its release gives back. */
  releasablePages(id: ContinuationId): PageCount {
    let n = 0;
    const r = this.getRoute(id);
    for (const p of r.pages.slice(r.released)) if (this.pool.states.refcount(p) === 1) n++;
    return n as PageCount;
  }

  /**
   * The pages of `prefix` (its page-hash chain) from page `from` on are in
   * published chunks: they are durable, so cheaper to lose, and are priced
   * again with `costs` if cached. The run ends at the first page no longer
   * held (`from` > 0: a sliding group's pages before its window are gone).
   * Returns the pages marked.
   */
  markDurable(prefix: readonly PrefixHash[], costs: ResidencyCosts, from = 0): number {
    let to = from;
    while (to < prefix.length && this.pool.lookup(prefix[to]!, (to + 1) * this.pageTokens) !== undefined)
      to++;
    const pages = this.lookupAll(prefix, from, to);
    for (const p of pages) this.pool.markDurable(p, costs);
    this.afterMutation();
    return pages.length;
  }

  // ---- in-flight adoption ---------------------------------------------

  /**
   * In-flight prefix sharing: extend the idle route, which ends at a page
   * boundary with `have` pages, to `to` pages of `prefix` (its own page-hash
   * chain, of which only entries [have − 1, to) are read) without computing
   * them. Pages [have + skip, to) are sealed pages another route holds or
   * the cache keeps, shared (refcount++); the `skip` before them are left
   * released (at most those dead for the window at `to`). The reservation
   * held the route's growth, so it shrinks by the `to − have` pages no longer
   * computed; then the route's own pages now dead for its window are released
   * (kept cached with `cache`). Refused, changing nothing, when a page is
   * not findable or the adoption does not fit (adoptionNeed > availablePages).
   */
  adoptPrefix(
    id: ContinuationId,
    prefix: readonly PrefixHash[],
    options: { readonly to: number; readonly skip?: number; readonly cache?: ResidencyCosts },
  ): void {
    const r = this.getRoute(id);
    const skip = options.skip ?? 0;
    const shared = this.adoptable(r, prefix, options.to, skip);
    if (shared === null)
      throw new PageError(
        "unknown-prefix",
        `route ${id}: prefix pages up to ${options.to} are not all findable`,
      );
    const need = this.adoptionCost(r, shared, options.to);
    if (need > this.availablePages)
      throw new PageError(
        "over-capacity",
        `route ${id}: adopting to ${options.to} pages takes ${need}, only ${this.availablePages} available`,
      );
    const giveBack = Math.min(r.reserved, options.to - r.pages.length);
    r.reserved -= giveBack;
    this.pool.reserved -= giveBack;
    this.pool.tick();
    for (const page of shared) this.pool.reference(page, true);
    for (let i = 0; i < skip; i++) r.pages.push(NO_PAGE);
    r.pages.push(...shared);
    r.tokens = options.to * this.pageTokens;
    this.releaseOutsideWindow(r, options.cache ?? null);
    this.afterMutation();
  }

  /**
   * Pages of capacity adoptPrefix(id, prefix, {to, skip}) takes from
   * availablePages (each evictable cached page it shares, less the
   * reservation it gives back; negative: it gives pages back), or null when a
   * page it would share is not findable. Validates as adoptPrefix does.
   */
  adoptionNeed(id: ContinuationId, prefix: readonly PrefixHash[], to: number, skip = 0): number | null {
    const r = this.getRoute(id);
    const shared = this.adoptable(r, prefix, to, skip);
    return shared === null ? null : this.adoptionCost(r, shared, to);
  }

  /** The pages adoptPrefix would share (null: one is not findable), after checking the route and the arguments. */
  private adoptable(r: Route, prefix: readonly PrefixHash[], to: number, skip: number): PageId[] | null {
    this.checkAcceptsWork(r);
    if (r.pending || r.load)
      throw new PageError("busy", `route ${r.id}: cannot adopt during an append or load`);
    const P = this.pageTokens;
    if (r.startPosition !== 0 || r.tokens % P !== 0)
      throw new PageError(
        "invalid",
        `route ${r.id}: adopts only from position 0 at a page boundary (start ${r.startPosition}, ${r.tokens} rows)`,
      );
    const have = r.pages.length;
    if (!Number.isSafeInteger(to) || to <= have || to > prefix.length)
      throw new PageError(
        "invalid",
        `route ${r.id}: adopts to ${to} pages; must exceed its ${have} and be at most the prefix's ${prefix.length}`,
      );
    const dead = windowDeadPages(to * P, r.window, P, to);
    if (!Number.isSafeInteger(skip) || skip < 0 || have + skip > Math.max(have, dead))
      throw new PageError(
        "invalid",
        `route ${r.id}: adopting to ${to} pages may leave ${Math.max(0, dead - have)} released (window ${r.window}), not ${skip}`,
      );
    if (have > 0 && this.pool.states.identity(r.pages[have - 1]!)?.hash !== prefix[have - 1])
      throw new PageError("invalid", `route ${r.id}: the prefix does not continue the route's ${have} pages`);
    const shared: PageId[] = [];
    for (let i = have + skip; i < to; i++) {
      const page = this.pool.lookup(prefix[i]!, (i + 1) * P);
      if (page === undefined) return null;
      shared.push(page);
    }
    return shared;
  }

  private adoptionCost(r: Route, shared: readonly PageId[], to: number): number {
    return this.pool.evictableAmong(shared) - Math.min(r.reserved, to - r.pages.length);
  }

  // ---- loads (restore transfers write pages) -----------------------------

  /**
   * Allocate pages after the route's (full) last page for `tokens` restored
   * rows; each page is loading until its transfer completes. `sealed` holds the
   * prefix hash of every full page of the rows. `skip`: the first pages of the
   * rows are not loaded but left released (NO_PAGE), allowed only for pages
   * dead for the route's window once it holds the rows (windowDeadPages), so a
   * sliding group's restore reads only what its window reaches; when the load
   * completes, the route's resident pages dead then are released too, kept
   * cached with `cache`. Tickets are for the loaded pages, in order.
   */
  beginLoad(
    id: ContinuationId,
    tokens: TokenCount,
    sealed: readonly PrefixHash[],
    options: { readonly skip?: number; readonly cache?: ResidencyCosts } = {},
  ): readonly LoadTicket[] {
    const r = this.getRoute(id);
    this.checkAcceptsWork(r);
    if (r.pending || r.load) throw new PageError("busy", `route ${id}: an append or load is in flight`);
    if (!Number.isSafeInteger(tokens) || tokens < 1)
      throw new PageError("invalid", `route ${id}: load of ${tokens} rows; must be a positive integer`);
    const P = this.pageTokens;
    if (r.tokens % P !== 0)
      throw new PageError(
        "invalid",
        `route ${id}: a load must start at a page boundary (route has ${r.tokens} rows)`,
      );
    if (sealed.length !== Math.floor(tokens / P))
      throw new PageError(
        "invalid",
        `route ${id}: load of ${tokens} rows fills ${Math.floor(tokens / P)} pages, got ${sealed.length} hashes`,
      );
    const skip = options.skip ?? 0;
    const end = r.tokens + tokens;
    const dead = windowDeadPages(end, r.window, P, pagesFor(end as TokenCount, P));
    if (!Number.isSafeInteger(skip) || skip < 0 || r.pages.length + skip > Math.max(r.pages.length, dead))
      throw new PageError(
        "invalid",
        `route ${id}: a load to ${end} rows may leave ${Math.max(0, dead - r.pages.length)} pages unloaded (window ${r.window}), not ${skip}`,
      );
    const count = pagesFor(tokens, P) - skip;
    if (count > r.reserved + this.availablePages)
      throw new PageError(
        "over-capacity",
        `route ${id}: load needs ${count} pages, reservation ${r.reserved} + available ${this.availablePages}`,
      );
    const pages: PageId[] = [];
    for (let i = 0; i < count; i++) pages.push(this.allocate(r, () => this.pool.allocateLoading(id)));
    r.load = {
      tokens,
      skip,
      keep: options.cache ?? null,
      pages,
      sealed: [...sealed],
      outstanding: new Set(pages),
      failed: false,
    };
    this.afterMutation();
    return pages.map((page) => ({ page, generation: this.pool.states.generation(page), route: id }));
  }

  /** A page's transfer finished. A ticket of an older generation is a reported no-op. */
  completeLoad(ticket: PageTicket): TransferOutcome {
    const stale = this.staleTicket(ticket);
    if (stale) return stale;
    const r = this.getRoute(this.pool.states.loadingRoute(ticket.page)!);
    this.pool.finishLoad(ticket.page);
    r.load!.outstanding.delete(ticket.page);
    return this.afterTransfer(r);
  }

  /** A page's transfer failed and will write nothing: the page frees and the whole load is abandoned. */
  failLoad(ticket: PageTicket): TransferOutcome {
    const stale = this.staleTicket(ticket);
    if (stale) return stale;
    const r = this.getRoute(this.pool.states.loadingRoute(ticket.page)!);
    this.pool.failLoad(ticket.page);
    const load = r.load!;
    load.outstanding.delete(ticket.page);
    load.pages = load.pages.filter((p) => p !== ticket.page);
    load.failed = true;
    return this.afterTransfer(r);
  }

  // ---- captures (checkpoint downloads read sealed pages) -----------------

  /**
   * Read `count` sealed pages of a route from page index `from`. The pages
   * cannot be reused until endCapture, even if the route is released meanwhile
   * (they wait in `evicting`, or stay cached but unevictable).
   */
  beginCapture(
    id: ContinuationId,
    from: number,
    count: number,
  ): { id: CaptureId; pages: readonly PageTicket[] } {
    const r = this.getRoute(id);
    const sealedPages = Math.floor(r.tokens / this.pageTokens);
    this.checkRange(`route ${id}`, from, count, sealedPages);
    if (from < r.released)
      throw new PageError(
        "invalid",
        `route ${id}: pages [${from}, ${r.released}) were released outside the window; capture them by prefix`,
      );
    return this.capture(r.pages.slice(from, from + count));
  }

  /**
   * Read pages [from, from + count) of the prefix whose page-hash chain is
   * `prefix`, wherever they are held (a route's, or cached). Refused with
   * "unknown-prefix" once any of them was evicted, and with "over-capacity"
   * when taking cached pages out of eviction would leave reservations uncovered.
   */
  beginCapturePrefix(
    prefix: readonly PrefixHash[],
    from: number,
    count: number,
  ): { id: CaptureId; pages: readonly PageTicket[] } {
    this.checkRange("prefix", from, count, prefix.length);
    const matched = this.pool.match(prefix.slice(0, from + count));
    if (matched < from + count)
      throw new PageError("unknown-prefix", `prefix page ${matched} (${prefix[matched]}) is no longer held`);
    const pages = this.lookupAll(prefix, from, from + count);
    const taken = this.pool.evictableAmong(pages);
    if (taken > this.availablePages)
      throw new PageError(
        "over-capacity",
        `capturing ${taken} cached pages, only ${this.availablePages} available beyond reservations`,
      );
    return this.capture(pages);
  }

  /** The capture's download finished (or failed): its pages may be reused. Returns pages it freed. */
  endCapture(capture: CaptureId): readonly PageId[] {
    const tickets = this.captures.get(capture);
    if (!tickets) throw new PageError("unknown-capture", `capture ${capture} is not in flight`);
    this.captures.delete(capture);
    const freed: PageId[] = [];
    for (const { page } of tickets) if (this.pool.dropReader(page) === "free") freed.push(page);
    this.afterMutation();
    return freed;
  }

  // ---- snapshot -------------------------------------------------------------

  snapshot(): PagePoolSnapshot {
    const states = this.pool.states;
    const counts = { free: 0, loading: 0, resident: 0, cached: 0, evicting: 0 };
    const refcounts: number[] = [];
    const readers: number[] = [];
    for (let p = 0; p < this.physicalPages; p++) {
      const page = p as PageId;
      const kind = states.kind(page);
      counts[kind]++;
      refcounts.push(kind === "resident" ? states.refcount(page) : 0);
      readers.push(kind === "free" || kind === "loading" ? 0 : states.readers(page));
    }
    const prefixes = [...this.pool.prefixes()].sort(
      (a, b) => a.tokens - b.tokens || (a.hash < b.hash ? -1 : a.hash > b.hash ? 1 : 0),
    );
    return {
      pageTokens: this.pageTokens,
      physicalPages: this.physicalPages,
      freePages: counts.free as PageCount,
      cachedPages: counts.cached as PageCount,
      evictablePages: this.pool.evictablePages as PageCount,
      reservedPages: this.pool.reserved as PageCount,
      residentPages: counts.resident as PageCount,
      loadingPages: counts.loading as PageCount,
      evictingPages: counts.evicting as PageCount,
      refcounts,
      readers,
      routes: [...this.routes.values()]
        .map(snapshotOf)
        .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)),
      prefixes,
    };
  }

  // ---- internals ----------------------------------------------------------

  private checkPageId(page: PageId): PageId {
    if (!Number.isSafeInteger(page) || page < 0 || page >= this.physicalPages)
      throw new PageError("invalid", `page ${page} is outside [0, ${this.physicalPages})`);
    return page;
  }

  private checkRange(what: string, from: number, count: number, sealedPages: number): void {
    if (
      !Number.isSafeInteger(from) ||
      !Number.isSafeInteger(count) ||
      from < 0 ||
      count < 1 ||
      from + count > sealedPages
    )
      throw new PageError(
        "invalid",
        `${what}: capture of pages [${from}, ${from + count}) outside its ${sealedPages} sealed pages`,
      );
  }

  private capture(pages: readonly PageId[]): { id: CaptureId; pages: readonly PageTicket[] } {
    const tickets = pages.map((page) => ({ page, generation: this.pool.states.generation(page) }));
    for (const page of pages) this.pool.addReader(page);
    const id = this.nextCapture++ as CaptureId;
    this.captures.set(id, tickets);
    this.afterMutation();
    return { id, pages: tickets };
  }

  private staleTicket(ticket: PageTicket): TransferOutcome | null {
    const page = this.checkPageId(ticket.page);
    if (this.pool.states.generation(page) !== ticket.generation)
      return { applied: false, reason: "stale-generation" };
    if (this.pool.states.kind(page) !== "loading") return { applied: false, reason: "not-loading" };
    return null;
  }

  private afterTransfer(r: Route): TransferOutcome {
    const load = r.load!;
    let ready = false;
    if (load.outstanding.size === 0) {
      r.load = null;
      if (load.failed) {
        for (const p of load.pages)
          if (this.pool.states.kind(p) === "resident") this.pool.dereference(p, null);
      } else {
        const P = this.pageTokens;
        const first = r.pages.length;
        for (let i = 0; i < load.skip; i++) r.pages.push(NO_PAGE);
        r.pages.push(...load.pages);
        r.tokens += load.tokens;
        for (let i = load.skip; i < load.sealed.length; i++)
          this.pool.seal(load.pages[i - load.skip]!, load.sealed[i]!, (first + i + 1) * P);
        this.releaseOutsideWindow(r, load.keep);
        ready = true;
      }
    }
    const released = this.releaseIfQuiesced(r);
    this.afterMutation();
    return { applied: true, route: r.id, routeReady: ready && !released, released };
  }
}
