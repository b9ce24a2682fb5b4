import {
  type ModelFingerprint,
  type PageCount,
  pagesFor,
  type RequestId,
  TokenCount,
} from "../../schema/ids.ts";
import type { Logger } from "../../schema/log.ts";
import type { CostCalibrator } from "../calibration/calibration.ts";
import type { PrefixRestorer, RouteCheckpointer } from "../pages/durable-hooks.ts";
import type { GroupedRoutes } from "../pages/layer-groups.ts";
import type { PageManager } from "../pages/page-manager.ts";
import { PageError } from "../pages/page-state.ts";
import { type ResidencyCosts, residencyCosts } from "../residency/residency.ts";
import type { PreemptDisposition, RequestRecord } from "../scheduler/request.ts";
import type { Sequence } from "./sequence.ts";

export interface SequencePagesOptions {
  readonly fingerprint: ModelFingerprint;
  readonly pageTokens: number;
  /** Bytes of one page (the engine's), to price a page's reload. */
  readonly pageBytes: number;
  readonly logger: Logger;
  readonly restore?: PrefixRestorer;
  readonly checkpoint?: RouteCheckpointer;
  /** The sequence is still the runtime's and not cancelled (a settled restore applies only then). */
  readonly live: (seq: Sequence) => boolean;
  /** Wakes the loop: a restore settled, or a capture gave back the cached pages it read. */
  readonly signal: () => void;
}

/**
 * How the runtime's sequences hold pages: admission onto the longest held
 * prefix (then a restore of more from the durable cache), in-flight adoption
 * of pages another request sealed since, preemption, and release into the
 * pool's cache when a sequence ends, is preempted or is cancelled. Also the
 * scheduler's view of each sequence's pages (record). A sequence holds one
 * route per layer group (GroupedRoutes; with one group, the plain route).
 */
export class SequencePages {
  /** Requests whose restore is loading pages: not runnable, not preemptible, until it settles. */
  private readonly restoring = new Set<RequestId>();
  readonly counters = { cachedPromptTokens: 0, sharedInFlightTokens: 0, preemptions: 0 };

  private readonly pages: PageManager;

  constructor(
    private readonly routes: GroupedRoutes,
    private readonly calibrator: CostCalibrator,
    private readonly opts: SequencePagesOptions,
  ) {
    this.pages = routes.pages;
  }

  isRestoring(id: RequestId): boolean {
    return this.restoring.has(id);
  }

  /** The scheduler's view of `s`; a waiting request without a route is planned with the prefix it would adopt. */
  record(s: Sequence): RequestRecord {
    const P = this.opts.pageTokens;
    const route = this.pages.hasRoute(s.route) ? this.pages.route(s.route) : undefined;
    let admitPages = 0;
    let processed = s.processed;
    if (s.state === "waiting") {
      if (route) {
        admitPages = this.routes.reservationShortfall(s.route, TokenCount(s.totalRows));
      } else {
        // Adopting an evictable cached page takes it out of what others may use.
        const hit = s.reusesPrefixes
          ? this.routes.prefixHit(s.chain.extend(s.tokens, s.tokens.length - 1))
          : { pages: 0, evictable: 0 };
        admitPages =
          this.routes.windows.length * Math.max(0, pagesFor(TokenCount(s.totalRows), P) - hit.pages) +
          hit.evictable;
        processed = hit.pages * P;
      }
    }
    return {
      id: s.id,
      model: this.opts.fingerprint,
      tokens: s.tokens,
      processed: TokenCount(processed),
      pendingToken: s.tokens[s.tokens.length - 1]!,
      priority: s.priority,
      arrival: s.arrival,
      state: s.state,
      nextPageHash:
        processed < s.tokens.length - 1
          ? s.chain.at(s.tokens, s.tokens.length - 1, Math.floor(processed / P))
          : null,
      runnable: !this.restoring.has(s.id),
      admitPages: admitPages as PageCount,
      reservedPages: (route ? this.routes.reservedPages(s.route) : 0) as PageCount,
      releasablePages: (route ? this.routes.releasablePages(s.route) : 0) as PageCount,
      preempted: s.preempted,
    };
  }

  /**
   * Reserves the sequence's pages (a new route adopts the longest held prefix
   * of its prompt); at first admission, begins a restore of more. False when
   * the pool could not keep the plan's counts: it is planned again next time.
   */
  admit(seq: Sequence): boolean {
    try {
      if (this.pages.hasRoute(seq.route)) {
        this.routes.reserve(seq.route, TokenCount(seq.totalRows));
      } else {
        const hashes = seq.chain.extend(seq.tokens, seq.tokens.length - 1);
        const matched = seq.reusesPrefixes ? this.routes.matchPrefix(hashes) : 0;
        this.routes.open(seq.route, {
          prefix: hashes.slice(0, matched),
          reserveTokens: TokenCount(seq.totalRows),
        });
        seq.processed = matched * this.opts.pageTokens;
      }
    } catch (err) {
      if (err instanceof PageError && err.code === "over-capacity") return false;
      throw err;
    }
    if (seq.cachedTokens < 0) {
      seq.cachedTokens = seq.processed;
      seq.admittedAt = performance.now();
      this.counters.cachedPromptTokens += seq.processed;
      if (seq.reusesPrefixes) this.beginRestore(seq);
    }
    seq.state = "running";
    seq.preempted = null;
    this.opts.logger.log("debug", "request.admitted", { requestId: seq.id, reusedTokens: seq.processed });
    return true;
  }

  /** False when the sequence cannot be preempted now (not running, or its restore is loading). */
  preempt(seq: Sequence, disposition: PreemptDisposition): boolean {
    if (seq.state !== "running" || this.restoring.has(seq.id)) return false;
    this.counters.preemptions++;
    if (disposition === "keep-resident") {
      this.routes.reserve(seq.route, TokenCount(seq.processed));
    } else {
      // Its pages stay cached: the resumption adopts those still there.
      this.retire(seq);
      seq.processed = 0;
    }
    seq.state = "waiting";
    seq.preempted = disposition;
    return true;
  }

  /** Offers the route's full pages to the checkpoint, then releases the route keeping them cached (an ephemeral one: freed). */
  retire(seq: Sequence): void {
    if (!this.pages.hasRoute(seq.route)) return;
    if (seq.ephemeral) {
      this.routes.release(seq.route);
      return;
    }
    const P = this.opts.pageTokens;
    const hashes = seq.chain.extend(seq.tokens, seq.processed);
    const shareable = hashes.slice(0, this.routes.matchPrefix(hashes));
    if (shareable.length > 0) {
      this.opts.checkpoint?.offer({
        prefix: shareable,
        tokens: seq.tokens.slice(0, shareable.length * P),
        salt: seq.salt,
        hits: this.pages.hitsOf(shareable[shareable.length - 1]!, shareable.length * P),
        pages: this.pages,
        calibration: this.calibrator.value,
        released: this.opts.signal,
      });
    }
    this.routes.release(seq.route, { cache: this.residencyCosts() });
  }

  /**
   * Fences the route at once; its pages go when work in flight quiesces.
   * `keep`: what it computed stays cached (a client that gave up may well
   * ask again); a failed request's pages are not kept.
   */
  cancel(seq: Sequence, keep: boolean): void {
    if (!this.pages.hasRoute(seq.route)) return;
    this.routes.cancel(seq.route, keep ? { cache: this.residencyCosts() } : {});
  }

  /**
   * In-flight prefix sharing, the runtime's half (the scheduler decides who
   * waits): a running prompt standing at a page boundary adopts the pages
   * that another request sealed since, continuing its own hash chain, so it
   * computes only what nobody has. Cheap when nothing is new: one index
   * lookup per prefilling request.
   */
  adoptInFlight(seqs: Iterable<Sequence>): void {
    const P = this.opts.pageTokens;
    for (const seq of seqs) {
      if (seq.state !== "running" || seq.cancelled || this.restoring.has(seq.id)) continue;
      if (!seq.reusesPrefixes) continue;
      const rows = seq.tokens.length - 1;
      if (seq.processed >= rows || seq.processed % P !== 0) continue;
      const page = seq.processed / P;
      const next = seq.chain.at(seq.tokens, rows, page);
      if (next === null || !this.pages.hasSealed(next, (page + 1) * P)) continue;
      const adopted = this.routes.adoptInFlight(
        seq.route,
        seq.chain.extend(seq.tokens, rows),
        this.residencyCosts(),
      );
      seq.processed += adopted * P;
      seq.cachedTokens += adopted * P;
      this.counters.cachedPromptTokens += adopted * P;
      this.counters.sharedInFlightTokens += adopted * P;
    }
  }

  /** What a cached page is priced with now: its recompute, and its reload from the local store. */
  residencyCosts(): ResidencyCosts {
    return residencyCosts(this.calibrator.value, this.opts.pageTokens, this.opts.pageBytes);
  }

  /**
   * At first admission, after resident pages were adopted: lets the durable
   * cache restore more of the prompt's prefix into every group's route. While its load is
   * in flight the request is admitted but not runnable; when it settles the
   * request continues from the restored rows, or (the restore gave up, the
   * load abandoned) from its resident rows, recomputing the rest.
   */
  private beginRestore(seq: Sequence): void {
    const restore = this.opts.restore;
    if (!restore) return;
    const ticket = restore.begin({
      routes: this.routes.routes(seq.route),
      tokens: seq.tokens.slice(0, seq.tokens.length - 1),
      pageHashes: seq.chain.extend(seq.tokens, seq.tokens.length - 1),
      salt: seq.salt,
      residentTokens: seq.processed,
      pages: this.pages,
      calibration: this.calibrator.value,
      record: (sample) => this.calibrator.record(sample),
    });
    if (!ticket) return;
    this.restoring.add(seq.id);
    const began = performance.now();
    void ticket.done.then((ok) => {
      this.restoring.delete(seq.id);
      seq.fetchMs = performance.now() - began;
      if (ok && this.opts.live(seq)) {
        this.counters.cachedPromptTokens += ticket.restoreTo - seq.processed;
        seq.processed = ticket.restoreTo;
        seq.cachedTokens = ticket.restoreTo;
      }
      this.opts.signal();
    });
  }
}
