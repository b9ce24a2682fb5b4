import type { Engine } from "../../native/engine.ts";
import type { PageId } from "../../schema/ids.ts";
import { NO_PAGE, windowDeadPages } from "../pages/route.ts";
import {
  checkWork,
  DecodeError,
  type Decoder,
  type DecodeWork,
  type SequenceId,
  splitLogits,
} from "./decoder.ts";
import type { LayerGroups } from "./layout.ts";

/**
 * A minimal page allocator for the paged decoder until the worker's page
 * manager takes over: a bounded free list of physical page ids. `order`
 * fixes the order pages are handed out (tests pass a shuffled order to get
 * fragmented page tables).
 */
export class PageAllocator {
  private readonly free: PageId[];
  private readonly used = new Set<PageId>();

  constructor(
    readonly numPages: number,
    order?: readonly number[],
  ) {
    const ids = order ?? Array.from({ length: numPages }, (_, i) => i);
    if (
      ids.length !== numPages ||
      new Set(ids).size !== numPages ||
      ids.some((p) => !(p >= 0 && p < numPages))
    )
      throw new RangeError(`order must be a permutation of 0..${numPages - 1}`);
    // Popped from the end: reverse so pages go out in `order`.
    this.free = [...ids].reverse() as PageId[];
  }

  get freeCount(): number {
    return this.free.length;
  }

  alloc(): PageId {
    const p = this.free.pop();
    if (p === undefined) throw new DecodeError(`out of KV pages (all ${this.numPages} in use)`);
    this.used.add(p);
    return p;
  }

  release(p: PageId): void {
    if (!this.used.delete(p)) throw new DecodeError(`page ${p} is not allocated`);
    this.free.push(p);
  }
}

/**
 * The paged decoder: each sequence's K/V live in fixed-size pages named by
 * its page tables, one per layer group (layout.ts layerGroups; one group of
 * every layer unless the decoder is given groups); a step appends rows
 * through each group's slot mapping (slot = page × pageSize + position mod
 * pageSize) and attention reads through the group's page table. After each
 * step a sliding group's pages wholly before its window are given back
 * (their entries become −1), while a global group keeps every page. Pages for
 * a step are taken before it runs and given back if it fails.
 */
export class PagedDecoder implements Decoder {
  readonly vocab: number;
  private readonly seqs = new Map<SequenceId, { length: number; tables: PageId[][] }>();
  private nextId = 0;
  /** Each group's window (null: global), in group order. */
  private readonly windows: readonly (number | null)[];
  /** Page-table entries given back outside a sliding group's window, since the decoder was made. */
  releasedPages = 0;

  constructor(
    private readonly engine: Engine,
    private readonly pages: PageAllocator,
    readonly pageSize: number,
    readonly maxSeqs: number,
    groups?: LayerGroups,
  ) {
    this.vocab = engine.spec.vocab;
    this.windows = groups
      ? groups.groups.map((g) => (g.layout.kind === "sliding" ? g.layout.window : null))
      : [null];
    engine.createPool(pages.numPages, pageSize, groups?.groupOf);
  }

  open(): SequenceId {
    if (this.seqs.size >= this.maxSeqs) throw new DecodeError(`all ${this.maxSeqs} sequences are open`);
    const id = this.nextId++ as SequenceId;
    this.seqs.set(id, { length: 0, tables: this.windows.map(() => []) });
    return id;
  }

  private state(seq: SequenceId) {
    const s = this.seqs.get(seq);
    if (!s) throw new DecodeError(`sequence ${seq} is not open`);
    return s;
  }

  length(seq: SequenceId): number {
    return this.state(seq).length;
  }

  /** The sequence's page table in `group` (physical page per block; −1 where released). */
  pageTable(seq: SequenceId, group = 0): readonly PageId[] {
    return this.state(seq).tables[group]!;
  }

  /** Pages the sequence holds, over every group. */
  heldPages(seq: SequenceId): number {
    return this.state(seq).tables.reduce((n, t) => n + t.filter((p) => p !== NO_PAGE).length, 0);
  }

  close(seq: SequenceId): void {
    const s = this.state(seq);
    for (const t of s.tables) for (const p of t) if (p !== NO_PAGE) this.pages.release(p);
    this.seqs.delete(seq);
  }

  async step(work: readonly DecodeWork[]): Promise<Float32Array[]> {
    const P = this.pageSize;
    const G = this.windows.length;
    const T = checkWork(work, (s) => this.length(s), this.vocab, this.engine.spec.maxPosition);
    // Take the pages this step grows into; undo on any failure.
    const taken: [PageId[], number][] = [];
    try {
      for (const w of work) {
        const s = this.state(w.seq);
        const need = Math.ceil((s.length + w.tokens.length) / P);
        for (const t of s.tables) {
          const before = t.length;
          while (t.length < need) t.push(this.pages.alloc());
          taken.push([t, before]);
        }
      }
      const ptStride = Math.max(...work.map((w) => this.state(w.seq).tables[0]!.length));
      const S = work.length;
      const pageTable = new Int32Array(G * S * ptStride).fill(-1);
      const tokens = new Int32Array(T);
      const positions = new Int32Array(T);
      const rowSeq = new Int32Array(T);
      const slotMapping = new Int32Array(G * T);
      const logitRows = new Int32Array(work.length);
      let t = 0;
      for (const [i, w] of work.entries()) {
        const s = this.state(w.seq);
        s.tables.forEach((table, g) => {
          pageTable.set(table, (g * S + i) * ptStride);
        });
        for (let j = 0; j < w.tokens.length; j++, t++) {
          const pos = s.length + j;
          tokens[t] = w.tokens[j]!;
          positions[t] = pos;
          rowSeq[t] = i;
          for (let g = 0; g < G; g++)
            slotMapping[g * T + t] = s.tables[g]![Math.floor(pos / P)]! * P + (pos % P);
        }
        logitRows[i] = t - 1;
      }
      const block = await this.engine.step({
        tokens,
        positions,
        rowSeq,
        slotMapping,
        pageTable,
        ptStride,
        logitRows,
      });
      for (const w of work) this.state(w.seq).length += w.tokens.length;
      taken.length = 0;
      for (const w of work) this.releaseOutsideWindows(this.state(w.seq));
      return splitLogits(block, work.length, this.vocab);
    } finally {
      for (const [pages, before] of taken) for (const p of pages.splice(before)) this.pages.release(p);
    }
  }

  /** A sliding group's leading pages no later query reads (route.ts windowDeadPages) go back to the allocator. */
  private releaseOutsideWindows(s: { length: number; tables: PageId[][] }): void {
    this.windows.forEach((window, g) => {
      const t = s.tables[g]!;
      const dead = windowDeadPages(s.length, window, this.pageSize, t.length);
      for (let i = dead - 1; i >= 0 && t[i] !== NO_PAGE; i--) {
        this.pages.release(t[i]!);
        t[i] = NO_PAGE;
        this.releasedPages++;
      }
    });
  }
}
