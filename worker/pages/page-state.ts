import type { Brand, ContinuationId, Generation, PageId, PrefixHash, TokenCount } from "../../schema/ids.ts";

/**
 * Immutable prefix identity of a full (sealed) page: the prefix-chain hash of
 * every row of its route up to this page's end, and that row count. Set once
 * when the page fills and never changed; identical prefixes share one page.
 */
export interface PageIdentity {
  readonly hash: PrefixHash;
  readonly tokens: TokenCount;
}

/**
 * The life of one physical page:
 *   free → loading → resident      (a restore transfer writes it)
 *   free → resident                (compute appends rows into it)
 *   resident → cached              (last reference dropped, sealed, kept: findable by its hash)
 *   cached → resident              (adopted by a route that needs that prefix)
 *   cached → free                  (evicted: an allocation reuses it)
 *   resident → evicting → free     (last reference dropped, not kept, while a capture still reads it)
 *   resident → free, loading → free
 * The generation bumps on every entry to `free`, so a transfer ticket issued
 * for an older generation can never complete into the page's next owner.
 */
export type PageState =
  | { readonly kind: "free"; readonly generation: Generation }
  | { readonly kind: "loading"; readonly generation: Generation; readonly route: ContinuationId }
  | {
      readonly kind: "resident";
      readonly generation: Generation;
      /** Routes (and pending appends or finished loads) referencing this page. > 0. */
      readonly refcount: number;
      /** Captures (checkpoint downloads) reading this page's bytes. */
      readonly readers: number;
      readonly identity: PageIdentity | null;
    }
  | {
      readonly kind: "cached";
      readonly generation: Generation;
      readonly readers: number;
      readonly identity: PageIdentity;
    }
  | { readonly kind: "evicting"; readonly generation: Generation; readonly readers: number };

export type PageStateKind = PageState["kind"];

/** A transfer's claim on one page: valid only while the page keeps this generation. */
export interface PageTicket {
  readonly page: PageId;
  readonly generation: Generation;
}

/** One copy-on-write instruction for the engine: copy page `src`'s rows into `dst` before the append. */
export interface PageCopy {
  readonly src: PageId;
  readonly dst: PageId;
}

export type LeaseId = Brand<number, "LeaseId">;
export type CaptureId = Brand<number, "CaptureId">;

/** Why an operation was refused; the manager's state is unchanged when one is thrown. */
export type PageErrorCode =
  | "unknown-route"
  | "route-exists"
  | "unknown-prefix"
  | "not-resident"
  | "over-capacity"
  | "fenced"
  | "busy"
  | "invalid"
  | "unknown-lease"
  | "unknown-capture";

export class PageError extends Error {
  override readonly name = "PageError";
  constructor(
    readonly code: PageErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/** A broken internal invariant: a bug in the page manager, never bad input. */
export class PageInvariantError extends Error {
  override readonly name = "PageInvariantError";
}

const KINDS: readonly PageStateKind[] = ["free", "loading", "resident", "cached", "evicting"];
const FREE = 0;
const LOADING = 1;
const RESIDENT = 2;
const CACHED = 3;
const EVICTING = 4;

/**
 * The state machine above for every page of a pool, one typed-array slot per
 * page (a pool may hold millions): each transition checks the state it leaves
 * and throws PageInvariantError on any other, since only a bug asks for one.
 * Policy (which page, whether to keep it) is the pool's; this records what
 * each page is. `work` counts page slots read or written.
 */
export class PageStates {
  private readonly kinds: Uint8Array;
  private readonly generations: Float64Array;
  private readonly refcounts: Uint32Array;
  private readonly readerCounts: Uint32Array;
  /** Identity of every sealed page (resident or cached). */
  private readonly identities = new Map<PageId, PageIdentity>();
  /** The route each loading page is loading for. */
  private readonly loadingFor = new Map<PageId, ContinuationId>();
  work = 0;

  constructor(readonly size: number) {
    this.kinds = new Uint8Array(size);
    // Float64: exact to 2^53 reuses, where 32 bits could wrap and revive a stale ticket.
    this.generations = new Float64Array(size);
    this.refcounts = new Uint32Array(size);
    this.readerCounts = new Uint32Array(size);
  }

  kind(page: PageId): PageStateKind {
    this.work++;
    return KINDS[this.kinds[page]!]!;
  }

  generation(page: PageId): Generation {
    return this.generations[page]! as Generation;
  }

  refcount(page: PageId): number {
    this.work++;
    return this.refcounts[page]!;
  }

  readers(page: PageId): number {
    return this.readerCounts[page]!;
  }

  identity(page: PageId): PageIdentity | null {
    return this.identities.get(page) ?? null;
  }

  loadingRoute(page: PageId): ContinuationId | undefined {
    return this.loadingFor.get(page);
  }

  view(page: PageId): PageState {
    const generation = this.generation(page);
    switch (this.kinds[page]!) {
      case FREE:
        return { kind: "free", generation };
      case LOADING:
        return { kind: "loading", generation, route: this.loadingFor.get(page)! };
      case RESIDENT:
        return {
          kind: "resident",
          generation,
          refcount: this.refcounts[page]!,
          readers: this.readerCounts[page]!,
          identity: this.identity(page),
        };
      case CACHED:
        return {
          kind: "cached",
          generation,
          readers: this.readerCounts[page]!,
          identity: this.identity(page)!,
        };
      default:
        return { kind: "evicting", generation, readers: this.readerCounts[page]! };
    }
  }

  /** free → resident with one reference (rows are about to be written). */
  take(page: PageId): void {
    this.expect(page, FREE, "take");
    this.set(page, RESIDENT);
    this.refcounts[page] = 1;
  }

  /** free → loading for `route`. */
  startLoad(page: PageId, route: ContinuationId): void {
    this.expect(page, FREE, "load");
    this.set(page, LOADING);
    this.loadingFor.set(page, route);
  }

  /** loading → resident with one reference (the load's). */
  finishLoad(page: PageId): void {
    this.expect(page, LOADING, "finish loading");
    this.loadingFor.delete(page);
    this.set(page, RESIDENT);
    this.refcounts[page] = 1;
  }

  /** loading → free. */
  failLoad(page: PageId): void {
    this.expect(page, LOADING, "fail loading");
    this.loadingFor.delete(page);
    this.free(page);
  }

  /** resident: refcount + 1; cached → resident with one reference. */
  reference(page: PageId): void {
    const k = this.kinds[page]!;
    this.work++;
    if (k === CACHED) {
      this.set(page, RESIDENT);
      this.refcounts[page] = 1;
    } else if (k === RESIDENT) this.refcounts[page]!++;
    else throw new PageInvariantError(`reference to ${KINDS[k]} page ${page}`);
  }

  /**
   * refcount − 1. At zero a sealed page the caller keeps becomes cached;
   * otherwise it loses its identity and frees, or waits in evicting while
   * captures read it. Returns the page's kind afterwards.
   */
  dereference(page: PageId, keep: boolean): PageStateKind {
    this.expect(page, RESIDENT, "dereference");
    if (--this.refcounts[page]! > 0) return "resident";
    if (keep && this.identities.has(page)) {
      this.set(page, CACHED);
      return "cached";
    }
    this.identities.delete(page);
    if (this.readerCounts[page]! > 0) {
      this.set(page, EVICTING);
      return "evicting";
    }
    this.free(page);
    return "free";
  }

  seal(page: PageId, identity: PageIdentity): void {
    this.expect(page, RESIDENT, "seal");
    if (this.identities.has(page)) throw new PageInvariantError(`page ${page} is already sealed`);
    this.identities.set(page, identity);
  }

  /** resident or cached: one more capture reads the page. */
  addReader(page: PageId): void {
    const k = this.kinds[page]!;
    this.work++;
    if (k !== RESIDENT && k !== CACHED) throw new PageInvariantError(`capture of ${KINDS[k]} page ${page}`);
    this.readerCounts[page]!++;
  }

  /** A capture ended; an evicting page frees with its last reader. Returns the kind afterwards. */
  dropReader(page: PageId): PageStateKind {
    const k = this.kinds[page]!;
    this.work++;
    if ((k !== RESIDENT && k !== CACHED && k !== EVICTING) || this.readerCounts[page] === 0)
      throw new PageInvariantError(`end of a capture of ${KINDS[k]} page ${page}`);
    if (--this.readerCounts[page]! === 0 && k === EVICTING) {
      this.free(page);
      return "free";
    }
    return KINDS[k]!;
  }

  /** cached (no readers) → free: the page's prefix is forgotten so it can be reused. */
  evict(page: PageId): void {
    this.expect(page, CACHED, "evict");
    if (this.readerCounts[page] !== 0) throw new PageInvariantError(`eviction of captured page ${page}`);
    this.identities.delete(page);
    this.free(page);
  }

  private free(page: PageId): void {
    this.set(page, FREE);
    this.refcounts[page] = 0;
    this.generations[page]!++;
  }

  private set(page: PageId, kind: number): void {
    this.work++;
    this.kinds[page] = kind;
  }

  private expect(page: PageId, kind: number, what: string): void {
    this.work++;
    const k = this.kinds[page]!;
    if (k !== kind) throw new PageInvariantError(`${what}: page ${page} is ${KINDS[k]}, not ${KINDS[kind]}`);
  }
}
