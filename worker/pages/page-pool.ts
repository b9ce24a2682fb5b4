import type { ContinuationId, PageId, PrefixHash } from "../../schema/ids.ts";
import { TokenCount } from "../../schema/ids.ts";
import { cachedPageValue, type ResidencyCosts } from "../residency/residency.ts";
import { EvictionQueue } from "./eviction-queue.ts";
import { type PageIdentity, PageInvariantError, type PageStateKind, PageStates } from "./page-state.ts";

export interface PrefixBoundary {
  readonly hash: PrefixHash;
  readonly tokens: TokenCount;
}

/** What the route table says each page must hold, for the pool's invariant check. */
export interface ExpectedUse {
  /** References per page: route tables, pending appends' fresh pages, finished pages of loads in flight. */
  readonly refs: readonly number[];
  /** Captures per page. */
  readonly readers: readonly number[];
  /** Loading page → the route whose load holds it. */
  readonly loading: ReadonlyMap<PageId, ContinuationId>;
}

/**
 * A device's physical pages, after vLLM's block pool: their states, the free
 * pages in eviction order, and the prefix index (hash → the sealed page
 * holding that prefix).
 *
 * Free pages are of two kinds. Plain free pages hold nothing and are handed
 * out first (a stack: the lowest id first at the start, the latest freed
 * after). Cached pages are sealed pages no route references that were kept:
 * they keep their hash and stay findable, so a later request adopts them
 * instead of computing them again, until an allocation finds no plain free
 * page and evicts the cached page of least residency value
 * (worker/residency/residency.ts) — lazy eviction. A cached page a capture is
 * reading is not evictable until the capture ends.
 *
 * Capacity: plain free + evictable cached pages, of which `reserved` are
 * promised to routes' reservations; `available` is the rest. Whoever takes a
 * page out of capacity (allocation, adopting or capturing an evictable cached
 * page) has checked it fits: the pool asserts, it does not decide.
 *
 * Every operation is O(pages it touches), with O(log cached) per cached page;
 * `work` counts the slots visited, so tests can hold it to that.
 *
 * One pool serves every layer: a page holds every layer's rows, so only a
 * model whose layers all slide releases pages (route.ts windowDeadPages).
 * Mixed sliding and global layers would share it with a page table of their
 * own per route (route.ts) and this index keyed by (layer group, hash), as
 * vLLM's coordinator keys its block pool's per manager.
 */
export class PagePool {
  readonly states: PageStates;
  /** Plain free pages, a stack: freeList[0, freeTop). */
  private readonly freeList: Int32Array;
  private freeTop: number;
  private listWork = 0;
  private readonly queue: EvictionQueue;
  private readonly index = new Map<PrefixHash, PageId>();
  /** Residency inputs of sealed pages, reset when a page is sealed. */
  private readonly hits: Uint32Array;
  private readonly durable: Uint8Array;
  /** A cached page's value, priced when it was kept; its last use (the pool's logical clock). */
  private readonly value: Float64Array;
  private readonly lastUse: Float64Array;
  /** Logical time: advanced once per route operation, so the pages of one release share a time. */
  private clock = 0;
  /** Free pages promised to routes' reservations. */
  reserved = 0;
  /** Cached pages evicted for reuse, since the pool was made. */
  evictions = 0;

  constructor(
    readonly physicalPages: number,
    readonly pageTokens: number,
  ) {
    this.states = new PageStates(physicalPages);
    this.freeList = new Int32Array(physicalPages);
    for (let i = 0; i < physicalPages; i++) this.freeList[i] = physicalPages - 1 - i;
    this.freeTop = physicalPages;
    this.queue = new EvictionQueue(physicalPages);
    this.hits = new Uint32Array(physicalPages);
    this.durable = new Uint8Array(physicalPages);
    this.value = new Float64Array(physicalPages);
    this.lastUse = new Float64Array(physicalPages);
  }

  /** Plain free pages (no identity). */
  get freePages(): number {
    return this.freeTop;
  }

  /** Cached pages an allocation may evict. */
  get evictablePages(): number {
    return this.queue.size;
  }

  /** Free or evictable pages not promised to any reservation. */
  get available(): number {
    return this.freeTop + this.queue.size - this.reserved;
  }

  get work(): number {
    return this.states.work + this.queue.work + this.listWork;
  }

  tick(): void {
    this.clock++;
  }

  // ---- the prefix index ----------------------------------------------------

  /** The resident or cached page sealed with `hash` at `tokens` rows. */
  lookup(hash: PrefixHash, tokens: number): PageId | undefined {
    const page = this.index.get(hash);
    if (page === undefined) return undefined;
    const kind = this.states.kind(page);
    if (kind !== "resident" && kind !== "cached") return undefined;
    return this.states.identity(page)?.tokens === tokens ? page : undefined;
  }

  /** Some resident or cached page is sealed with `hash`. */
  holds(hash: PrefixHash): boolean {
    const page = this.index.get(hash);
    if (page === undefined) return false;
    const kind = this.states.kind(page);
    return kind === "resident" || kind === "cached";
  }

  /** Leading hashes of `prefix` (page i closing row (i + 1)·P) that are resident or cached. */
  match(prefix: readonly PrefixHash[]): number {
    let n = 0;
    while (n < prefix.length && this.lookup(prefix[n]!, (n + 1) * this.pageTokens) !== undefined) n++;
    return n;
  }

  /** How many of `pages` are evictable cached pages: referencing or capturing them takes them out of capacity. */
  evictableAmong(pages: Iterable<PageId>): number {
    let n = 0;
    for (const p of pages) if (this.queue.has(p)) n++;
    return n;
  }

  hitsOf(page: PageId): number {
    return this.hits[page]!;
  }

  isDurable(page: PageId): boolean {
    return this.durable[page] === 1;
  }

  /** Indexed prefixes, unordered: O(indexed pages). */
  *prefixes(): IterableIterator<PrefixBoundary> {
    for (const [hash, page] of this.index) {
      const id = this.states.identity(page);
      if (id) yield { hash, tokens: id.tokens };
    }
  }

  // ---- transitions -----------------------------------------------------------

  /** A page for new rows: a plain free one, else the cached page of least value, evicted. */
  allocate(): PageId {
    const page = this.take();
    this.states.take(page);
    return page;
  }

  /** A page for a restore's rows, loading for `route`. */
  allocateLoading(route: ContinuationId): PageId {
    const page = this.take();
    this.states.startLoad(page, route);
    return page;
  }

  /** One more reference; a cached page becomes resident. `hit`: a route adopted it by its hash. */
  reference(page: PageId, hit: boolean): void {
    if (this.queue.has(page)) this.takeOutOfCapacity(page);
    this.states.reference(page);
    if (hit) {
      this.hits[page]!++;
      this.lastUse[page] = this.clock;
    }
  }

  /**
   * One reference fewer. With `keep` (the costs to price it with), a sealed
   * page left unreferenced becomes cached; without, it leaves the index and
   * frees (or waits in evicting for its readers). Returns its kind afterwards.
   */
  dereference(page: PageId, keep: ResidencyCosts | null): PageStateKind {
    const identity = this.states.identity(page);
    const kind = this.states.dereference(page, keep !== null);
    if (kind === "resident") return kind;
    if (kind === "cached") {
      this.value[page] = cachedPageValue(this.hits[page]!, this.durable[page] === 1, keep!);
      this.lastUse[page] = this.clock;
      if (this.states.readers(page) === 0) this.enqueue(page);
      return kind;
    }
    if (identity) this.unindex(page, identity);
    if (kind === "free") this.pushFree(page);
    return kind;
  }

  /** A loading page's transfer finished: it is resident with the load's reference. */
  finishLoad(page: PageId): void {
    this.states.finishLoad(page);
  }

  failLoad(page: PageId): void {
    this.states.failLoad(page);
    this.pushFree(page);
  }

  seal(page: PageId, hash: PrefixHash, tokens: number): void {
    this.states.seal(page, { hash, tokens: TokenCount(tokens) });
    this.hits[page] = 0;
    this.durable[page] = 0;
    if (!this.index.has(hash)) this.index.set(hash, page);
  }

  addReader(page: PageId): void {
    if (this.queue.has(page)) this.takeOutOfCapacity(page);
    this.states.addReader(page);
  }

  /** A capture of the page ended: an evicting page frees, an unread cached page is evictable again. */
  dropReader(page: PageId): PageStateKind {
    const kind = this.states.dropReader(page);
    if (kind === "free") this.pushFree(page);
    else if (kind === "cached" && this.states.readers(page) === 0) this.enqueue(page);
    return kind;
  }

  /** The page's rows are in published chunks: it is cheaper to lose (costs price it if it is queued). */
  markDurable(page: PageId, costs: ResidencyCosts): void {
    if (this.durable[page] === 1) return;
    this.durable[page] = 1;
    if (this.states.kind(page) !== "cached") return;
    this.value[page] = cachedPageValue(this.hits[page]!, true, costs);
    if (this.queue.has(page)) this.queue.revalue(page, this.value[page]!);
  }

  // ---- invariants --------------------------------------------------------------

  /** Throws PageInvariantError naming the first broken invariant. O(pool). */
  checkInvariants(expected: ExpectedUse): void {
    const fail = (msg: string): never => {
      throw new PageInvariantError(msg);
    };
    const N = this.physicalPages;
    const onFreeList = new Uint8Array(N);
    for (let i = 0; i < this.freeTop; i++) {
      const p = this.freeList[i]!;
      if (onFreeList[p]) fail("a page is on the free list twice");
      onFreeList[p] = 1;
    }
    for (const p of this.queue.pages())
      if (this.states.kind(p) !== "cached" || this.states.readers(p) !== 0)
        fail(`queued page ${p} is ${this.states.kind(p)} with ${this.states.readers(p)} readers`);
    if (this.reserved < 0 || this.reserved > this.freeTop + this.queue.size)
      fail(`reserved ${this.reserved} outside [0, free ${this.freeTop} + evictable ${this.queue.size}]`);
    for (let i = 0; i < N; i++) {
      const p = i as PageId;
      const s = this.states.view(p);
      const refs = expected.refs[p]!;
      const readers = expected.readers[p]!;
      if (s.kind !== "free" && onFreeList[p]) fail(`${s.kind} page ${p} is on the free list`);
      if (s.kind !== "cached" && this.queue.has(p)) fail(`${s.kind} page ${p} is queued for eviction`);
      if (s.kind !== "resident" && refs !== 0) fail(`${s.kind} page ${p} is referenced ${refs} times`);
      switch (s.kind) {
        case "free":
          if (!onFreeList[p]) fail(`page ${p} is free but not on the free list`);
          if (readers !== 0) fail(`page ${p} is free but captured`);
          if (this.states.identity(p)) fail(`free page ${p} has an identity`);
          break;
        case "loading":
          if (expected.loading.get(p) !== s.route)
            fail(`loading page ${p} is not owned by ${s.route}'s load`);
          break;
        case "resident":
          if (s.refcount < 1 || s.refcount !== refs)
            fail(`page ${p}: refcount ${s.refcount}, references ${refs}`);
          if (s.readers !== readers) fail(`page ${p}: readers ${s.readers}, captures ${readers}`);
          break;
        case "cached":
          if (s.readers !== readers) fail(`cached page ${p}: readers ${s.readers}, captures ${readers}`);
          if ((s.readers === 0) !== this.queue.has(p))
            fail(`cached page ${p} with ${s.readers} readers is ${this.queue.has(p) ? "" : "not "}queued`);
          break;
        case "evicting":
          if (s.readers < 1 || s.readers !== readers) fail(`evicting page ${p}: readers ${s.readers}`);
          if (this.states.identity(p)) fail(`evicting page ${p} keeps an identity`);
          break;
      }
    }
    for (const [hash, page] of this.index) {
      const kind = this.states.kind(page);
      if ((kind !== "resident" && kind !== "cached") || this.states.identity(page)?.hash !== hash)
        fail(`prefix ${hash} indexes page ${page} (${kind})`);
    }
  }

  // ---- internals -----------------------------------------------------------------

  private take(): PageId {
    if (this.freeTop > 0) {
      this.listWork++;
      return this.freeList[--this.freeTop]! as PageId;
    }
    const page = this.queue.pop();
    if (page === undefined) throw new PageInvariantError("allocation with no free or evictable page");
    this.unindex(page, this.states.identity(page)!);
    this.states.evict(page);
    this.evictions++;
    return page;
  }

  /** An evictable page leaves the queue (adopted or captured): asserts capacity still covers reservations. */
  private takeOutOfCapacity(page: PageId): void {
    if (this.available < 1) throw new PageInvariantError(`page ${page} taken out of capacity without room`);
    this.queue.remove(page);
  }

  private enqueue(page: PageId): void {
    this.queue.insert(page, this.value[page]!, this.lastUse[page]!, this.states.identity(page)!.tokens);
  }

  private unindex(page: PageId, identity: PageIdentity): void {
    if (this.index.get(identity.hash) === page) this.index.delete(identity.hash);
  }

  private pushFree(page: PageId): void {
    this.listWork++;
    this.freeList[this.freeTop++] = page;
  }
}
