import { Packr } from "msgpackr";
import { openMessage, WIRE_VERSION, WireError } from "../../schema/wire.ts";
import { CatalogLogError } from "../log.ts";
import { type BatchLimits, groups } from "./grouping.ts";

/**
 * Packed Kafka records: several catalog messages in one Kafka record value
 * (catalog/WIRE.md, "Packed records"). Pure: bytes in, bytes out.
 *
 * Why: kafkajs spends a fixed cost per produced record (an encoder with a
 * zeroed buffer, varints, headers, copies) that dwarfs a catalog message's
 * bytes; a packed record pays it once for up to `maxItems` messages
 * (measurements: bench/catalog.md).
 *
 * Format: one msgpack map `{v: 1, kind, <field>: [bin, …]}` where each bin is
 * one complete wire message, exactly as it would be a record value on its
 * own (so a third-party reader decodes the outer map, then each bin as it
 * would decode a single record).
 *
 *   kind                      field        items
 *   catalog.proposal.batch    proposals    encoded catalog.proposal messages
 *   catalog.tx.batch          txs          encoded catalog.tx messages, consecutive logical offsets
 */
export interface PackedKind {
  readonly kind: string;
  readonly field: string;
  /** Most items one record may carry (the reader refuses more). */
  readonly maxItems: number;
  /** Most bytes one packed record may have (the reader refuses more). */
  readonly maxBytes: number;
}

/**
 * Proposal batches: the proposer packs what it queued within one event-loop
 * turn; the writer unpacks and decides each proposal on its own (own
 * idempotency key, own rejection). Bounds: 4,096 proposals and 4 MiB, above
 * the proposer's defaults (DEFAULT_PROPOSAL_SEND) so our own batches always
 * fit, and far below the topic's 20 MiB record limit.
 */
export const PROPOSAL_BATCH: PackedKind = {
  kind: "catalog.proposal.batch",
  field: "proposals",
  maxItems: 4_096,
  maxBytes: 4 << 20,
};

/**
 * Tx batches: the writer packs consecutive txs of one Kafka transaction.
 * At most 512 txs per record: readers rely on it to seek (a record holding
 * logical offset N sits at partition offset ≥ ⌊N / 512⌋, see catalog/kafka/reader.ts).
 * 1 MiB per record unless one tx alone is larger (a tx is at most 16 MiB).
 */
export const TX_BATCH: PackedKind = {
  kind: "catalog.tx.batch",
  field: "txs",
  maxItems: 512,
  maxBytes: 20 << 20,
};
/** Bytes the writer aims to put in one tx record (a single larger tx still gets its own). */
const TX_RECORD_TARGET_BYTES = 1 << 20;
/** Bounds of one tx record the writer packs. */
const TX_RECORD: BatchLimits = { maxRecords: TX_BATCH.maxItems, maxBytes: TX_RECORD_TARGET_BYTES };

/** A packed record that is not acceptable: `oversized` (over a bound) or `malformed`. */
export class PackedRecordError extends WireError {
  constructor(
    readonly problem: "oversized" | "malformed",
    message: string,
  ) {
    super(message);
  }
}

// The same settings as schema/wire.ts: plain maps, arrays and bins, readable by any msgpack decoder.
const packr = new Packr({ useRecords: false, moreTypes: false, mapsAsObjects: true, variableMapSize: true });

/** Packs `items` (each a complete wire message) into one record value. Throws on a count or size over the kind's bounds. */
export function pack(k: PackedKind, items: readonly Uint8Array[]): Buffer {
  if (items.length < 1 || items.length > k.maxItems) {
    throw new PackedRecordError("oversized", `${k.kind}: ${items.length} items, must be 1..${k.maxItems}`);
  }
  const out = packr.pack({ v: WIRE_VERSION, kind: k.kind, [k.field]: items });
  if (out.length > k.maxBytes) {
    throw new PackedRecordError(
      "oversized",
      `${k.kind}: ${out.length} bytes, over the ${k.maxBytes}-byte limit`,
    );
  }
  return out;
}

/**
 * Whether `bytes` claim to be a packed record of kind `k`: a cheap scan for
 * the kind's name, so a plain message is not unpacked twice. A false
 * positive (a plain message that contains the name) only costs the full
 * check in `unpack`, which then says "not packed".
 */
export function mayBePacked(k: PackedKind, bytes: Uint8Array): boolean {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).indexOf(k.kind, 0, "latin1") >= 0;
}

/**
 * The items of a packed record (views into `bytes`, no copy); `undefined`
 * when the bytes are a well-formed envelope of another kind (a plain
 * message). Throws WireError naming what is wrong when they are of kind `k`
 * but malformed or over its bounds, or are no envelope at all.
 */
export function unpack(k: PackedKind, bytes: Uint8Array): Uint8Array[] | undefined {
  if (bytes.length > k.maxBytes && mayBePacked(k, bytes)) {
    throw new PackedRecordError(
      "oversized",
      `${k.kind}: ${bytes.length} bytes, over the ${k.maxBytes}-byte limit`,
    );
  }
  let env: ReturnType<typeof openMessage>;
  try {
    env = openMessage(bytes);
  } catch (err) {
    throw new PackedRecordError("malformed", (err as Error).message);
  }
  if (env.kind !== k.kind) return undefined;
  return packedItems(k, env.value, bytes.length);
}

/**
 * The items of an opened envelope of kind `k` (`value` as openMessage
 * returns it, of a record of `byteLength` bytes), views into its bytes.
 * Throws PackedRecordError when it is over the kind's bounds or malformed.
 */
export function packedItems(k: PackedKind, value: Record<string, unknown>, byteLength: number): Uint8Array[] {
  if (byteLength > k.maxBytes) {
    throw new PackedRecordError(
      "oversized",
      `${k.kind}: ${byteLength} bytes, over the ${k.maxBytes}-byte limit`,
    );
  }
  const items = value[k.field];
  if (!Array.isArray(items)) {
    throw new PackedRecordError(
      "malformed",
      `${k.kind}: field '${k.field}' must be an array of msgpack bins`,
    );
  }
  if (items.length > k.maxItems) {
    throw new PackedRecordError(
      "oversized",
      `${k.kind}: ${items.length} items, over the limit of ${k.maxItems}`,
    );
  }
  if (items.length < 1) throw new PackedRecordError("malformed", `${k.kind}: no items`);
  for (let i = 0; i < items.length; i++) {
    if (!(items[i] instanceof Uint8Array)) {
      throw new PackedRecordError(
        "malformed",
        `${k.kind}: item ${i} is not a msgpack bin (each item is one encoded message)`,
      );
    }
  }
  return items as Uint8Array[];
}

/**
 * Header of every record the writer appends: the logical offset (decimal)
 * of its first message. catalog.tx is written only inside Kafka
 * transactions, so its partition offsets have holes (commit/abort markers,
 * aborted records); the n-th committed tx is logical offset n, in Kafka as
 * in the embedded log.
 */
export const OFFSET_HEADER = "continuum-offset";

/** The logical offset a record's header carries; throws naming the record when it has none. */
export function logicalOffset(
  headers: Record<string, unknown> | undefined,
  topic: string,
  kafkaOffset: string,
): number {
  const h = headers?.[OFFSET_HEADER];
  const n = h === undefined ? Number.NaN : Number(Buffer.isBuffer(h) ? h.toString("utf8") : String(h));
  if (!Number.isSafeInteger(n) || n < 0) {
    throw new CatalogLogError(`${topic}@${kafkaOffset}: record has no valid ${OFFSET_HEADER} header`);
  }
  return n;
}

/**
 * Packs consecutive txs into `catalog.tx.batch` records (at most
 * TX_BATCH.maxItems txs and TX_RECORD_TARGET_BYTES each, or one larger tx
 * alone), each stamped with the logical offset of its first tx.
 */
export function packTxs(
  txs: readonly Uint8Array[],
  from: number,
): Array<{ value: Buffer; headers: Record<string, string> }> {
  const out: Array<{ value: Buffer; headers: Record<string, string> }> = [];
  let at = from;
  for (const part of groups(txs, TX_RECORD, (t) => t.byteLength)) {
    out.push({ value: pack(TX_BATCH, part), headers: { [OFFSET_HEADER]: String(at) } });
    at += part.length;
  }
  return out;
}

/** The proposals in one record of the proposals topic: a batch's items, or the record itself (a single proposal, or bytes the writer will reject). */
export function proposalItems(value: Uint8Array): Uint8Array[] {
  if (!mayBePacked(PROPOSAL_BATCH, value)) return [value];
  try {
    return unpack(PROPOSAL_BATCH, value) ?? [value];
  } catch {
    // Malformed or over the bounds: handed over whole, and decideBatch turns it into one rejection naming why.
    return [value];
  }
}

/** The txs of one catalog.tx record (a packed record, or one tx as a writer before packing wrote it). */
export function txItems(value: Uint8Array, topic: string, kafkaOffset: string): Uint8Array[] {
  if (!mayBePacked(TX_BATCH, value)) return [value];
  try {
    return unpack(TX_BATCH, value) ?? [value];
  } catch (err) {
    throw new CatalogLogError(`${topic}@${kafkaOffset}: ${(err as Error).message}`);
  }
}

/** A record's bytes without a copy (kafkajs values are views of the fetch response, which they keep alive). */
export function view(value: Buffer | null): Uint8Array {
  return value === null
    ? new Uint8Array(0)
    : new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
}
