import type { Engine } from "../../native/index.ts";
import type { PageId } from "../../schema/ids.ts";
import {
  checkWork,
  DecodeError,
  type Decoder,
  type DecodeWork,
  type SequenceId,
  splitLogits,
} from "./decoder.ts";

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
 * its page table; a step appends rows through the slot mapping
 * (slot = page × pageSize + position mod pageSize) and attention reads
 * through the page tables. Pages for a step are taken before it runs and
 * given back if it fails.
 */
export class PagedDecoder implements Decoder {
  readonly vocab: number;
  private readonly seqs = new Map<SequenceId, { length: number; pages: PageId[] }>();
  private nextId = 0;

  constructor(
    private readonly engine: Engine,
    private readonly pages: PageAllocator,
    readonly pageSize: number,
    readonly maxSeqs: number,
  ) {
    this.vocab = engine.spec.vocab;
    engine.createPool(pages.numPages, pageSize);
  }

  open(): SequenceId {
    if (this.seqs.size >= this.maxSeqs) throw new DecodeError(`all ${this.maxSeqs} sequences are open`);
    const id = this.nextId++ as SequenceId;
    this.seqs.set(id, { length: 0, pages: [] });
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

  /** The sequence's page table (physical page per 16/32-token block). */
  pageTable(seq: SequenceId): readonly PageId[] {
    return this.state(seq).pages;
  }

  close(seq: SequenceId): void {
    const s = this.state(seq);
    for (const p of s.pages) this.pages.release(p);
    this.seqs.delete(seq);
  }

  async step(work: readonly DecodeWork[]): Promise<Float32Array[]> {
    const P = this.pageSize;
    const T = checkWork(work, (s) => this.length(s), this.vocab, this.engine.spec.maxPosition);
    // Take the pages this step grows into; undo on any failure.
    const taken: [PageId[], number][] = [];
    try {
      for (const w of work) {
        const s = this.state(w.seq);
        const need = Math.ceil((s.length + w.tokens.length) / P);
        const before = s.pages.length;
        while (s.pages.length < need) s.pages.push(this.pages.alloc());
        taken.push([s.pages, before]);
      }
      const ptStride = Math.max(...work.map((w) => this.state(w.seq).pages.length));
      const pageTable = new Int32Array(work.length * ptStride).fill(-1);
      const tokens = new Int32Array(T);
      const positions = new Int32Array(T);
      const rowSeq = new Int32Array(T);
      const slotMapping = new Int32Array(T);
      const logitRows = new Int32Array(work.length);
      let t = 0;
      for (const [i, w] of work.entries()) {
        const s = this.state(w.seq);
        pageTable.set(s.pages, i * ptStride);
        for (let j = 0; j < w.tokens.length; j++, t++) {
          const pos = s.length + j;
          tokens[t] = w.tokens[j]!;
          positions[t] = pos;
          rowSeq[t] = i;
          slotMapping[t] = s.pages[Math.floor(pos / P)]! * P + (pos % P);
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
      return splitLogits(block, work.length, this.vocab);
    } finally {
      for (const [pages, before] of taken) for (const p of pages.splice(before)) this.pages.release(p);
    }
  }
}
