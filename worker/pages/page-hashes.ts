import { chainHash, chainRoot } from "../../schema/identity.ts";
import type { PrefixHash } from "../../schema/ids.ts";

/**
 * Page-granular prefix identity: page i's hash is the prefix-chain hash of
 * its tokens with page i−1's hash as parent (the tenant's salted root for page
 * 0). Equal hashes mean equal tokens from position 0, so a resident page with
 * that hash holds exactly the attention state this prefix needs. Only full
 * pages have identity; a partial tail never matches.
 *
 * Kept incrementally per sequence: `extend` hashes the pages that became full
 * since the last call, so each token is hashed once.
 */
export class PageHashChain {
  private readonly hashes: PrefixHash[] = [];

  constructor(
    private readonly pageTokens: number,
    private readonly salt: string | undefined,
  ) {}

  /** Hashes of the full pages within tokens[0, rows), computing the missing ones. */
  extend(tokens: readonly number[], rows: number): readonly PrefixHash[] {
    const full = this.fill(tokens, rows);
    return full === this.hashes.length ? this.hashes : this.hashes.slice(0, full);
  }

  /** Hash of page `index` when it is a full page within tokens[0, rows); else null. */
  at(tokens: readonly number[], rows: number, index: number): PrefixHash | null {
    return index < this.fill(tokens, rows) ? this.hashes[index]! : null;
  }

  /** Computes the missing hashes of the full pages within tokens[0, rows); returns their count. */
  private fill(tokens: readonly number[], rows: number): number {
    const full = Math.floor(rows / this.pageTokens);
    for (let i = this.hashes.length; i < full; i++) {
      const parent = i === 0 ? chainRoot(this.salt) : this.hashes[i - 1]!;
      this.hashes.push(chainHash(parent, tokens.slice(i * this.pageTokens, (i + 1) * this.pageTokens)));
    }
    return full;
  }
}
