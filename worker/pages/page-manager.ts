import {
  type ContinuationId,
  Generation,
  type PageCount,
  type PageId,
  type PrefixHash,
  pagesFor,
  TokenCount,
} from "../../schema/ids.ts";
import {
  type CaptureId,
  type LeaseId,
  type PageCopy,
  PageError,
  type PageIdentity,
  PageInvariantError,
  type PageState,
  type PageTicket,
} from "./page-state.ts";

export interface PageManagerOptions {
  /** Tokens (rows) per page. */
  readonly pageTokens: number;
  /** Physical pages on the device: page ids are [0, physicalPages). */
  readonly physicalPages: number;
  /** Run checkInvariants() after every mutation (tests, debug builds). */
  readonly debugInvariants?: boolean;
}

/** An append in flight: rows are written by a step but not yet visible in the route. */
interface PendingAppend {
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
interface PendingLoad {
  readonly tokens: number;
  /** Pages of the load still held by it (a failed page leaves at once, freed). */
  pages: readonly PageId[];
  readonly sealed: readonly PrefixHash[];
  /** Pages whose transfer has neither completed nor failed. */
  readonly outstanding: Set<PageId>;
  failed: boolean;
}

interface Route {
  readonly id: ContinuationId;
  pages: PageId[];
  tokens: number;
  readonly startPosition: number;
  /** Unallocated pages held for this route's future appends and loads. */
  reserved: number;
  pins: number;
  leases: number;
  /** Cancelled: no new work; released once accepted work quiesces. */
  fenced: boolean;
  /** Published to the durable store and catalog; only durable routes are evictable. */
  durable: boolean;
  /** Logical time of last use, supplied by the caller (no clock here). */
  lastAccess: number;
  pending: PendingAppend | null;
  load: PendingLoad | null;
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

export interface CancelOutcome {
  readonly released: boolean;
  /** Why release waits: in-flight leases, a pending append, a load, or pins. */
  readonly waitingFor: readonly ("lease" | "append" | "load" | "pin")[];
}

export interface RouteSnapshot {
  readonly id: ContinuationId;
  readonly pages: readonly PageId[];
  readonly tokens: TokenCount;
  readonly startPosition: TokenCount;
  readonly reservedPages: PageCount;
  readonly durable: boolean;
  readonly pinned: boolean;
  readonly leased: boolean;
  /** An append is written but not committed. */
  readonly dirty: boolean;
  readonly loading: boolean;
  readonly fenced: boolean;
  readonly lastAccess: number;
}

export interface PrefixBoundary {
  readonly hash: PrefixHash;
  readonly tokens: TokenCount;
}

/** An immutable view for residency, admission and heartbeats. */
export interface PagePoolSnapshot {
  readonly pageTokens: number;
  readonly physicalPages: number;
  readonly freePages: PageCount;
  /** Free pages promised to routes' reservations. */
  readonly reservedPages: PageCount;
  readonly residentPages: PageCount;
  readonly loadingPages: PageCount;
  readonly evictingPages: PageCount;
  /** Pages that would become free if every idle, durable, unpinned route were released. */
  readonly evictablePages: PageCount;
  /** refcounts[page] for every page id (0 unless resident). */
  readonly refcounts: readonly number[];
  /** readers[page]: captures reading the page; a released page with readers waits in `evicting`. */
  readonly readers: readonly number[];
  readonly routes: readonly RouteSnapshot[];
  /** Sealed, indexed prefixes, by token count then hash. */
  readonly prefixes: readonly PrefixBoundary[];
}

/**
 * The one owner of a device's physical pages. Policy lives here (which page,
 * refcounts, generations); the engine owns the bytes and executes the copies,
 * slots and transfers this class hands out.
 *
 * Every public operation validates completely before it mutates, so a thrown
 * PageError leaves the manager exactly as it was.
 */
export class PageManager {
  readonly pageTokens: number;
  readonly physicalPages: number;
  private readonly debug: boolean;
  private readonly states: PageState[];
  /** Free page ids, a stack: the lowest id is handed out first. */
  private readonly free: PageId[];
  private readonly routes = new Map<ContinuationId, Route>();
  /** Prefix hash → the sealed resident page carrying it (vLLM's cached block map). */
  private readonly prefixIndex = new Map<PrefixHash, PageId>();
  private readonly leases = new Map<LeaseId, readonly ContinuationId[]>();
  private readonly captures = new Map<CaptureId, readonly PageTicket[]>();
  private reservedTotal = 0;
  private nextLease = 1;
  private nextCapture = 1;

  constructor(options: PageManagerOptions) {
    const { pageTokens, physicalPages } = options;
    if (!Number.isSafeInteger(pageTokens) || pageTokens < 1)
      throw new PageError("invalid", `pageTokens must be a positive integer, got ${pageTokens}`);
    if (!Number.isSafeInteger(physicalPages) || physicalPages < 1)
      throw new PageError("invalid", `physicalPages must be a positive integer, got ${physicalPages}`);
    this.pageTokens = pageTokens;
    this.physicalPages = physicalPages;
    this.debug = options.debugInvariants ?? false;
    this.states = Array.from({ length: physicalPages }, () => ({ kind: "free", generation: Generation(0) }));
    this.free = Array.from({ length: physicalPages }, (_, i) => (physicalPages - 1 - i) as PageId);
  }

  // ---- queries ----------------------------------------------------------

  pageState(page: PageId): PageState {
    return this.states[this.checkPageId(page)]!;
  }

  /** Free pages not promised to any reservation. */
  get availablePages(): number {
    return this.free.length - this.reservedTotal;
  }

  hasRoute(id: ContinuationId): boolean {
    return this.routes.has(id);
  }

  route(id: ContinuationId): RouteSnapshot {
    return this.routeSnapshot(this.getRoute(id));
  }

  /** Leading hashes of `prefix` whose pages are resident and indexed: the longest exact cache hit. */
  matchPrefix(prefix: readonly PrefixHash[]): number {
    let n = 0;
    for (const hash of prefix) {
      const page = this.prefixIndex.get(hash);
      if (page === undefined) break;
      const s = this.states[page]!;
      if (s.kind !== "resident" || s.identity?.tokens !== (n + 1) * this.pageTokens) break;
      n++;
    }
    return n;
  }

  /** The index holds a resident page sealed with `hash` at `tokens` rows (a cheap one-page match). */
  hasSealed(hash: PrefixHash, tokens: number): boolean {
    const page = this.prefixIndex.get(hash);
    if (page === undefined) return false;
    const s = this.states[page]!;
    return s.kind === "resident" && s.identity?.tokens === tokens;
  }

  /**
   * Pages a route needs reserved to grow to `totalTokens` rows: the pages it
   * lacks (its resident pages are credited) plus one for a copy-on-write of a
   * shared partial tail.
   */
  reservationNeed(id: ContinuationId, totalTokens: TokenCount): PageCount {
    const r = this.getRoute(id);
    return this.needFor(r, totalTokens) as PageCount;
  }

  // ---- routes -----------------------------------------------------------

  /**
   * Create a route. `prefix` names sealed resident pages to share (refcount++),
   * from the route's first row; `reserveTokens` reserves capacity for the
   * route's whole life (prompt + max generation).
   */
  openRoute(
    id: ContinuationId,
    options: {
      readonly startPosition?: TokenCount;
      readonly prefix?: readonly PrefixHash[];
      readonly reserveTokens?: TokenCount;
      readonly durable?: boolean;
      readonly now?: number;
    } = {},
  ): RouteSnapshot {
    if (this.routes.has(id)) throw new PageError("route-exists", `route ${id} already exists`);
    const prefix = options.prefix ?? [];
    const startPosition = options.startPosition ?? 0;
    if (!Number.isSafeInteger(startPosition) || startPosition < 0)
      throw new PageError("invalid", `route ${id}: startPosition must be a non-negative integer`);
    const matched = this.matchPrefix(prefix);
    if (matched < prefix.length)
      throw new PageError(
        "unknown-prefix",
        `route ${id}: prefix page ${matched} (${prefix[matched]}) is not resident; match first`,
      );
    const pages = prefix.map((h) => this.prefixIndex.get(h)!);
    const tokens = pages.length * this.pageTokens;
    const reserveTokens = options.reserveTokens ?? tokens;
    this.checkTokens(id, "reserveTokens", reserveTokens);
    // Adopted pages are full, so no copy-on-write page is needed.
    const need = Math.max(0, pagesFor(reserveTokens as TokenCount, this.pageTokens) - pages.length);
    if (need > this.availablePages)
      throw new PageError(
        "over-capacity",
        `route ${id}: reserving ${need} pages, only ${this.availablePages} available`,
      );
    for (const p of pages) this.addReference(p);
    const route: Route = {
      id,
      pages: [...pages],
      tokens,
      startPosition,
      reserved: need,
      pins: 0,
      leases: 0,
      fenced: false,
      durable: options.durable ?? false,
      lastAccess: options.now ?? 0,
      pending: null,
      load: null,
    };
    this.reservedTotal += need;
    this.routes.set(id, route);
    this.afterMutation();
    return this.routeSnapshot(route);
  }

  /**
   * Extend an idle route that ends at a page boundary with the sealed
   * resident pages that continue it: `prefix` is the route's own page-hash
   * chain (its first pages must be the route's pages); pages
   * [route.pages, matched) are shared (refcount++) instead of computed. Each
   * adopted page is one the route's reservation held for its growth, so the
   * reservation shrinks by as many. Returns the pages adopted (0: none sealed
   * yet).
   */
  adoptPrefix(id: ContinuationId, prefix: readonly PrefixHash[]): number {
    const r = this.getRoute(id);
    this.checkAcceptsWork(r);
    if (r.pending || r.load)
      throw new PageError("busy", `route ${id}: cannot adopt during an append or load`);
    const P = this.pageTokens;
    if (r.startPosition !== 0 || r.tokens % P !== 0)
      throw new PageError(
        "invalid",
        `route ${id}: adopts only from position 0 at a page boundary (start ${r.startPosition}, ${r.tokens} rows)`,
      );
    const have = r.pages.length;
    if (have > 0) {
      const tail = this.states[r.pages[have - 1]!]!;
      if (tail.kind !== "resident" || tail.identity?.hash !== prefix[have - 1])
        throw new PageError("invalid", `route ${id}: the prefix does not continue the route's ${have} pages`);
    }
    const matched = this.matchPrefix(prefix);
    if (matched <= have) return 0;
    for (let i = have; i < matched; i++) {
      const page = this.prefixIndex.get(prefix[i]!)!;
      this.addReference(page);
      r.pages.push(page);
    }
    const adopted = matched - have;
    r.tokens += adopted * P;
    const returned = Math.min(r.reserved, adopted);
    r.reserved -= returned;
    this.reservedTotal -= returned;
    this.afterMutation();
    return adopted;
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
    this.reservedTotal += delta;
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
    options: { readonly reserveTokens?: TokenCount; readonly now?: number } = {},
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
    for (const p of s.pages) this.addReference(p);
    s.reserved += srcExtra;
    const route: Route = {
      id: dst,
      pages: [...s.pages],
      tokens: s.tokens,
      startPosition: s.startPosition,
      reserved: dstNeed,
      pins: 0,
      leases: 0,
      fenced: false,
      durable: false,
      lastAccess: options.now ?? s.lastAccess,
      pending: null,
      load: null,
    };
    this.reservedTotal += srcExtra + dstNeed;
    this.routes.set(dst, route);
    this.afterMutation();
    return this.routeSnapshot(route);
  }

  /** Release an idle route now: its references drop, its reservation returns. */
  releaseRoute(id: ContinuationId): readonly PageId[] {
    const r = this.getRoute(id);
    const waiting = this.waitingFor(r);
    if (waiting.length > 0)
      throw new PageError("busy", `route ${id}: cannot release while ${waiting.join(", ")}`);
    const freed = this.dropRoute(r);
    this.afterMutation();
    return freed;
  }

  /**
   * Fence the route at once (no new work) and return its unallocated
   * reservation; its pages are released now if nothing is in flight, else when
   * the last lease, append, load or pin ends.
   */
  cancelRoute(id: ContinuationId): CancelOutcome {
    const r = this.getRoute(id);
    r.fenced = true;
    this.reservedTotal -= r.reserved;
    r.reserved = 0;
    const waitingFor = this.waitingFor(r);
    if (waitingFor.length === 0) this.dropRoute(r);
    this.afterMutation();
    return { released: waitingFor.length === 0, waitingFor };
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

  markDurable(id: ContinuationId): void {
    const r = this.getRoute(id);
    this.checkAcceptsWork(r);
    if (r.pending || r.load) throw new PageError("busy", `route ${id}: not durable during an append or load`);
    r.durable = true;
    this.afterMutation();
  }

  touch(id: ContinuationId, now: number): void {
    const r = this.getRoute(id);
    if (!Number.isFinite(now)) throw new PageError("invalid", `route ${id}: time must be finite`);
    r.lastAccess = Math.max(r.lastAccess, now);
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
    for (let i = 0; i < allocations; i++) fresh.push(this.allocate(r));
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
   * Returns true when the commit released a cancelled route.
   */
  commitAppend(id: ContinuationId, sealed: readonly PrefixHash[]): boolean {
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
    if (p.copy) this.dropReference(p.copy.src);
    r.pages = [...p.table];
    r.tokens += p.tokens;
    r.pending = null;
    for (let i = before; i < after; i++) this.seal(r.pages[i]!, sealed[i - before]!, (i + 1) * P);
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
    for (const page of p.fresh) this.dropReference(page);
    if (!r.fenced) {
      r.reserved += p.fromReservation;
      this.reservedTotal += p.fromReservation;
    }
    const released = this.releaseIfQuiesced(r);
    this.afterMutation();
    return released;
  }

  // ---- leases (a batch step in flight) -----------------------------------

  /** Hold routes for one in-flight step: they cannot be released or evicted until the lease ends. */
  acquireLease(ids: readonly ContinuationId[]): LeaseId {
    if (ids.length === 0) throw new PageError("invalid", "a lease needs at least one route");
    if (new Set(ids).size !== ids.length) throw new PageError("invalid", "a lease names each route once");
    const routes = ids.map((id) => this.getRoute(id));
    for (const r of routes) {
      this.checkAcceptsWork(r);
      if (r.load) throw new PageError("busy", `route ${r.id}: a load is in flight`);
    }
    const id = this.nextLease++ as LeaseId;
    for (const r of routes) r.leases++;
    this.leases.set(id, [...ids]);
    this.afterMutation();
    return id;
  }

  /** End a lease; returns the cancelled routes whose release it completed. */
  releaseLease(lease: LeaseId): readonly ContinuationId[] {
    const ids = this.leases.get(lease);
    if (!ids) throw new PageError("unknown-lease", `lease ${lease} is not held`);
    this.leases.delete(lease);
    const released: ContinuationId[] = [];
    for (const id of ids) {
      const r = this.routes.get(id)!;
      r.leases--;
      if (this.releaseIfQuiesced(r)) released.push(id);
    }
    this.afterMutation();
    return released;
  }

  // ---- loads (restore transfers write pages) -----------------------------

  /**
   * Allocate pages after the route's (full) last page for `tokens` restored
   * rows; each page is loading until its transfer completes. `sealed` holds the
   * prefix hash of every full restored page.
   */
  beginLoad(id: ContinuationId, tokens: TokenCount, sealed: readonly PrefixHash[]): readonly LoadTicket[] {
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
    const count = pagesFor(tokens, P);
    if (count > r.reserved + this.availablePages)
      throw new PageError(
        "over-capacity",
        `route ${id}: load needs ${count} pages, reservation ${r.reserved} + available ${this.availablePages}`,
      );
    const pages: PageId[] = [];
    for (let i = 0; i < count; i++) {
      const page = this.allocate(r);
      this.states[page] = { kind: "loading", generation: this.states[page]!.generation, route: id };
      pages.push(page);
    }
    r.load = { tokens, pages, sealed: [...sealed], outstanding: new Set(pages), failed: false };
    this.afterMutation();
    return pages.map((page) => ({ page, generation: this.states[page]!.generation, route: id }));
  }

  /** A page's transfer finished. A ticket of an older generation is a reported no-op. */
  completeLoad(ticket: PageTicket): TransferOutcome {
    const s = this.states[this.checkPageId(ticket.page)]!;
    if (s.generation !== ticket.generation) return { applied: false, reason: "stale-generation" };
    if (s.kind !== "loading") return { applied: false, reason: "not-loading" };
    const r = this.routes.get(s.route)!;
    this.states[ticket.page] = {
      kind: "resident",
      generation: s.generation,
      refcount: 1,
      readers: 0,
      identity: null,
    };
    r.load!.outstanding.delete(ticket.page);
    return this.afterTransfer(r);
  }

  /** A page's transfer failed and will write nothing: the page frees and the whole load is abandoned. */
  failLoad(ticket: PageTicket): TransferOutcome {
    const s = this.states[this.checkPageId(ticket.page)]!;
    if (s.generation !== ticket.generation) return { applied: false, reason: "stale-generation" };
    if (s.kind !== "loading") return { applied: false, reason: "not-loading" };
    const r = this.routes.get(s.route)!;
    this.freePage(ticket.page);
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
   * (they wait in `evicting`).
   */
  beginCapture(
    id: ContinuationId,
    from: number,
    count: number,
  ): { id: CaptureId; pages: readonly PageTicket[] } {
    const r = this.getRoute(id);
    const sealedPages = Math.floor(r.tokens / this.pageTokens);
    if (
      !Number.isSafeInteger(from) ||
      !Number.isSafeInteger(count) ||
      from < 0 ||
      count < 1 ||
      from + count > sealedPages
    )
      throw new PageError(
        "invalid",
        `route ${id}: capture of pages [${from}, ${from + count}) outside its ${sealedPages} sealed pages`,
      );
    const tickets: PageTicket[] = [];
    for (const page of r.pages.slice(from, from + count)) {
      const s = this.states[page]!;
      if (s.kind !== "resident") throw new PageInvariantError(`sealed page ${page} of ${id} is ${s.kind}`);
      this.states[page] = { ...s, readers: s.readers + 1 };
      tickets.push({ page, generation: s.generation });
    }
    const captureId = this.nextCapture++ as CaptureId;
    this.captures.set(captureId, tickets);
    this.afterMutation();
    return { id: captureId, pages: tickets };
  }

  /** The capture's download finished (or failed): its pages may be reused. Returns pages it freed. */
  endCapture(capture: CaptureId): readonly PageId[] {
    const tickets = this.captures.get(capture);
    if (!tickets) throw new PageError("unknown-capture", `capture ${capture} is not in flight`);
    this.captures.delete(capture);
    const freed: PageId[] = [];
    for (const { page } of tickets) {
      const s = this.states[page]!;
      if (s.kind === "resident") this.states[page] = { ...s, readers: s.readers - 1 };
      else if (s.kind === "evicting") {
        if (s.readers === 1) {
          this.freePage(page);
          freed.push(page);
        } else this.states[page] = { ...s, readers: s.readers - 1 };
      } else throw new PageInvariantError(`captured page ${page} is ${s.kind}`);
    }
    this.afterMutation();
    return freed;
  }

  // ---- snapshot and invariants -------------------------------------------

  snapshot(): PagePoolSnapshot {
    const refcounts = this.states.map((s) => (s.kind === "resident" ? s.refcount : 0));
    let resident = 0;
    let loading = 0;
    let evicting = 0;
    for (const s of this.states) {
      if (s.kind === "resident") resident++;
      else if (s.kind === "loading") loading++;
      else if (s.kind === "evicting") evicting++;
    }
    // Simulate releasing every evictable route: a shared page frees only when all its routes go.
    const left = [...refcounts];
    let evictable = 0;
    for (const r of this.routes.values()) {
      if (!r.durable || r.fenced || this.waitingFor(r).length > 0) continue;
      for (const p of r.pages)
        if (--left[p]! === 0 && (this.states[p] as { readers: number }).readers === 0) evictable++;
    }
    const prefixes: PrefixBoundary[] = [];
    for (const [hash, page] of this.prefixIndex) {
      const s = this.states[page]!;
      if (s.kind === "resident" && s.identity) prefixes.push({ hash, tokens: s.identity.tokens });
    }
    prefixes.sort((a, b) => a.tokens - b.tokens || (a.hash < b.hash ? -1 : a.hash > b.hash ? 1 : 0));
    const routes = [...this.routes.values()]
      .map((r) => this.routeSnapshot(r))
      .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    return {
      pageTokens: this.pageTokens,
      physicalPages: this.physicalPages,
      freePages: this.free.length as PageCount,
      reservedPages: this.reservedTotal as PageCount,
      residentPages: resident as PageCount,
      loadingPages: loading as PageCount,
      evictingPages: evicting as PageCount,
      evictablePages: evictable as PageCount,
      refcounts,
      readers: this.states.map((s) => (s.kind === "resident" || s.kind === "evicting" ? s.readers : 0)),
      routes,
      prefixes,
    };
  }

  /** Throws PageInvariantError naming the first broken invariant. */
  checkInvariants(): void {
    const fail = (msg: string): never => {
      throw new PageInvariantError(msg);
    };
    const N = this.physicalPages;
    // Expected references per page, recomputed from the routes.
    const refs = new Array<number>(N).fill(0);
    const loadingOwner = new Map<PageId, ContinuationId>();
    let reserved = 0;
    const leaseCount = new Map<ContinuationId, number>();
    for (const ids of this.leases.values())
      for (const id of ids) leaseCount.set(id, (leaseCount.get(id) ?? 0) + 1);
    for (const r of this.routes.values()) {
      reserved += r.reserved;
      if (r.reserved < 0 || r.pins < 0) fail(`route ${r.id}: negative reservation or pins`);
      if (r.fenced && r.reserved !== 0) fail(`route ${r.id}: fenced but holds a reservation`);
      if (r.leases !== (leaseCount.get(r.id) ?? 0))
        fail(`route ${r.id}: lease count ${r.leases} disagrees with leases`);
      if (r.pages.length !== pagesFor(r.tokens as TokenCount, this.pageTokens))
        fail(`route ${r.id}: ${r.pages.length} pages for ${r.tokens} rows`);
      if (new Set(r.pages).size !== r.pages.length) fail(`route ${r.id}: a page appears twice in its table`);
      for (const p of r.pages) refs[p]!++;
      if (r.pending) for (const p of r.pending.fresh) refs[p]!++;
      if (r.load) {
        for (const p of r.load.pages) {
          const s = this.states[p]!;
          if (s.kind === "loading") {
            if (!r.load.outstanding.has(p)) fail(`page ${p} is loading but not outstanding`);
            loadingOwner.set(p, r.id);
          } else if (s.kind === "resident") refs[p]!++;
        }
      }
      // Sealed pages are exactly the full ones, each with the row count it closes.
      for (let i = 0; i < r.pages.length; i++) {
        const s = this.states[r.pages[i]!]!;
        if (s.kind !== "resident") fail(`route ${r.id}: page ${r.pages[i]} is ${s.kind}`);
        const full = (i + 1) * this.pageTokens <= r.tokens;
        const id = (s as { identity: PageIdentity | null }).identity;
        if (full !== (id !== null))
          fail(`route ${r.id}: page ${r.pages[i]} full=${full} sealed=${id !== null}`);
        if (id && id.tokens !== (i + 1) * this.pageTokens)
          fail(`route ${r.id}: page ${i} sealed at ${id.tokens} rows`);
      }
    }
    if (reserved !== this.reservedTotal)
      fail(`reservations ${this.reservedTotal} ≠ sum over routes ${reserved}`);
    if (this.reservedTotal > this.free.length)
      fail(`reserved ${this.reservedTotal} > free ${this.free.length}`);
    const readers = new Array<number>(N).fill(0);
    for (const tickets of this.captures.values()) for (const t of tickets) readers[t.page]!++;
    const freeSet = new Set(this.free);
    if (freeSet.size !== this.free.length) fail("a page is on the free list twice");
    for (let p = 0; p < N; p++) {
      const s = this.states[p]!;
      switch (s.kind) {
        case "free":
          if (!freeSet.has(p as PageId)) fail(`page ${p} is free but not on the free list`);
          if (refs[p] !== 0) fail(`page ${p} is free but referenced ${refs[p]} times`);
          if (readers[p] !== 0) fail(`page ${p} is free but captured`);
          break;
        case "loading":
          if (loadingOwner.get(p as PageId) !== s.route)
            fail(`loading page ${p} is not owned by ${s.route}'s load`);
          if (freeSet.has(p as PageId) || refs[p] !== 0) fail(`loading page ${p} is free or referenced`);
          break;
        case "resident":
          if (freeSet.has(p as PageId)) fail(`resident page ${p} is on the free list`);
          if (s.refcount < 1 || s.refcount !== refs[p])
            fail(`page ${p}: refcount ${s.refcount}, references ${refs[p]}`);
          if (s.readers !== readers[p]) fail(`page ${p}: readers ${s.readers}, captures ${readers[p]}`);
          break;
        case "evicting":
          if (freeSet.has(p as PageId) || refs[p] !== 0) fail(`evicting page ${p} is free or referenced`);
          if (s.readers < 1 || s.readers !== readers[p]) fail(`evicting page ${p}: readers ${s.readers}`);
          break;
      }
    }
    for (const [hash, page] of this.prefixIndex) {
      const s = this.states[page]!;
      if (s.kind !== "resident" || s.identity?.hash !== hash)
        fail(`prefix ${hash} indexes page ${page} (${s.kind})`);
    }
  }

  // ---- internals ----------------------------------------------------------

  private afterMutation(): void {
    if (this.debug) this.checkInvariants();
  }

  private checkPageId(page: PageId): PageId {
    if (!Number.isSafeInteger(page) || page < 0 || page >= this.physicalPages)
      throw new PageError("invalid", `page ${page} is outside [0, ${this.physicalPages})`);
    return page;
  }

  private checkTokens(id: ContinuationId, what: string, n: number): void {
    if (!Number.isSafeInteger(n) || n < 0)
      throw new PageError("invalid", `route ${id}: ${what} must be a non-negative integer, got ${n}`);
  }

  private getRoute(id: ContinuationId): Route {
    const r = this.routes.get(id);
    if (!r) throw new PageError("unknown-route", `route ${id} does not exist`);
    return r;
  }

  private checkAcceptsWork(r: Route): void {
    if (r.fenced) throw new PageError("fenced", `route ${r.id} is cancelled; no new work is accepted`);
  }

  private tailShared(r: Route): boolean {
    const tail = r.pages[r.pages.length - 1];
    if (tail === undefined) return false;
    const s = this.states[tail]!;
    return s.kind === "resident" && s.refcount > 1;
  }

  private needFor(r: Route, totalTokens: number): number {
    const lacking = Math.max(0, pagesFor(totalTokens as TokenCount, this.pageTokens) - r.pages.length);
    const cow = r.tokens % this.pageTokens !== 0 && totalTokens > r.tokens && this.tailShared(r) ? 1 : 0;
    return lacking + cow;
  }

  private waitingFor(r: Route): ("lease" | "append" | "load" | "pin")[] {
    const w: ("lease" | "append" | "load" | "pin")[] = [];
    if (r.leases > 0) w.push("lease");
    if (r.pending) w.push("append");
    if (r.load) w.push("load");
    if (r.pins > 0) w.push("pin");
    return w;
  }

  private releaseIfQuiesced(r: Route): boolean {
    if (!r.fenced || this.waitingFor(r).length > 0 || !this.routes.has(r.id)) return false;
    this.dropRoute(r);
    return true;
  }

  /** Take one free page for `r`, from its reservation when it has one. Caller checked capacity. */
  private allocate(r: Route): PageId {
    if (r.reserved > 0) {
      r.reserved--;
      this.reservedTotal--;
    } else if (this.availablePages < 1)
      throw new PageInvariantError(`allocation for ${r.id} without capacity`);
    const page = this.free.pop();
    if (page === undefined) throw new PageInvariantError("free list empty with capacity accounted");
    const s = this.states[page]!;
    this.states[page] = {
      kind: "resident",
      generation: s.generation,
      refcount: 1,
      readers: 0,
      identity: null,
    };
    return page;
  }

  private addReference(page: PageId): void {
    const s = this.states[page]!;
    if (s.kind !== "resident") throw new PageInvariantError(`reference to ${s.kind} page ${page}`);
    this.states[page] = { ...s, refcount: s.refcount + 1 };
  }

  /** refcount--; at zero the page leaves the prefix index and frees, or waits in `evicting` for its readers. */
  private dropReference(page: PageId): void {
    const s = this.states[page]!;
    if (s.kind !== "resident") throw new PageInvariantError(`dereference of ${s.kind} page ${page}`);
    if (s.refcount > 1) {
      this.states[page] = { ...s, refcount: s.refcount - 1 };
      return;
    }
    if (s.identity && this.prefixIndex.get(s.identity.hash) === page)
      this.prefixIndex.delete(s.identity.hash);
    if (s.readers > 0) this.states[page] = { kind: "evicting", generation: s.generation, readers: s.readers };
    else this.freePage(page);
  }

  private freePage(page: PageId): void {
    const g = this.states[page]!.generation;
    this.states[page] = { kind: "free", generation: Generation(g + 1) };
    this.free.push(page);
  }

  private seal(page: PageId, hash: PrefixHash, tokens: number): void {
    const s = this.states[page]!;
    if (s.kind !== "resident") throw new PageInvariantError(`sealing ${s.kind} page ${page}`);
    if (s.identity) throw new PageInvariantError(`page ${page} is already sealed`);
    this.states[page] = { ...s, identity: { hash, tokens: TokenCount(tokens) } };
    if (!this.prefixIndex.has(hash)) this.prefixIndex.set(hash, page);
  }

  private dropRoute(r: Route): PageId[] {
    const before = new Set(this.free);
    this.reservedTotal -= r.reserved;
    r.reserved = 0;
    this.routes.delete(r.id);
    for (const p of r.pages) this.dropReference(p);
    return this.free.filter((p) => !before.has(p));
  }

  private afterTransfer(r: Route): TransferOutcome {
    const load = r.load!;
    let ready = false;
    if (load.outstanding.size === 0) {
      r.load = null;
      if (load.failed) {
        for (const p of load.pages) if (this.states[p]!.kind === "resident") this.dropReference(p);
      } else {
        const P = this.pageTokens;
        const first = r.pages.length;
        r.pages.push(...load.pages);
        r.tokens += load.tokens;
        for (let i = 0; i < load.sealed.length; i++)
          this.seal(load.pages[i]!, load.sealed[i]!, (first + i + 1) * P);
        ready = true;
      }
    }
    const released = this.releaseIfQuiesced(r);
    this.afterMutation();
    return { applied: true, route: r.id, routeReady: ready && !released, released };
  }

  private routeSnapshot(r: Route): RouteSnapshot {
    return {
      id: r.id,
      pages: [...r.pages],
      tokens: TokenCount(r.tokens),
      startPosition: TokenCount(r.startPosition),
      reservedPages: r.reserved as PageCount,
      durable: r.durable,
      pinned: r.pins > 0,
      leased: r.leases > 0,
      dirty: r.pending !== null,
      loading: r.load !== null,
      fenced: r.fenced,
      lastAccess: r.lastAccess,
    };
  }
}
