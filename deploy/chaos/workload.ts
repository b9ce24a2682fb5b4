import type { Prng } from "../../controller/sim/prng.ts";
import { sleep } from "../../schema/abort.ts";
import { call, IdleConnections, type Outcome, slowCall } from "./client.ts";

/**
 * The steady workload of a chaos run, against one HTTP front door: good
 * completions (shared long prefixes, so prefixes are checkpointed and
 * restored, some streamed), malformed requests interleaved with them, one
 * slow client trickling its body at a time, and a pool of idle connections.
 * Every call ends as an Outcome; the tallies are the run's request figures.
 */

export interface WorkloadOptions {
  readonly url: () => string;
  readonly model: string;
  readonly vocab: number;
  /** Concurrent clients of good and malformed requests. */
  readonly clients: number;
  /** A malformed request once in this many. */
  readonly malformedEvery: number;
  /** A call with no end after this long is a hang. */
  readonly deadlineMs: number;
  /** Idle connections held open (topped up when the server closes some). */
  readonly idle: number;
}

/**
 * Bodies (and a few paths) that are wrong, each of which the README promises
 * a clear 4xx for ("OpenAI-style 4xx errors before anything is queued";
 * invariant 5: no client input yields a 500, a crash or a hang).
 */
export const MALFORMED: readonly {
  readonly path: string;
  readonly method: string;
  readonly body?: string;
}[] = [
  { path: "/v1/completions", method: "POST", body: "{" },
  { path: "/v1/completions", method: "POST", body: "[]" },
  { path: "/v1/completions", method: "POST", body: "null" },
  { path: "/v1/completions", method: "POST", body: '{"model":"tiny","prompt":[1,2,3],"max_tokens":"x"}' },
  { path: "/v1/completions", method: "POST", body: '{"model":"tiny","prompt":[1e308],"max_tokens":2}' },
  { path: "/v1/completions", method: "POST", body: '{"model":"tiny","prompt":"hi","max_tokens":-1}' },
  { path: "/v1/completions", method: "POST", body: '{"model":"tiny","prompt":"hi","max_tokens":100000000}' },
  { path: "/v1/completions", method: "POST", body: '{"model":"tiny","prompt":"hi","temperature":"hot"}' },
  { path: "/v1/completions", method: "POST", body: '{"model":"no-such-model","prompt":"hi"}' },
  {
    path: "/v1/completions",
    method: "POST",
    body: `{"model":"tiny","prompt":"hi","max_tokens":${"[".repeat(5000)}${"]".repeat(5000)}}`,
  },
  { path: "/v1/chat/completions", method: "POST", body: '{"model":"tiny","messages":"x"}' },
  { path: "/v1/chat/completions", method: "POST", body: '{"model":"tiny","messages":[{"role":"user"}]}' },
  { path: "/v1/no-such-route", method: "GET" },
];

export interface Tally {
  count: number;
  ok: number;
  /** Failure reasons and how often each was seen. */
  failed: Record<string, number>;
  hung: number;
}

export interface WorkloadFigures {
  readonly good: Tally;
  /** Malformed requests: answered 4xx with an error body (`rejected`), or otherwise (`wrong`: reason → count). */
  readonly malformed: { count: number; rejected: number; wrong: Record<string, number>; hung: number };
  readonly slow: Tally;
  readonly idle: { opened: number; endedByServer: number };
}

/** A 4xx with an error body, or a connection the server refused while it was down: a reason either way. */
function isClearRefusal(o: Outcome): boolean {
  if (o.kind !== "failed") return false;
  if (o.status === undefined) return true;
  return o.status >= 400 && o.status < 500 && !o.reason.includes("no error body");
}

/**
 * After a call the server was not there for (refused, reset), a client
 * waits this long: a restart is not flooded, nor the figures with refusals.
 */
const DOWN_PAUSE_MS = 250;

function pause(o: Outcome, rng: Prng): number {
  return o.kind === "failed" && o.status === undefined ? DOWN_PAUSE_MS : rng.int(0, 50);
}

const newTally = (): Tally => ({ count: 0, ok: 0, failed: {}, hung: 0 });

function record(t: Tally, o: Outcome): void {
  t.count++;
  if (o.kind === "ok") t.ok++;
  else if (o.kind === "hung") t.hung++;
  else t.failed[o.reason] = (t.failed[o.reason] ?? 0) + 1;
}

export class Workload {
  private stopped = false;
  private readonly loops: Promise<void>[] = [];
  private readonly idle = new IdleConnections();
  private idleOpened = 0;
  readonly figures: WorkloadFigures = {
    good: newTally(),
    malformed: { count: 0, rejected: 0, wrong: {}, hung: 0 },
    slow: newTally(),
    idle: { opened: 0, endedByServer: 0 },
  };
  /** Long shared prefixes: prompts reuse them, so the durable cache is exercised. */
  private readonly prefixes: number[][];

  constructor(
    private readonly o: WorkloadOptions,
    private readonly rng: Prng,
  ) {
    this.prefixes = Array.from({ length: 4 }, () =>
      Array.from({ length: 300 }, () => rng.int(1, o.vocab - 1)),
    );
  }

  start(): void {
    for (let i = 0; i < this.o.clients; i++) this.loops.push(this.client(this.rng.fork()));
    this.loops.push(this.slowClient(), this.idleClients());
  }

  async stop(): Promise<WorkloadFigures> {
    this.stopped = true;
    await Promise.all(this.loops);
    this.idle.close();
    this.figures.idle.opened = this.idleOpened;
    this.figures.idle.endedByServer = this.idle.endedByServer;
    return this.figures;
  }

  private goodBody(rng: Prng): { path: string; body: string } {
    const prefix = this.prefixes[rng.int(0, this.prefixes.length - 1)]!;
    const suffix = Array.from({ length: rng.int(1, 24) }, () => rng.int(1, this.o.vocab - 1));
    const stream = rng.chance(0.3);
    return {
      path: "/v1/completions",
      body: JSON.stringify({
        model: this.o.model,
        prompt: [...prefix, ...suffix],
        max_tokens: rng.int(1, 8),
        temperature: 0,
        ...(stream ? { stream: true } : {}),
      }),
    };
  }

  private async client(rng: Prng): Promise<void> {
    while (!this.stopped) {
      if (rng.int(1, this.o.malformedEvery) === 1) {
        const m = MALFORMED[rng.int(0, MALFORMED.length - 1)]!;
        const o = await call({ url: this.o.url(), ...m, deadlineMs: this.o.deadlineMs });
        const f = this.figures.malformed;
        f.count++;
        if (o.kind === "hung") f.hung++;
        else if (isClearRefusal(o)) f.rejected++;
        else {
          const why = `${o.kind === "ok" ? `HTTP ${o.status} (accepted)` : o.reason} for ${m.body?.slice(0, 40) ?? `${m.method} ${m.path}`}`;
          f.wrong[why] = (f.wrong[why] ?? 0) + 1;
        }
        await sleep(pause(o, rng));
      } else {
        const g = this.goodBody(rng);
        const o = await call({ url: this.o.url(), method: "POST", ...g, deadlineMs: this.o.deadlineMs });
        record(this.figures.good, o);
        await sleep(pause(o, rng));
      }
    }
  }

  private async slowClient(): Promise<void> {
    // ~60 bytes of a short request, one byte every 50 ms: about 3 s per call.
    const body = JSON.stringify({ model: this.o.model, prompt: [1, 2, 3], max_tokens: 1, temperature: 0 });
    while (!this.stopped) {
      const o = await slowCall(this.o.url(), "/v1/completions", body, 50, this.o.deadlineMs);
      record(this.figures.slow, o);
      await sleep(o.kind === "failed" && o.status === undefined ? DOWN_PAUSE_MS : 100);
    }
  }

  private async idleClients(): Promise<void> {
    while (!this.stopped) {
      const missing = this.o.idle - this.idle.openCount;
      if (missing > 0) {
        this.idle.open(this.o.url(), missing);
        this.idleOpened += missing;
      }
      await sleep(1_000);
    }
  }
}
