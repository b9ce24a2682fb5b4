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
 *   resident → evicting → free     (last reference dropped while a capture still reads it)
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
