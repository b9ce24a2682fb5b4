import type { StepBatch } from "../../native/engine.ts";
import type { PageId } from "../../schema/ids.ts";
import type { StepShape } from "./prefill-pacer.ts";

/** One lane of a step: consecutive rows of one sequence. */
export interface Lane {
  /** Token ids of the rows, in position order. */
  readonly tokens: readonly number[];
  /** Absolute position of the first row. */
  readonly firstPosition: number;
  /** KV slot of each row: page × pageTokens + offset. */
  readonly slots: readonly number[];
  /** The sequence's page table once these rows are written. */
  readonly pageTable: readonly PageId[];
  /** The last row's logits are needed (a decode lane). */
  readonly wantLogits: boolean;
  /** Every row's logits are needed (a prefill lane of a request that scores its prompt). */
  readonly promptLogits?: boolean;
}

export interface BuiltBatch {
  readonly batch: StepBatch;
  /**
   * For each lane, the index of its logits row in the step's output, or -1;
   * a promptLogits lane's rows follow from there, one per row.
   */
  readonly logitIndex: readonly number[];
  readonly rows: number;
}

/**
 * The ragged batch descriptor for one native step. Pure. Rows are laid out
 * lane after lane; lane i is sequence i of the page table, whose stride is
 * the longest lane's table (shorter ones padded with −1, never read since a
 * row only attends to positions ≤ its own).
 */
export function buildBatch(lanes: readonly Lane[]): BuiltBatch {
  let rows = 0;
  let ptStride = 1;
  for (const [i, l] of lanes.entries()) {
    if (l.tokens.length === 0 || l.slots.length !== l.tokens.length) {
      throw new RangeError(`lane ${i}: ${l.tokens.length} tokens but ${l.slots.length} slots`);
    }
    rows += l.tokens.length;
    ptStride = Math.max(ptStride, l.pageTable.length);
  }
  const tokens = new Int32Array(rows);
  const positions = new Int32Array(rows);
  const rowSeq = new Int32Array(rows);
  const slotMapping = new Int32Array(rows);
  const pageTable = new Int32Array(lanes.length * ptStride).fill(-1);
  const logitRows: number[] = [];
  const logitIndex: number[] = [];
  let r = 0;
  for (const [i, l] of lanes.entries()) {
    for (let k = 0; k < l.tokens.length; k++, r++) {
      tokens[r] = l.tokens[k]!;
      positions[r] = l.firstPosition + k;
      rowSeq[r] = i;
      slotMapping[r] = l.slots[k]!;
    }
    pageTable.set(l.pageTable, i * ptStride);
    if (l.promptLogits) {
      logitIndex.push(logitRows.length);
      for (let k = r - l.tokens.length; k < r; k++) logitRows.push(k);
    } else if (l.wantLogits) {
      logitIndex.push(logitRows.length);
      logitRows.push(r - 1);
    } else {
      logitIndex.push(-1);
    }
  }
  return {
    batch: {
      tokens,
      positions,
      rowSeq,
      slotMapping,
      pageTable,
      ptStride,
      logitRows: Int32Array.from(logitRows),
    },
    logitIndex,
    rows,
  };
}

/**
 * A step's rows by kind (decode lanes want logits, prefill lanes do not)
 * and the keys each kind attends: a row at position p attends p + 1 keys,
 * so a lane of t rows from position p₀ attends t·(p₀ + 1) + t(t − 1)/2.
 * Pure; the pacer's cost model reads it.
 */
export function stepShape(lanes: readonly Lane[]): StepShape {
  let decodeRows = 0;
  let decodeKeys = 0;
  let prefillRows = 0;
  let prefillKeys = 0;
  for (const l of lanes) {
    const t = l.tokens.length;
    const keys = t * (l.firstPosition + 1) + (t * (t - 1)) / 2;
    if (l.wantLogits) {
      decodeRows += t;
      decodeKeys += keys;
    } else {
      prefillRows += t;
      prefillKeys += keys;
    }
  }
  return { decodeRows, decodeKeys, prefillRows, prefillKeys };
}
