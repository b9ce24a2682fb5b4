/**
 * A single-consumer async queue with a hard capacity, for one request's
 * events (tokens, then one end or error): the worker runtime pushes them as
 * it samples, the fleet service as frames arrive from a worker, and the
 * front door iterates them. The capacity is the request's whole output (max
 * tokens + its end), so a slow client never makes anyone buffer more than
 * that; a push beyond it, or after close, is refused and returns false.
 */
export class StreamQueue<T> implements AsyncIterable<T> {
  private readonly buffer: T[] = [];
  private head = 0;
  private closed = false;
  private waiter: ((r: IteratorResult<T>) => void) | null = null;

  constructor(readonly capacity: number) {
    if (!Number.isSafeInteger(capacity) || capacity < 1)
      throw new RangeError(`queue capacity must be ≥ 1, got ${capacity}`);
  }

  push(value: T): boolean {
    if (this.closed) return false;
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w({ value, done: false });
      return true;
    }
    if (this.buffer.length - this.head >= this.capacity) return false;
    this.buffer.push(value);
    return true;
  }

  get isClosed(): boolean {
    return this.closed;
  }

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
        if (this.waiter) return Promise.reject(new Error("the queue has one consumer"));
        return new Promise((resolve) => {
          this.waiter = resolve;
        });
      },
    };
  }
}
