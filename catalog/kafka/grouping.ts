import { CatalogLogError } from "../log.ts";

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
 * The one greedy grouping rule: the end (exclusive) of the group of items
 * that starts at `from`, of the `n` items in order. A group takes items while
 * its records (`recordsAt`, 1 per item unless given) stay within
 * `maxRecords` and its bytes (`bytesAt`) within `maxBytes`; it holds at least
 * one item, so an item over a bound alone forms a group of its own. Returns
 * `from` only when `from >= n`. Pure; O(group size).
 */
export function groupEnd(
  n: number,
  from: number,
  limits: BatchLimits,
  bytesAt: (i: number) => number,
  recordsAt?: (i: number) => number,
): number {
  let end = from;
  let records = 0;
  let bytes = 0;
  while (end < n) {
    const r = recordsAt === undefined ? 1 : recordsAt(end);
    const b = bytesAt(end);
    if (end > from && (records + r > limits.maxRecords || bytes + b > limits.maxBytes)) break;
    records += r;
    bytes += b;
    end++;
  }
  return end;
}

/** `items` cut into consecutive groups by groupEnd (each non-empty; concatenated, they are `items`). */
export function groups<T>(
  items: readonly T[],
  limits: BatchLimits,
  bytesOf: (item: T) => number,
  recordsOf?: (item: T) => number,
): T[][] {
  const bytesAt = (i: number) => bytesOf(items[i]!);
  const recordsAt = recordsOf === undefined ? undefined : (i: number) => recordsOf(items[i]!);
  const out: T[][] = [];
  for (let at = 0; at < items.length; ) {
    const end = groupEnd(items.length, at, limits, bytesAt, recordsAt);
    out.push(items.slice(at, end));
    at = end;
  }
  return out;
}
