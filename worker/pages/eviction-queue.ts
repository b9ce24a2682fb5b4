import type { PageId } from "../../schema/ids.ts";

/**
 * The cached pages that may be evicted, lowest residency value first: an
 * indexed binary min-heap over page ids [0, capacity), so insert, remove and
 * pop are O(log queued) and membership is O(1).
 *
 * Order: value ascending, then the older last use, then the deeper page (more
 * rows: a chain's tail goes before the pages it needs), then the lower id. A
 * parent is never used less recently than its children (a hit on a child
 * passes through it), so among equal values a chain is evicted tail first.
 *
 * `work` counts heap slots visited, so a test can bound the cost of an
 * operation by counting instead of timing.
 */
export class EvictionQueue {
  private readonly heap: Int32Array;
  /** pos[page]: its slot in `heap`, or −1 when not queued. */
  private readonly pos: Int32Array;
  private readonly value: Float64Array;
  private readonly lastUse: Float64Array;
  private readonly depth: Float64Array;
  private count = 0;
  work = 0;

  constructor(capacity: number) {
    this.heap = new Int32Array(capacity);
    this.pos = new Int32Array(capacity).fill(-1);
    this.value = new Float64Array(capacity);
    this.lastUse = new Float64Array(capacity);
    this.depth = new Float64Array(capacity);
  }

  get size(): number {
    return this.count;
  }

  has(page: PageId): boolean {
    return this.pos[page]! >= 0;
  }

  insert(page: PageId, value: number, lastUse: number, depth: number): void {
    if (this.pos[page]! >= 0) throw new Error(`page ${page} is queued twice`);
    if (!Number.isFinite(value)) throw new RangeError(`page ${page}: eviction value ${value} is not finite`);
    this.value[page] = value;
    this.lastUse[page] = lastUse;
    this.depth[page] = depth;
    const at = this.count++;
    this.heap[at] = page;
    this.pos[page] = at;
    this.up(at);
  }

  remove(page: PageId): void {
    const at = this.pos[page]!;
    if (at < 0) throw new Error(`page ${page} is not queued`);
    this.pos[page] = -1;
    const last = this.heap[--this.count]!;
    if (at === this.count) return;
    this.heap[at] = last;
    this.pos[last] = at;
    this.down(this.up(at));
  }

  /** The page to evict next, or undefined when none is queued. */
  peek(): PageId | undefined {
    return this.count > 0 ? (this.heap[0]! as PageId) : undefined;
  }

  pop(): PageId | undefined {
    const top = this.peek();
    if (top !== undefined) this.remove(top);
    return top;
  }

  /** Changes a queued page's value, keeping its place in the order otherwise. */
  revalue(page: PageId, value: number): void {
    const at = this.pos[page]!;
    if (at < 0) throw new Error(`page ${page} is not queued`);
    if (!Number.isFinite(value)) throw new RangeError(`page ${page}: eviction value ${value} is not finite`);
    this.value[page] = value;
    this.down(this.up(at));
  }

  /** Every queued page, in heap order (not eviction order); O(queued), for invariant checks. */
  *pages(): IterableIterator<PageId> {
    for (let i = 0; i < this.count; i++) {
      this.work++;
      yield this.heap[i]! as PageId;
    }
  }

  /** a is evicted before b. */
  private before(a: number, b: number): boolean {
    const v = this.value;
    if (v[a] !== v[b]) return v[a]! < v[b]!;
    const u = this.lastUse;
    if (u[a] !== u[b]) return u[a]! < u[b]!;
    const d = this.depth;
    if (d[a] !== d[b]) return d[a]! > d[b]!;
    return a < b;
  }

  private up(at: number): number {
    const h = this.heap;
    const page = h[at]!;
    while (at > 0) {
      this.work++;
      const parent = (at - 1) >> 1;
      if (!this.before(page, h[parent]!)) break;
      h[at] = h[parent]!;
      this.pos[h[at]!] = at;
      at = parent;
    }
    h[at] = page;
    this.pos[page] = at;
    return at;
  }

  private down(at: number): void {
    const h = this.heap;
    const page = h[at]!;
    for (;;) {
      this.work++;
      const left = 2 * at + 1;
      if (left >= this.count) break;
      const right = left + 1;
      const child = right < this.count && this.before(h[right]!, h[left]!) ? right : left;
      if (!this.before(h[child]!, page)) break;
      h[at] = h[child]!;
      this.pos[h[at]!] = at;
      at = child;
    }
    h[at] = page;
    this.pos[page] = at;
  }
}
