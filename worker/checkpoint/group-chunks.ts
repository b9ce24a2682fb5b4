import type { ChainNode } from "../../schema/identity.ts";
import type { LayerGroups } from "../model/layout.ts";
import { groupHash } from "../pages/layer-groups.ts";
import { layerMask } from "./chunk-format.ts";

/**
 * What one layer group's durable chunks are: their layers (the mask their
 * metadata records, the page slots they hold) and the chain they publish
 * under. Group g > 0 tags every chain hash with g exactly as GroupedRoutes
 * tags its page hashes (groupHash), so each group's chunks form a chain of
 * their own in the catalog, and group 0's is the plain chain (a uniform
 * model's chunks keep their node ids).
 */
export interface GroupChunks {
  readonly group: number;
  /** The layers held, as chunk metadata names them (layerMask). */
  readonly mask: string;
  /** Page slots a chunk of this group fills (its layer count). */
  readonly held: number;
  /** A sliding group's window (null: global). */
  readonly window: number | null;
}

export function groupChunksOf(groups: LayerGroups): GroupChunks[] {
  const nLayers = groups.groupOf.length;
  return groups.groups.map((grp, g) => ({
    group: g,
    mask: layerMask(grp.layers, nLayers),
    held: grp.layers.length,
    window: grp.layout.kind === "sliding" ? grp.layout.window : null,
  }));
}

/** Group g's chain: each node's hash and (below the root) parent tagged with g; the root's parent stays the chain's root. */
export function groupChain(chain: readonly ChainNode[], g: number): ChainNode[] {
  if (g === 0) return [...chain];
  return chain.map((n) => ({
    ...n,
    hash: groupHash(n.hash, g),
    parent: n.start === 0 ? n.parent : groupHash(n.parent, g),
  }));
}
