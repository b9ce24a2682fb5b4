/**
 * The simulator's agenda: a binary min-heap ordered by (time, insertion
 * sequence), so events at the same logical time run in the order they were
 * scheduled — the property that makes a run reproducible.
 */
export class Agenda<T> {
  private readonly times: number[] = [];
  private readonly seqs: number[] = [];
  private readonly items: T[] = [];
  private nextSeq = 0;

  constructor(private readonly capacity: number) {}

  get size(): number {
    return this.items.length;
  }

  push(time: number, item: T): void {
    if (!Number.isFinite(time)) throw new RangeError(`event time must be finite, got ${time}`);
    if (this.items.length >= this.capacity)
      throw new Error(`agenda over its bound of ${this.capacity} events`);
    this.times.push(time);
    this.seqs.push(this.nextSeq++);
    this.items.push(item);
    this.up(this.items.length - 1);
  }

  /** Removes and returns the earliest event, or undefined when empty. */
  pop(): { time: number; item: T } | undefined {
    const n = this.items.length;
    if (n === 0) return undefined;
    const time = this.times[0]!;
    const item = this.items[0]!;
    this.swap(0, n - 1);
    this.times.pop();
    this.seqs.pop();
    this.items.pop();
    if (n > 1) this.down(0);
    return { time, item };
  }

  private less(i: number, j: number): boolean {
    return (
      this.times[i]! < this.times[j]! || (this.times[i] === this.times[j] && this.seqs[i]! < this.seqs[j]!)
    );
  }

  private swap(i: number, j: number): void {
    [this.times[i], this.times[j]] = [this.times[j]!, this.times[i]!];
    [this.seqs[i], this.seqs[j]] = [this.seqs[j]!, this.seqs[i]!];
    [this.items[i], this.items[j]] = [this.items[j]!, this.items[i]!];
  }

  private up(i: number): void {
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.less(i, p)) return;
      this.swap(i, p);
      i = p;
    }
  }

  private down(i: number): void {
    const n = this.items.length;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < n && this.less(l, m)) m = l;
      if (r < n && this.less(r, m)) m = r;
      if (m === i) return;
      this.swap(i, m);
      i = m;
    }
  }
}
