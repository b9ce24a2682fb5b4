/**
 * Terminal progress for long byte transfers (weights loading). On a TTY one
 * line is rewritten in place at most every 100 ms; elsewhere (CI logs, pipes)
 * one line is written per 10% step, so logs stay short and readable.
 */
export interface ProgressSink {
  readonly isTTY?: boolean;
  write(chunk: string): unknown;
}

export interface ByteProgress {
  advance(bytes: number): void;
  done(): void;
}

const GIB = 2 ** 30;
const MIB = 2 ** 20;

function size(bytes: number): string {
  return bytes >= GIB ? `${(bytes / GIB).toFixed(2)} GiB` : `${(bytes / MIB).toFixed(1)} MiB`;
}

export const silentProgress: ByteProgress = { advance() {}, done() {} };

export class TerminalProgress implements ByteProgress {
  private seen = 0;
  private lastDraw = 0;
  private lastDecile = -1;
  private readonly started = Date.now();

  constructor(
    private readonly label: string,
    private readonly total: number,
    private readonly sink: ProgressSink = process.stderr,
  ) {}

  advance(bytes: number): void {
    this.seen += bytes;
    if (this.sink.isTTY) {
      const now = Date.now();
      if (now - this.lastDraw >= 100) {
        this.lastDraw = now;
        this.sink.write(`\r${this.line()}`);
      }
      return;
    }
    const decile = Math.floor((10 * this.seen) / Math.max(1, this.total));
    if (decile > this.lastDecile && decile < 10) {
      this.lastDecile = decile;
      this.sink.write(`${this.line()}\n`);
    }
  }

  done(): void {
    this.sink.write(`${this.sink.isTTY ? "\r" : ""}${this.line()} done\n`);
  }

  private line(): string {
    const pct = this.total === 0 ? 100 : Math.floor((100 * this.seen) / this.total);
    const secs = (Date.now() - this.started) / 1000;
    const rate = secs > 0 ? ` ${size(this.seen / secs)}/s` : "";
    return `${this.label} ${String(pct).padStart(3)}% ${size(this.seen)} / ${size(this.total)}${rate}`;
  }
}

/** Progress worth showing: a terminal line for loads of at least `threshold` bytes, else nothing. */
export function progressFor(label: string, total: number, threshold = 64 * MIB): ByteProgress {
  return total >= threshold ? new TerminalProgress(label, total) : silentProgress;
}
