import { type ChildProcess, spawn } from "node:child_process";

/**
 * One `continuum <role>` process for the fleet tests: its structured log
 * lines are parsed as they arrive so a test can wait for an event (bounded),
 * and it is stopped with SIGINT (then SIGKILL) or killed outright.
 */
export interface LogLine {
  readonly event?: string;
  readonly [field: string]: unknown;
}

export class RoleProcess {
  readonly child: ChildProcess;
  readonly lines: LogLine[] = [];
  readonly raw: string[] = [];
  private partial = "";
  private readonly waiters = new Set<() => void>();

  constructor(
    readonly name: string,
    args: readonly string[],
    env: Record<string, string>,
  ) {
    this.child = spawn(process.execPath, ["bin/continuum.mjs", ...args], {
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.child.stdout!.on("data", (d) => this.raw.push(String(d)));
    this.child.stderr!.on("data", (d) => this.onData(String(d)));
    this.child.on("exit", () => this.wakeAll());
  }

  get pid(): number {
    return this.child.pid!;
  }

  get exited(): boolean {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }

  private onData(text: string): void {
    this.raw.push(text);
    const parts = (this.partial + text).split("\n");
    this.partial = parts.pop()!;
    for (const line of parts) {
      if (!line.startsWith("{")) continue;
      try {
        this.lines.push(JSON.parse(line) as LogLine);
      } catch {
        // not a log line
      }
    }
    this.wakeAll();
  }

  private wakeAll(): void {
    for (const w of [...this.waiters]) w();
  }

  /** The number of log lines so far (pass to `waitFor` to see only later ones). */
  mark(): number {
    return this.lines.length;
  }

  /** Log lines of one event, optionally filtered by fields, from line `from` on. */
  events(event: string, match: Record<string, unknown> = {}, from = 0): LogLine[] {
    return this.lines
      .slice(from)
      .filter((l) => l.event === event && Object.entries(match).every(([k, v]) => l[k] === v));
  }

  /** Waits (bounded) for a log line of `event` matching `match`; returns it. */
  async waitFor(
    event: string,
    match: Record<string, unknown> = {},
    timeoutMs = 60_000,
    from = 0,
  ): Promise<LogLine> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const hit = this.events(event, match, from)[0];
      if (hit) return hit;
      if (this.exited) throw new Error(`${this.name} exited while waiting for ${event}:\n${this.tail()}`);
      const left = deadline - Date.now();
      if (left <= 0)
        throw new Error(
          `${this.name}: no ${event} ${JSON.stringify(match)} in ${timeoutMs} ms:\n${this.tail()}`,
        );
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(t);
          this.waiters.delete(done);
          resolve();
        };
        const t = setTimeout(done, Math.min(left, 200));
        this.waiters.add(done);
      });
    }
  }

  tail(n = 30): string {
    return this.raw.join("").split("\n").slice(-n).join("\n");
  }

  /** SIGINT, then SIGKILL after `graceMs`; resolves with the exit code (null if killed by a signal). */
  async stop(graceMs = 10_000): Promise<number | null> {
    if (this.exited) return this.child.exitCode;
    const exited = new Promise<void>((r) => this.child.once("exit", () => r()));
    this.child.kill("SIGINT");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), graceMs);
    await exited;
    clearTimeout(timer);
    return this.child.exitCode;
  }

  async kill9(): Promise<void> {
    if (this.exited) return;
    const exited = new Promise<void>((r) => this.child.once("exit", () => r()));
    this.child.kill("SIGKILL");
    await exited;
  }
}

/** Deterministic token ids in [10, 500) (clear of the tiny model's special tokens). */
export function tokens(n: number, seed: number): number[] {
  let s = seed >>> 0;
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = Math.imul(s ^ (s >>> 15), 1 | s);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    out.push(10 + (((t ^ (t >>> 14)) >>> 0) % 490));
  }
  return out;
}
