/**
 * A single-consumer async channel with a hard capacity. The runtime pushes a
 * request's events (tokens, then one end); the front door iterates them.
 * Capacity is the request's whole output (max tokens + its end event), so a
 * push never has to wait and a slow client never stalls the device loop; a
 * push beyond capacity is a bug and throws.
 */
export class EventChannel<T> implements AsyncIterable<T> {
  private readonly buffer: T[] = [];
  private head = 0;
  private closed = false;
  private waiter: ((r: IteratorResult<T>) => void) | null = null;

  constructor(readonly capacity: number) {
    if (!Number.isSafeInteger(capacity) || capacity < 1)
      throw new RangeError(`channel capacity must be ≥ 1, got ${capacity}`);
  }

  get isClosed(): boolean {
    return this.closed;
  }

  push(value: T): void {
    if (this.closed) throw new Error("push to a closed channel");
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w({ value, done: false });
      return;
    }
    if (this.buffer.length - this.head >= this.capacity) {
      throw new Error(`event channel over its capacity of ${this.capacity}`);
    }
    this.buffer.push(value);
  }

  /** No more values; the consumer sees the buffered ones, then the end. */
  close(): void {
    this.closed = true;
    if (this.waiter && this.head >= this.buffer.length) {
      const w = this.waiter;
      this.waiter = null;
      w({ value: undefined, done: true });
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return {
      next: () => {
        if (this.head < this.buffer.length) {
          const value = this.buffer[this.head++]!;
          if (this.head > 1024 && this.head * 2 > this.buffer.length) {
            this.buffer.splice(0, this.head);
            this.head = 0;
          }
          return Promise.resolve({ value, done: false });
        }
        if (this.closed) return Promise.resolve({ value: undefined, done: true });
        if (this.waiter) return Promise.reject(new Error("channel has one consumer"));
        return new Promise((resolve) => {
          this.waiter = resolve;
        });
      },
    };
  }
}
