import type { ModelSpec } from "../../native/model-spec.ts";
import { catalogNodeId, contentId } from "../../schema/identity.ts";
import type { ContentId, ModelFingerprint, NodeId, PrefixHash } from "../../schema/ids.ts";
import type { ChunkMeta } from "../store/chunk.ts";

/**
 * The durable chunk format: token-major, so a chunk's bytes (and so its
 * content id) never depend on the page size that produced them.
 *
 * A chunk holds token rows [start, start + tokens) of one continuation, for
 * the layers its metadata's `layers` mask names (one layer group's: all
 * layers of a uniform model; a grouped model's chunk holds one group). Its
 * payload, for each held layer in mask order (the i-th is held layer i):
 *
 *   K rows [tokens, nKv, headDim]  fp16 little-endian
 *   V rows [tokens, nKv, vHeadDim] fp16 little-endian
 *
 * so held layer i begins at i · tokens · (kRow + vRow) bytes, where kRow =
 * nKv · headDim · 2 and vRow = nKv · vHeadDim · 2.
 *
 * The engine's page bytes (native/engine.ts) are page-major: for each page,
 * for each storage slot (a group's layers by rank), the K page [pageTokens,
 * nKv, headDim] then the V page [pageTokens, nKv, vHeadDim]; held layer i is
 * slot i of its group's pages. Within one page and slot, rows are contiguous,
 * so converting between the two copies runs of rows: a row run never crosses
 * a page boundary and is one memcpy per held layer per K/V.
 *
 * v2: the `layers` mask joined the metadata (so the content id), so chunks of
 * different layer sets never collide; v1 chunks held every layer, unnamed.
 */
export const CHUNK_FORMAT = "continuum/kv-chunk/v2";

/**
 * The `layers` mask of a chunk holding `layers` of a model of `nLayers`:
 * their indices ascending, comma-separated ("0,1,2" for a 3-layer uniform
 * model, "5,11" for Gemma 3's global group). Refuses any other set.
 */
export function layerMask(layers: readonly number[], nLayers: number): string {
  if (layers.length === 0) throw new RangeError("a chunk holds at least one layer");
  layers.forEach((l, i) => {
    if (!Number.isSafeInteger(l) || l < 0 || l >= nLayers || (i > 0 && l <= layers[i - 1]!))
      throw new RangeError(
        `layers [${layers.join(",")}] are not ascending distinct indices of a ${nLayers}-layer model`,
      );
  });
  return layers.join(",");
}

/** Byte geometry of one model's attention state. */
export class KvGeometry {
  /** Bytes of one token's K across kv heads (one layer). */
  readonly kRow: number;
  readonly vRow: number;
  /** Bytes of one token row across all layers, K and V. */
  readonly tokenBytes: number;

  constructor(
    readonly nLayers: number,
    readonly nKvHeads: number,
    readonly headDim: number,
    readonly vHeadDim: number,
    /** Layers' K/V one engine page holds (the pool's largest layer group; every layer with one group). */
    readonly slots: number = nLayers,
  ) {
    for (const [k, v] of Object.entries({ nLayers, nKvHeads, headDim, vHeadDim, slots })) {
      if (!Number.isSafeInteger(v) || v < 1)
        throw new RangeError(`KvGeometry.${k} must be a positive integer`);
    }
    if (slots > nLayers) throw new RangeError(`KvGeometry.slots ${slots} exceeds the ${nLayers} layers`);
    this.kRow = nKvHeads * headDim * 2;
    this.vRow = nKvHeads * vHeadDim * 2;
    this.tokenBytes = nLayers * (this.kRow + this.vRow);
  }

  static of(
    spec: Pick<ModelSpec, "nLayers" | "nKvHeads" | "headDim" | "vHeadDim">,
    slots: number = spec.nLayers,
  ): KvGeometry {
    return new KvGeometry(spec.nLayers, spec.nKvHeads, spec.headDim, spec.vHeadDim ?? spec.headDim, slots);
  }

  /** Bytes of one engine page of `pageTokens` rows (= engine.pageBytes): slots · pageTokens · (kRow + vRow). */
  pageBytes(pageTokens: number): number {
    return pageTokens * this.slots * (this.kRow + this.vRow);
  }

  /** Bytes of a chunk of `tokens` rows holding `layers` layers (default all). */
  chunkBytes(tokens: number, layers: number = this.nLayers): number {
    return tokens * layers * (this.kRow + this.vRow);
  }
}

/**
 * Page-major bytes covering a run of pages, the first of which holds route row
 * `firstPageRow` (a multiple of pageTokens). Rows outside the run are not there.
 */
export interface PageSpan {
  readonly bytes: Uint8Array;
  readonly firstPageRow: number;
  readonly pageTokens: number;
}

function checkSpan(g: KvGeometry, span: PageSpan, from: number, count: number): void {
  const P = span.pageTokens;
  if (!Number.isSafeInteger(P) || P < 1) throw new RangeError(`pageTokens must be positive, got ${P}`);
  if (span.firstPageRow % P !== 0)
    throw new RangeError(`page span starts at row ${span.firstPageRow}, not a page boundary of ${P}`);
  if (span.bytes.byteLength % g.pageBytes(P) !== 0)
    throw new RangeError(
      `page span of ${span.bytes.byteLength} bytes is not whole pages of ${g.pageBytes(P)}`,
    );
  const pages = span.bytes.byteLength / g.pageBytes(P);
  if (from < span.firstPageRow || from + count > span.firstPageRow + pages * P)
    throw new RangeError(
      `rows [${from}, ${from + count}) are outside the span's rows [${span.firstPageRow}, ${span.firstPageRow + pages * P})`,
    );
}

/**
 * Copies rows [from, from + count) between a token-major chunk payload of
 * `held` layers (whose row 0 is route row `chunkStart`) and a page span, in
 * the direction given. For each held layer l (page slot l), each maximal run
 * of rows inside one page is one copy of K and one of V:
 *   page offset  = (row − firstPageRow) / P · pageBytes + l · P · (kRow + vRow) + (row mod P) · kRow
 *   chunk offset = l · chunkTokens · (kRow + vRow) + (row − chunkStart) · kRow
 * (V: add P · kRow in the page, chunkTokens · kRow in the chunk, and use vRow.)
 */
function copyRows(
  g: KvGeometry,
  held: number,
  chunk: Uint8Array,
  chunkStart: number,
  chunkTokens: number,
  span: PageSpan,
  from: number,
  count: number,
  toChunk: boolean,
): void {
  if (!Number.isSafeInteger(held) || held < 1 || held > g.slots)
    throw new RangeError(`a chunk of ${held} layers does not fit pages of ${g.slots} slots`);
  if (chunk.byteLength !== g.chunkBytes(chunkTokens, held))
    throw new RangeError(
      `chunk payload is ${chunk.byteLength} bytes, expected ${g.chunkBytes(chunkTokens, held)}`,
    );
  if (from < chunkStart || from + count > chunkStart + chunkTokens)
    throw new RangeError(
      `rows [${from}, ${from + count}) are outside the chunk [${chunkStart}, ${chunkStart + chunkTokens})`,
    );
  checkSpan(g, span, from, count);
  const P = span.pageTokens;
  const { kRow, vRow } = g;
  const pageBytes = g.pageBytes(P);
  const pageLayer = P * (kRow + vRow);
  const chunkLayer = chunkTokens * (kRow + vRow);
  const pages = span.bytes;
  for (let row = from; row < from + count; ) {
    const rel = row - span.firstPageRow;
    const page = Math.floor(rel / P);
    const inPage = rel % P;
    const run = Math.min(P - inPage, from + count - row);
    const c = row - chunkStart;
    for (let l = 0; l < held; l++) {
      const pk = page * pageBytes + l * pageLayer + inPage * kRow;
      const pv = page * pageBytes + l * pageLayer + P * kRow + inPage * vRow;
      const ck = l * chunkLayer + c * kRow;
      const cv = l * chunkLayer + chunkTokens * kRow + c * vRow;
      if (toChunk) {
        chunk.set(pages.subarray(pk, pk + run * kRow), ck);
        chunk.set(pages.subarray(pv, pv + run * vRow), cv);
      } else {
        pages.set(chunk.subarray(ck, ck + run * kRow), pk);
        pages.set(chunk.subarray(cv, cv + run * vRow), pv);
      }
    }
    row += run;
  }
}

/**
 * Packs rows [start, start + tokens) from page-major bytes into a new
 * token-major chunk payload of the pages' first `held` slots (default all
 * layers: one group of every layer).
 */
export function packChunk(
  g: KvGeometry,
  span: PageSpan,
  start: number,
  tokens: number,
  held: number = g.nLayers,
): Uint8Array {
  const out = new Uint8Array(g.chunkBytes(tokens, held));
  copyRows(g, held, out, start, tokens, span, start, tokens, true);
  return out;
}

/**
 * Writes rows [from, from + count) of a chunk payload (row 0 = route row
 * `chunkStart`) into page-major bytes; other rows of the pages are untouched,
 * so a page a chunk covers only partly keeps the rows another chunk wrote.
 */
export function unpackChunk(
  g: KvGeometry,
  payload: Uint8Array,
  chunkStart: number,
  chunkTokens: number,
  span: PageSpan,
  from: number,
  count: number,
  held: number = g.nLayers,
): void {
  copyRows(g, held, payload, chunkStart, chunkTokens, span, from, count, false);
}

/** What a chunk's metadata records; all of it is covered by the content id. */
export interface ChunkDescriptor {
  readonly node: NodeId;
  readonly prefix: PrefixHash;
  readonly parent: PrefixHash;
  readonly fingerprint: ModelFingerprint;
  readonly start: number;
  readonly tokens: number;
  readonly layout: string;
  /** The layers held (layerMask). */
  readonly layers: string;
  readonly bytes: number;
}

export function chunkMeta(d: ChunkDescriptor): ChunkMeta {
  return {
    format: CHUNK_FORMAT,
    node: d.node,
    prefix: d.prefix,
    parent: d.parent,
    fingerprint: d.fingerprint,
    start: d.start,
    tokens: d.tokens,
    layout: d.layout,
    layers: d.layers,
    bytes: d.bytes,
  };
}

/** Descriptor and content id of a payload for chain node (prefix, parent) at [start, start + tokens). */
export function describeChunk(
  fingerprint: ModelFingerprint,
  layout: string,
  layers: string,
  node: {
    readonly hash: PrefixHash;
    readonly parent: PrefixHash;
    readonly start: number;
    readonly count: number;
  },
  payload: Uint8Array,
): { descriptor: ChunkDescriptor; meta: ChunkMeta; id: ContentId } {
  const descriptor: ChunkDescriptor = {
    node: catalogNodeId(fingerprint, node.hash),
    prefix: node.hash,
    parent: node.parent,
    fingerprint,
    start: node.start,
    tokens: node.count,
    layout,
    layers,
    bytes: payload.byteLength,
  };
  const meta = chunkMeta(descriptor);
  return { descriptor, meta, id: contentId(payload, meta) };
}

/**
 * Checks that verified metadata is the chunk the catalog promised: the same
 * format, node, range, model, layout, layer mask and size. Content ids already tie bytes to
 * metadata; this ties the metadata to the plan. Returns the reason it is not,
 * or null.
 */
export function metaMismatch(meta: ChunkMeta, expected: ChunkDescriptor): string | null {
  if (meta.format === CHUNK_FORMAT && meta.layers !== expected.layers)
    return `chunk holds layers ${JSON.stringify(meta.layers)}, expected ${JSON.stringify(expected.layers)}`;
  const want = chunkMeta(expected);
  for (const [k, v] of Object.entries(want)) {
    if (meta[k] !== v) return `metadata ${k} is ${JSON.stringify(meta[k])}, expected ${JSON.stringify(v)}`;
  }
  return null;
}
