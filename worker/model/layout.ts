/**
 * The attention-state layout of a model, one entry per layer: which earlier
 * positions a layer's attention reads, and so which of its K/V rows a
 * sequence must keep.
 *
 *   global        a query at position p reads keys 0 .. p
 *   sliding(W)    a query at position p reads keys max(0, p − W + 1) .. p, the
 *                 last W positions (Hugging Face's mask kv_idx > q_idx − W)
 *
 * A sliding layer's K/V row at position j is read by queries j .. j + W − 1
 * only, so once a sequence has reached position n every row below n − W + 1
 * is dead for that layer. When every layer is sliding, a page of rows dead
 * for the widest window is dead for all of them and the page pool releases
 * it (releaseWindow). With global layers too, layerGroups gives each layout
 * its own page tables, so a sliding group's pages can go while the global
 * group keeps its own (the engine, PagedDecoder and the worker runtime's
 * GroupedRoutes do). The layout is part of the model
 * fingerprint (fingerprint.ts), so workers whose layers attend differently
 * never share attention state.
 */
export type AttentionLayout =
  | { readonly kind: "global" }
  | { readonly kind: "sliding"; readonly window: number };

export const GLOBAL_LAYER: AttentionLayout = { kind: "global" };

/**
 * The name of the all-global layout. In the fingerprint, so it versions the
 * chunks too: v2 came with chunk format v2 (chunks name their layers), so a
 * catalog that outlives an upgrade never holds v1 chunks on v2's node ids.
 */
export const KV_LAYOUT = "kv-gqa/v2";

/**
 * A sliding layer of window W. A window that covers every position the model
 * supports (W ≥ maxPosition) reads exactly what a global layer reads, so it
 * is the global layout: one computation, one name, one fingerprint.
 */
export function slidingLayer(window: number, maxPosition: number): AttentionLayout {
  if (!Number.isSafeInteger(window) || window < 1)
    throw new RangeError(`a sliding window must be a positive integer, got ${window}`);
  return window >= maxPosition ? GLOBAL_LAYER : { kind: "sliding", window };
}

/**
 * The manifest's layout field: "kv-gqa/v2" when every layer is global (the
 * name every all-global model had before), else that name with the layers as
 * runs, e.g. "kv-gqa/v2;layers=s512x5,g,s512x5,g" (s<W> sliding, g global,
 * x<N> a run of N equal layers, layer 0 first).
 */
export function layoutName(layers: readonly AttentionLayout[]): string {
  if (layers.every((l) => l.kind === "global")) return KV_LAYOUT;
  const code = (l: AttentionLayout) => (l.kind === "global" ? "g" : `s${l.window}`);
  const runs: string[] = [];
  for (let i = 0; i < layers.length; ) {
    const c = code(layers[i]!);
    let n = 1;
    while (i + n < layers.length && code(layers[i + n]!) === c) n++;
    runs.push(n === 1 ? c : `${c}x${n}`);
    i += n;
  }
  return `${KV_LAYOUT};layers=${runs.join(",")}`;
}

/** The windows as the native engine takes them: 0 for a global layer, W for sliding. */
export function layerWindows(layers: readonly AttentionLayout[]): Int32Array {
  return Int32Array.from(layers, (l) => (l.kind === "global" ? 0 : l.window));
}

/** The layouts an engine spec's layerWindows give (layerWindows' inverse; absent: every layer global). */
export function layoutsOfWindows(windows: Int32Array | undefined, nLayers: number): AttentionLayout[] {
  return Array.from({ length: nLayers }, (_, i) => {
    const w = windows?.[i] ?? 0;
    return w === 0 ? GLOBAL_LAYER : { kind: "sliding", window: w };
  });
}

/**
 * The window outside which a page of every layer's rows is dead: the widest
 * window when every layer is sliding, null when some layer is global (a page
 * holds all layers' rows, and a global layer reads them all).
 */
export function releaseWindow(layers: readonly AttentionLayout[]): number | null {
  let widest = 0;
  for (const l of layers) {
    if (l.kind === "global") return null;
    widest = Math.max(widest, l.window);
  }
  return layers.length === 0 ? null : widest;
}

/** Layers that share one page table: all global, or all sliding with one window. */
export interface LayerGroup {
  readonly layout: AttentionLayout;
  /** Layer indices, ascending; a layer's storage slot in a page is its index here. */
  readonly layers: readonly number[];
}

/** How a model's layers share page tables (native createPool's layerGroups). */
export interface LayerGroups {
  readonly groups: readonly LayerGroup[];
  /** The group of each layer, as the engine's createPool takes it. */
  readonly groupOf: Int32Array;
  /** Layers' K/V one page holds: the largest group. */
  readonly slots: number;
}

/**
 * The page-table groups of a layout, after vLLM's hybrid KV cache manager:
 * layers of one layout form its kind (the global layers first, then each
 * window by first appearance), and every kind is cut, in layer order, into
 * groups of k layers, k the smallest kind's size, so every group fills
 * (almost) every slot of the pages it owns. A uniform layout is one group
 * of every layer, the table every model had before; Gemma 3's 5 sliding to
 * 1 global makes groups of the global count, so a sequence long past the
 * window holds pages in proportion to its global layers.
 */
export function layerGroups(layers: readonly AttentionLayout[]): LayerGroups {
  if (layers.length === 0) return { groups: [], groupOf: new Int32Array(0), slots: 0 };
  const key = (l: AttentionLayout) => (l.kind === "global" ? "g" : `s${l.window}`);
  const kinds = new Map<string, number[]>();
  if (layers.some((l) => l.kind === "global")) kinds.set("g", []);
  layers.forEach((l, i) => {
    const k = key(l);
    if (!kinds.has(k)) kinds.set(k, []);
    kinds.get(k)!.push(i);
  });
  const size = Math.min(...[...kinds.values()].map((ls) => ls.length));
  const groups: LayerGroup[] = [];
  for (const ls of kinds.values())
    for (let i = 0; i < ls.length; i += size)
      groups.push({ layout: layers[ls[0]!]!, layers: ls.slice(i, i + size) });
  const groupOf = new Int32Array(layers.length);
  groups.forEach((g, gi) => {
    for (const l of g.layers) groupOf[l] = gi;
  });
  return { groups, groupOf, slots: size };
}
