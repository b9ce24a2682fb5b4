import type { ModelSpec } from "../../native/model-spec.ts";
import { catalogNodeId, contentId } from "../../schema/identity.ts";
import type { ContentId, ModelFingerprint, NodeId, PrefixHash } from "../../schema/ids.ts";
import type { ChunkMeta } from "../store/chunk.ts";

/**
 * The durable chunk format: token-major, so a chunk's bytes (and so its
 * content id) never depend on the page size that produced them.
 *
 * A chunk holds token rows [start, start + tokens) of one continuation. Its
 * payload, for each layer l ascending:
 *
 *   K rows [tokens, nKv, headDim]  fp16 little-endian
 *   V rows [tokens, nKv, vHeadDim] fp16 little-endian
 *
 * so layer l begins at l · tokens · (kRow + vRow) bytes, where kRow = nKv ·
 * headDim · 2 and vRow = nKv · vHeadDim · 2.
 *
 * The engine's page bytes (native/engine.ts) are page-major: for each page,
 * for each layer, the K page [pageTokens, nKv, headDim] then the V page
 * [pageTokens, nKv, vHeadDim]. Within one page and layer, rows are contiguous,
 * so converting between the two copies runs of rows: a row run never crosses
 * a page boundary and is one memcpy per layer per K/V.
 */
export const CHUNK_FORMAT = "continuum/kv-chunk/v1";

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
  ) {
    for (const [k, v] of Object.entries({ nLayers, nKvHeads, headDim, vHeadDim })) {
      if (!Number.isSafeInteger(v) || v < 1)
        throw new RangeError(`KvGeometry.${k} must be a positive integer`);
    }
    this.kRow = nKvHeads * headDim * 2;
    this.vRow = nKvHeads * vHeadDim * 2;
    this.tokenBytes = nLayers * (this.kRow + this.vRow);
  }

  static of(spec: Pick<ModelSpec, "nLayers" | "nKvHeads" | "headDim" | "vHeadDim">): KvGeometry {
    return new KvGeometry(spec.nLayers, spec.nKvHeads, spec.headDim, spec.vHeadDim ?? spec.headDim);
  }

  /** Bytes of one engine page of `pageTokens` rows (= engine.pageBytes). */
  pageBytes(pageTokens: number): number {
    return pageTokens * this.tokenBytes;
  }

  chunkBytes(tokens: number): number {
    return tokens * this.tokenBytes;
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
 * Copies rows [from, from + count) between a token-major chunk payload (whose
 * row 0 is route row `chunkStart`) and a page span, in the direction given.
 * For each layer, each maximal run of rows inside one page is one copy of K and
 * one of V:
 *   page offset  = (row − firstPageRow) / P · pageBytes + l · P · (kRow + vRow) + (row mod P) · kRow
 *   chunk offset = l · chunkTokens · (kRow + vRow) + (row − chunkStart) · kRow
 * (V: add P · kRow in the page, chunkTokens · kRow in the chunk, and use vRow.)
 */
function copyRows(
  g: KvGeometry,
  chunk: Uint8Array,
  chunkStart: number,
  chunkTokens: number,
  span: PageSpan,
  from: number,
  count: number,
  toChunk: boolean,
): void {
  if (chunk.byteLength !== g.chunkBytes(chunkTokens))
    throw new RangeError(`chunk payload is ${chunk.byteLength} bytes, expected ${g.chunkBytes(chunkTokens)}`);
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
    for (let l = 0; l < g.nLayers; l++) {
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

/** Packs rows [start, start + tokens) from page-major bytes into a new token-major chunk payload. */
export function packChunk(g: KvGeometry, span: PageSpan, start: number, tokens: number): Uint8Array {
  const out = new Uint8Array(g.chunkBytes(tokens));
  copyRows(g, out, start, tokens, span, start, tokens, true);
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
): void {
  copyRows(g, payload, chunkStart, chunkTokens, span, from, count, false);
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
    bytes: d.bytes,
  };
}

/** Descriptor and content id of a payload for chain node (prefix, parent) at [start, start + tokens). */
export function describeChunk(
  fingerprint: ModelFingerprint,
  layout: string,
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
    bytes: payload.byteLength,
  };
  const meta = chunkMeta(descriptor);
  return { descriptor, meta, id: contentId(payload, meta) };
}

/**
 * Checks that verified metadata is the chunk the catalog promised: the same
 * node, range, model, layout and size. Content ids already tie bytes to
 * metadata; this ties the metadata to the plan. Returns the reason it is not,
 * or null.
 */
export function metaMismatch(meta: ChunkMeta, expected: ChunkDescriptor): string | null {
  const want = chunkMeta(expected);
  for (const [k, v] of Object.entries(want)) {
    if (meta[k] !== v) return `metadata ${k} is ${JSON.stringify(meta[k])}, expected ${JSON.stringify(v)}`;
  }
  return null;
}
