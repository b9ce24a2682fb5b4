import { createHash } from "node:crypto";
import type { StepBatch } from "../../native/engine.ts";
import { ContinuationId, PrefixHash, type TokenCount } from "../../schema/ids.ts";
import type { LayerGroups } from "../model/layout.ts";
import type { ResidencyCosts } from "../residency/residency.ts";
import { buildBatch, type Lane } from "../runtime/batch.ts";
import type { AppendPlan, PageManager, ReleaseOptions } from "./page-manager.ts";
import { windowDeadPages } from "./route.ts";

/**
 * A continuation's K/V under a layout of several layer groups (layout.ts
 * layerGroups, the engine's createPool groups): one route per group in one
 * PageManager over one pool, each with its group's window, so a sliding
 * group's pages wholly outside its window are released at every commit
 * (kept cached while findable) while a global group keeps every page. This
 * is vLLM's hybrid KV cache coordinator in our terms: one block pool, one
 * table per group, one hit length for all groups.
 *
 * Group g's pages carry hashes of their own (groupHashes: the prefix-chain
 * hash, tagged with g for g > 0), so a page is found, shared and
 * copied-on-write only by routes of its own group and never read through
 * another group's layers. Group 0's route is the continuation's id, so with
 * one group everything is exactly the single-table path.
 *
 * A prefix hit is one length for all groups (matchPrefix): a global group
 * must hold every page of it, a sliding group only the pages its window
 * reaches at its end (vLLM matches sliding groups from the right), so the
 * pages a sliding group released and lost since, or a restore never loaded
 * (PageManager.beginLoad's skip), do not cut it; its route opens with them
 * released. Reservations still cover every group's whole growth.
 */
export class GroupedRoutes {
  /** Each group's window, in group order (null: global). */
  readonly windows: readonly (number | null)[];

  constructor(
    readonly pages: PageManager,
    readonly groups: LayerGroups,
  ) {
    if (groups.groups.length === 0) throw new RangeError("a layout of no layers has no page groups");
    this.windows = groups.groups.map((g) => (g.layout.kind === "sliding" ? g.layout.window : null));
  }

  /** The route of group `g` of continuation `id`: the id itself for group 0. */
  routeOf(id: ContinuationId, g: number): ContinuationId {
    return g === 0 ? id : ContinuationId(`${id}#g${g}`);
  }

  /**
   * Tagged hashes already computed: a plain chain hash → its hashes in
   * groups 1 … G − 1. A waiting prompt is planned (prefixHit) every
   * iteration and a waiter re-scanned at every adoption, and tagging costs a
   * sha256 per page and group. At most TAGGED_CACHE entries; the oldest
   * goes first.
   */
  private readonly tagged = new Map<PrefixHash, readonly PrefixHash[]>();

  /** Entries in the tag cache (≤ TAGGED_CACHE). */
  get taggedCached(): number {
    return this.tagged.size;
  }

  /** Group g's hash of the page whose prefix-chain hash is h (groupHash), through the tag cache. */
  groupHash(h: PrefixHash, g: number): PrefixHash {
    if (g === 0) return h;
    let t = this.tagged.get(h);
    if (t === undefined) {
      t = this.windows.slice(1).map((_, k) => groupHash(h, k + 1));
      this.tagged.set(h, t);
      if (this.tagged.size > TAGGED_CACHE) this.tagged.delete(this.tagged.keys().next().value!);
    }
    return t[g - 1]!;
  }

  /** The prefix hashes group g's pages carry. */
  groupHashes(hashes: readonly PrefixHash[], g: number): readonly PrefixHash[] {
    return g === 0 ? hashes : hashes.map((h) => this.groupHash(h, g));
  }

  /**
   * The exact hit: the most leading pages h of `prefix` such that every
   * global group holds pages [0, h) and every sliding group the pages its
   * window reaches at h, [releasedAt(g, h), h) (resident or cached). O(pages
   * × groups).
   */
  matchPrefix(prefix: readonly PrefixHash[]): number {
    let n = prefix.length;
    for (let g = 0; g < this.windows.length && n > 0; g++)
      if (this.windows[g] === null)
        n = Math.min(n, this.pages.matchPrefix(this.groupHashes(prefix.slice(0, n), g)));
    const P = this.pages.pageTokens;
    /** fits[h]: every sliding group so far holds its window's pages at h. */
    const fits = new Uint8Array(n + 1).fill(1);
    for (let g = 0; g < this.windows.length && n > 0; g++) {
      if (this.windows[g] === null) continue;
      const hashes = this.groupHashes(prefix.slice(0, n), g);
      let run = 0;
      for (let h = 1; h <= n; h++) {
        run = this.pages.hasSealed(hashes[h - 1]!, h * P) ? run + 1 : 0;
        if (run < h - this.releasedAt(g, h)) fits[h] = 0;
      }
    }
    while (n > 0 && fits[n] === 0) n--;
    return n;
  }

  /** Leading pages of a hit of h pages that group g leaves released: those dead for its window. */
  releasedAt(g: number, h: number): number {
    const P = this.pages.pageTokens;
    return windowDeadPages(h * P, this.windows[g]!, P, h);
  }

  /** Opens every group's route sharing `prefix` (its hit: matchPrefix first), a sliding group its window's pages; all or none. */
  open(
    id: ContinuationId,
    options: { readonly prefix?: readonly PrefixHash[]; readonly reserveTokens?: TokenCount } = {},
  ): void {
    const prefix = options.prefix ?? [];
    this.allOrNone(id, (route, g) =>
      this.pages.openRoute(route, {
        prefix: this.groupHashes(prefix, g),
        window: this.windows[g]!,
        released: this.releasedAt(g, prefix.length),
        ...(options.reserveTokens === undefined ? {} : { reserveTokens: options.reserveTokens }),
      }),
    );
  }

  /** `dst` shares every held page of `src` in every group; all or none. */
  fork(
    src: ContinuationId,
    dst: ContinuationId,
    options: { readonly reserveTokens?: TokenCount } = {},
  ): void {
    this.allOrNone(dst, (route, g) => this.pages.fork(this.routeOf(src, g), route, options));
  }

  /**
   * In-flight prefix sharing over every group (PageManager.adoptPrefix):
   * continuation `id`, idle at a page boundary with `have` pages, extends to
   * the longest hit `to` > have of `prefix` (its own chain) that fits the
   * pool, each group sharing the pages its window reaches at `to` and
   * leaving the others released; all groups or none. The hit is scanned from
   * `have` on (the route holds what it needs below), tagging each group's
   * hashes only as far as the scan reads, so a call costs O(pages scanned ×
   * groups), not O(prompt): it ends where a global group lacks a page (a
   * layout of sliding groups only scans the prompt's rest). A shorter hit
   * may take fewer cached pages, so on a shortfall `to` steps down: at most
   * to − have tries. Returns the pages adopted (0: none).
   */
  adoptInFlight(id: ContinuationId, prefix: readonly PrefixHash[], cache?: ResidencyCosts): number {
    const have = this.pages.route(id).pages.length;
    const G = this.windows.length;
    const P = this.pages.pageTokens;
    // Each group's hashes, filled in [have − 1, hit) only: all that adoptPrefix reads.
    const hashes = this.windows.map(() => new Array<PrefixHash>(prefix.length));
    const at = (g: number, i: number): PrefixHash => (hashes[g]![i] ??= this.groupHash(prefix[i]!, g));
    if (have > 0) for (let g = 0; g < G; g++) at(g, have - 1);
    /** Per sliding group: consecutive pages held ending at h − 1, counted from `have`. */
    const run = new Array<number>(G).fill(0);
    let hit = have;
    for (let h = have + 1; h <= prefix.length; h++) {
      let globalsHold = true;
      let fits = true;
      for (let g = 0; g < G; g++) {
        const held = this.pages.hasSealed(at(g, h - 1), h * P);
        if (this.windows[g] === null) {
          globalsHold &&= held;
          continue;
        }
        run[g] = held ? run[g]! + 1 : 0;
        if (run[g]! < h - Math.max(have, this.releasedAt(g, h))) fits = false;
      }
      if (!globalsHold) break;
      if (fits) hit = h;
    }
    for (let to = hit; to > have; to--) {
      const steps: { route: ContinuationId; g: number; skip: number; need: number }[] = [];
      let total = 0;
      for (let g = 0; g < G; g++) {
        const route = this.routeOf(id, g);
        const skip = Math.max(0, this.releasedAt(g, to) - have);
        const need = this.pages.adoptionNeed(route, hashes[g]!, to, skip);
        if (need === null) break;
        steps.push({ route, g, skip, need });
        total += need;
      }
      if (steps.length < G || total > this.pages.availablePages) continue;
      // Those that give pages back first: then every partial sum stays within the total, so each fits.
      steps.sort((a, b) => a.need - b.need);
      for (const s of steps)
        this.pages.adoptPrefix(s.route, hashes[s.g]!, { to, skip: s.skip, ...(cache ? { cache } : {}) });
      return to - have;
    }
    return 0;
  }

  /** Plans one append in every group (each group's copy-on-write, slots and table); all or none. */
  beginAppend(id: ContinuationId, tokens: TokenCount): readonly AppendPlan[] {
    const plans: AppendPlan[] = [];
    try {
      for (let g = 0; g < this.windows.length; g++)
        plans.push(this.pages.beginAppend(this.routeOf(id, g), tokens));
    } catch (e) {
      for (let g = 0; g < plans.length; g++) this.pages.abortAppend(this.routeOf(id, g));
      throw e;
    }
    return plans;
  }

  /** Commits every group's pending rows; `sealed` are the plain prefix-chain hashes of the pages filled. */
  commitAppend(id: ContinuationId, sealed: readonly PrefixHash[], options: ReleaseOptions = {}): void {
    for (let g = 0; g < this.windows.length; g++)
      this.pages.commitAppend(this.routeOf(id, g), this.groupHashes(sealed, g), options);
  }

  abortAppend(id: ContinuationId): void {
    for (let g = 0; g < this.windows.length; g++) this.pages.abortAppend(this.routeOf(id, g));
  }

  release(id: ContinuationId, options: ReleaseOptions = {}): void {
    for (let g = 0; g < this.windows.length; g++) this.pages.releaseRoute(this.routeOf(id, g), options);
  }

  /** Reserves every group's pages for `totalTokens` rows (a route's reservation covers its whole growth). */
  reserve(id: ContinuationId, totalTokens: TokenCount): void {
    for (let g = 0; g < this.windows.length; g++) this.pages.reserve(this.routeOf(id, g), totalTokens);
  }

  /** Fences every group's route (cancelRoute); each goes when its work in flight quiesces. */
  cancel(id: ContinuationId, options: ReleaseOptions = {}): void {
    for (let g = 0; g < this.windows.length; g++) this.pages.cancelRoute(this.routeOf(id, g), options);
  }

  /** Every group's route of continuation `id`, group 0 first. */
  routes(id: ContinuationId): ContinuationId[] {
    return this.windows.map((_, g) => this.routeOf(id, g));
  }

  /** Over every group: pages still to reserve for `totalTokens` rows, less what is reserved. */
  reservationShortfall(id: ContinuationId, totalTokens: TokenCount): number {
    let n = 0;
    for (const r of this.routes(id))
      n += Math.max(0, this.pages.reservationNeed(r, totalTokens) - this.pages.route(r).reservedPages);
    return n;
  }

  reservedPages(id: ContinuationId): number {
    let n = 0;
    for (const r of this.routes(id)) n += this.pages.route(r).reservedPages;
    return n;
  }

  releasablePages(id: ContinuationId): number {
    let n = 0;
    for (const r of this.routes(id)) n += this.pages.releasablePages(r);
    return n;
  }

  /** The exact hit of `prefix` (matchPrefix) and the cached pages over every group that adopting it takes from the pool. */
  prefixHit(prefix: readonly PrefixHash[]): { readonly pages: number; readonly evictable: number } {
    const pages = this.matchPrefix(prefix);
    let evictable = 0;
    for (let g = 0; g < this.windows.length && pages > 0; g++)
      evictable += this.pages.evictableIn(
        this.groupHashes(prefix.slice(0, pages), g),
        this.releasedAt(g, pages),
      );
    return { pages, evictable };
  }

  /** Pages the continuation holds, over every group (its tables less the released entries). */
  heldPages(id: ContinuationId): number {
    let n = 0;
    for (let g = 0; g < this.windows.length; g++) {
      const r = this.pages.route(this.routeOf(id, g));
      n += r.pages.length - r.releasedPages;
    }
    return n;
  }

  private allOrNone(id: ContinuationId, make: (route: ContinuationId, g: number) => unknown): void {
    let g = 0;
    try {
      for (; g < this.windows.length; g++) make(this.routeOf(id, g), g);
    } catch (e) {
      for (let k = 0; k < g; k++) this.pages.releaseRoute(this.routeOf(id, k));
      throw e;
    }
  }
}

/** One lane of a grouped step: its rows and each group's plan for them. */
export interface GroupedLane {
  readonly tokens: readonly number[];
  readonly firstPosition: number;
  readonly plans: readonly AppendPlan[];
  readonly wantLogits: boolean;
}

/**
 * The engine batch of grouped lanes: rows as buildBatch lays them out, then
 * pageTable [G, S, ptStride] and slotMapping [G, T], group-major. Every
 * group's table of a lane has the same length (one per page of its rows).
 */
export function buildGroupedBatch(lanes: readonly GroupedLane[], groups: number): StepBatch {
  const built = Array.from(
    { length: groups },
    (_, g) =>
      buildBatch(
        lanes.map(
          (l): Lane => ({
            tokens: l.tokens,
            firstPosition: l.firstPosition,
            slots: l.plans[g]!.slots,
            pageTable: l.plans[g]!.pageTable,
            wantLogits: l.wantLogits,
          }),
        ),
      ).batch,
  );
  const first = built[0]!;
  const slotMapping = new Int32Array(groups * first.slotMapping.length);
  const pageTable = new Int32Array(groups * first.pageTable.length);
  built.forEach((b, g) => {
    if (b.ptStride !== first.ptStride)
      throw new RangeError(`group ${g}: page-table stride differs from group 0's`);
    slotMapping.set(b.slotMapping, g * first.slotMapping.length);
    pageTable.set(b.pageTable, g * first.pageTable.length);
  });
  return { ...first, slotMapping, pageTable };
}

const GROUP_TAG = "continuum/layer-group/v1";

/** The tag cache's bound: 16 Ki pages of chain (256 Ki tokens at 16-token pages), a few MiB. */
export const TAGGED_CACHE = 16_384;

/** Group g's hashes of a plain prefix-chain: the chain itself for group 0. */
export function groupHashes(hashes: readonly PrefixHash[], g: number): readonly PrefixHash[] {
  return g === 0 ? hashes : hashes.map((h) => groupHash(h, g));
}

/** Group g's hash of a page whose prefix-chain hash is h: sha256(tag ‖ u32 g ‖ h). */
export function groupHash(h: PrefixHash, g: number): PrefixHash {
  const n = Buffer.alloc(4);
  n.writeUInt32LE(g);
  return PrefixHash(
    createHash("sha256").update(GROUP_TAG).update(n).update(Buffer.from(h, "hex")).digest("hex"),
  );
}
