import { CatalogLogError } from "../log.ts";
import { MAX_SEND_BYTES } from "./admin.ts";

/**
 * Bounds of one group of records: the proposals in one produce request, or
 * the proposals decided into one writer transaction. A single record larger
 * than `maxBytes` still forms a group of its own (the topic's
 * max.message.bytes, not this bound, decides whether it fits).
 */
export interface BatchLimits {
  readonly maxRecords: number;
  readonly maxBytes: number;
}

/** Checks a BatchLimits value: both bounds positive integers. */
export function checkBatchLimits(what: string, l: BatchLimits): BatchLimits {
  if (!Number.isSafeInteger(l.maxRecords) || l.maxRecords < 1)
    throw new CatalogLogError(`${what}.maxRecords must be a positive integer, got ${String(l.maxRecords)}`);
  if (!Number.isSafeInteger(l.maxBytes) || l.maxBytes < 1)
    throw new CatalogLogError(`${what}.maxBytes must be a positive integer, got ${String(l.maxBytes)}`);
  return l;
}

/**
 * How many of `sizes` (record byte sizes, in order) form the next group:
 * at least one, at most `maxRecords`, and no more than `maxBytes` in total
 * unless the first record alone exceeds it. Pure.
 */
export function nextGroupSize(sizes: ArrayLike<number>, from: number, limits: BatchLimits): number {
  let n = 0;
  let bytes = 0;
  while (from + n < sizes.length && n < limits.maxRecords) {
    const size = sizes[from + n]!;
    if (n > 0 && bytes + size > limits.maxBytes) break;
    bytes += size;
    n++;
  }
  return n;
}

/**
 * Splits consecutive records into groups by the proposals they carry: each
 * group holds 1..maxRecords proposals and at most maxBytes bytes, unless its
 * single record alone exceeds a bound. Pure.
 */
export function groupUnits<T extends { readonly items: readonly Uint8Array[] }>(
  units: readonly T[],
  limits: BatchLimits,
): T[][] {
  const out: T[][] = [];
  let cur: T[] = [];
  let count = 0;
  let bytes = 0;
  for (const u of units) {
    const size = u.items.reduce((s, b) => s + b.byteLength, 0);
    if (cur.length > 0 && (count + u.items.length > limits.maxRecords || bytes + size > limits.maxBytes)) {
      out.push(cur);
      cur = [];
      count = 0;
      bytes = 0;
    }
    cur.push(u);
    count += u.items.length;
    bytes += size;
  }
  if (cur.length > 0) out.push(cur);
  return out;
}

/** Splits records into produce requests of at most MAX_SEND_BYTES each. */
export function chunksBySize<T extends { value: Buffer }>(messages: readonly T[]): T[][] {
  const out: T[][] = [];
  let cur: T[] = [];
  let bytes = 0;
  for (const m of messages) {
    if (cur.length > 0 && bytes + m.value.length > MAX_SEND_BYTES) {
      out.push(cur);
      cur = [];
      bytes = 0;
    }
    cur.push(m);
    bytes += m.value.length;
  }
  if (cur.length > 0) out.push(cur);
  return out;
}
