import { catalogNodeId, prefixChain } from "../../schema/identity.ts";
import type { ModelFingerprint, NodeId, PrefixHash, TokenCount } from "../../schema/ids.ts";
import { PageHashChain } from "../pages/page-hashes.ts";

/**
 * Maps the runtime's page-granular residency onto chunk boundaries, the unit
 * the controller routes by.
 *
 * The runtime keeps only page hashes (no tokens) for its resident prefixes;
 * the controller asks for catalog node ids of whole chunks. For every
 * sequence this worker served, the ledger remembers, per chunk boundary at T
 * tokens, the hash of the page that ends at ⌊T / pageTokens⌋ pages. A
 * boundary is resident while that page hash is resident: a page hash commits
 * to every token before it, so the same hash means the same prefix.
 *
 * When T is not a multiple of pageTokens (chunk and page sizes need not
 * divide), the last T mod pageTokens tokens of the boundary are not in a
 * sealed page; the boundary is still reported at T, and the worker
 * recomputes those few tokens (< one page) — the router's prediction is off
 * by at most one page of prefill.
 *
 * Bounded: at most `capacity` boundaries, least recently served forgotten
 * first. Every ancestor of a boundary is recorded with it, so the reported
 * list stays prefix-closed as long as ancestors are refreshed with their
 * descendants (they are: one sequence records its whole chain at once).
 */
export interface LedgerBoundary {
  readonly nodeId: NodeId;
  readonly tokens: TokenCount;
}

export class ResidentLedger {
  /** Page hash ending a chunk boundary → the boundary (insertion order = recency). */
  private readonly byPage = new Map<PrefixHash, LedgerBoundary>();

  constructor(
    private readonly fingerprint: ModelFingerprint,
    private readonly pageTokens: number,
    private readonly chunkTokens: number,
    readonly capacity: number,
  ) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`ledger capacity must be ≥ 1`);
  }

  get size(): number {
    return this.byPage.size;
  }

  /** Records the chunk boundaries of a served sequence's processed tokens (all but the pending one). */
  record(tokens: readonly number[], salt: string | undefined): void {
    const processed = tokens.slice(0, Math.max(0, tokens.length - 1));
    const chunks = prefixChain(processed, this.chunkTokens, salt);
    if (chunks.length === 0) return;
    const pages = new PageHashChain(this.pageTokens, salt).extend(processed, processed.length);
    for (const c of chunks) {
      const end = c.start + c.count;
      const fullPages = Math.floor(end / this.pageTokens);
      if (fullPages === 0) continue;
      const key = pages[fullPages - 1]!;
      this.byPage.delete(key);
      this.byPage.set(key, {
        nodeId: catalogNodeId(this.fingerprint, c.hash),
        tokens: end as TokenCount,
      });
    }
    while (this.byPage.size > this.capacity) this.byPage.delete(this.byPage.keys().next().value!);
  }

  /** Boundaries whose ending page is resident (per `isResident`), by token count. */
  resident(isResident: (page: PrefixHash) => boolean, limit: number): LedgerBoundary[] {
    const out: LedgerBoundary[] = [];
    for (const [hash, b] of this.byPage) if (isResident(hash)) out.push(b);
    out.sort((a, b) => a.tokens - b.tokens || (a.nodeId < b.nodeId ? -1 : 1));
    return out.slice(0, limit);
  }
}
