import type { CatalogOp } from "../../schema/catalog.ts";
import type { ModelFingerprint, NodeId } from "../../schema/ids.ts";

/**
 * Demand observations for the catalog (pure: time is passed in). Each routed
 * request counts once for the deepest chunk of its chain that was published
 * when it was routed (a request reaching a chunk reaches its ancestors too;
 * placement credits them). A window's counts leave as one `demand.observed`
 * op per (node, tenant), stamped with the window's end.
 *
 * Bound: at most `maxKeys` (node, tenant) pairs per window; observations of
 * further pairs are dropped and counted (an observation, not an
 * acknowledged write).
 */
export class DemandWindow {
  private counts = new Map<string, { node: NodeId; tenant: string; count: number }>();
  dropped = 0;

  constructor(
    private readonly fingerprint: ModelFingerprint,
    readonly maxKeys: number,
  ) {
    if (!Number.isSafeInteger(maxKeys) || maxKeys < 1)
      throw new RangeError(`maxKeys must be an integer ≥ 1, got ${maxKeys}`);
  }

  observe(node: NodeId, tenant: string): void {
    const k = `${node}|${tenant}`;
    const e = this.counts.get(k);
    if (e !== undefined) {
      e.count++;
      return;
    }
    if (this.counts.size >= this.maxKeys) {
      this.dropped++;
      return;
    }
    this.counts.set(k, { node, tenant, count: 1 });
  }

  /** The window's ops (sorted by node, tenant), and a fresh window. */
  drain(endMs: number): CatalogOp[] {
    const out: CatalogOp[] = [...this.counts.values()]
      .sort((a, b) => (a.node !== b.node ? (a.node < b.node ? -1 : 1) : a.tenant < b.tenant ? -1 : 1))
      .map((e) => ({
        op: "demand.observed" as const,
        node: e.node,
        model: this.fingerprint,
        tenant: e.tenant,
        time: endMs,
        count: e.count,
      }));
    this.counts = new Map();
    return out;
  }
}
