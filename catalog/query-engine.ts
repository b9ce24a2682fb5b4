import type { Worker } from "node:worker_threads";
import type { TxRecord } from "../schema/catalog.ts";
import { startTsThread } from "../schema/threads.ts";
import { ConsoleError } from "./console.ts";
import type { CatalogDb } from "./db.ts";
import type { QueryScope } from "./query-scope.ts";
import type { ThreadReply, ThreadRequest, ThreadRole } from "./query-thread.ts";
import type { ReplicaListener } from "./replica.ts";

/**
 * User Datalog, bounded and off the event loop. Two threads
 * (catalog/query-thread.ts) each hold a copy of the replica's catalog, sent
 * every transaction the replica applies, in order: the query thread runs
 * queries; the keeper only follows, so a new query thread can be seeded from
 * its snapshot without the event loop serializing the catalog (which costs
 * ~10 µs per entity: half a second for 50,000). The event loop serializes it
 * once, when the first query starts the keeper (threads cost a process
 * nothing until it is queried). Queries run one at a time, FIFO, with these
 * bounds:
 *
 * - time: `timeoutMs` from the moment the thread starts the query (folding
 *   new transactions into its view comes before, and is not the query's);
 *   past it the thread is terminated — a runaway recursive rule stops;
 * - result: at most `maxResultRows` rows and `maxResultBytes` of JSON;
 * - memory: each thread's heap is capped at `maxHeapMb` (its catalog copy
 *   included); a query that reaches it kills only the query thread;
 * - queue: `maxQueued` queries wait at most; one more is refused at once.
 *
 * A query thread terminated for an overrun is replaced at once from the
 * keeper, so the next query does not wait for a thread to start; one that
 * died before it was ready, or a keeper that died, is replaced only when the
 * next query needs it (no restart loop). A new query thread builds its
 * Datalog view as soon as it is seeded (before the query budget of any
 * query starts). Errors: a bound is a QueryBoundError
 * naming it; a bad query is a ConsoleError.
 */
export interface QueryLimits {
  readonly timeoutMs: number;
  readonly maxResultRows: number;
  readonly maxResultBytes: number;
  readonly maxHeapMb: number;
  readonly maxQueued: number;
}

export const defaultQueryLimits: QueryLimits = {
  timeoutMs: 10_000,
  maxResultRows: 100_000,
  maxResultBytes: 8 * 1024 * 1024,
  maxHeapMb: 512,
  maxQueued: 8,
};

export type QueryBound = "time" | "rows" | "bytes" | "memory" | "queue";

export class QueryBoundError extends Error {
  override readonly name = "QueryBoundError";
  constructor(
    readonly bound: QueryBound,
    message: string,
  ) {
    super(message);
  }
}

/** The query thread failed for a reason that is not the query's (it could not start, say). */
export class QueryEngineError extends Error {
  override readonly name = "QueryEngineError";
}

/** What the engine follows: a Replica. */
export interface QuerySource {
  readonly catalog: CatalogDb;
  listen(fn: ReplicaListener): () => void;
}

export interface CatalogQuery {
  readonly query: string;
  readonly rules?: string | undefined;
  readonly scope: QueryScope;
}

export interface QueryAnswer {
  /** The result as JSON text (already within maxResultBytes). */
  readonly json: string;
  readonly rows: number;
}

interface Pending {
  readonly id: number;
  readonly q: CatalogQuery;
  readonly resolve: (a: QueryAnswer) => void;
  readonly reject: (e: Error) => void;
}

interface Thread {
  readonly worker: Worker;
  readonly role: ThreadRole;
  /** It loaded its copy of the catalog. */
  ready: boolean;
}

const THREAD_ENTRY = new URL("./query-thread.ts", import.meta.url);

export class CatalogQueryEngine {
  private keeper: Thread | null = null;
  private thread: Thread | null = null;
  /** A query thread is being seeded: the transactions since the keeper was asked for its snapshot. */
  private seeding: TxRecord[][] | null = null;
  private unlisten: (() => void) | null = null;
  private running: { readonly job: Pending; timer: NodeJS.Timeout | null } | null = null;
  private readonly queue: Pending[] = [];
  private nextId = 1;
  private closed = false;

  constructor(
    private readonly source: QuerySource,
    private readonly limits: QueryLimits = defaultQueryLimits,
  ) {}

  query(q: CatalogQuery): Promise<QueryAnswer> {
    if (this.closed) return Promise.reject(new QueryEngineError("the catalog query engine is closed"));
    // maxQueued wait behind the running query (or behind a thread being seeded, with none running).
    if (this.queue.length >= this.limits.maxQueued + (this.running === null ? 1 : 0))
      return Promise.reject(
        new QueryBoundError(
          "queue",
          `${this.queue.length} queries are waiting, the most allowed; retry shortly`,
        ),
      );
    return new Promise((resolve, reject) => {
      this.queue.push({ id: this.nextId++, q, resolve, reject });
      this.pump();
    });
  }

  private pump(): void {
    if (this.running !== null || this.closed || this.queue.length === 0) return;
    const thread = this.thread;
    if (thread === null) {
      this.seedQueryThread();
      return;
    }
    const job = this.queue.shift()!;
    this.running = { job, timer: null };
    const msg: ThreadRequest = {
      type: "query",
      id: job.id,
      query: job.q.query,
      rules: job.q.rules,
      scope: job.q.scope,
      maxRows: this.limits.maxResultRows,
      maxBytes: this.limits.maxResultBytes,
    };
    thread.worker.postMessage(msg);
  }

  private forward(txs: TxRecord[]): void {
    const msg: ThreadRequest = { type: "tx", txs };
    this.keeper?.worker.postMessage(msg);
    if (this.thread) this.thread.worker.postMessage(msg);
    else this.seeding?.push(txs);
  }

  /** A thread seeded with `snapshot`, which it takes (the buffer is transferred: the caller must own all of it). */
  private spawn(role: ThreadRole, snapshot: Uint8Array): Thread {
    const worker = startTsThread(
      THREAD_ENTRY,
      { role, snapshot },
      {
        transfer: [snapshot.buffer as ArrayBuffer],
        resourceLimits: { maxOldGenerationSizeMb: this.limits.maxHeapMb },
      },
    );
    const t: Thread = { worker, role, ready: false };
    worker.on("message", (m: ThreadReply) => this.onMessage(t, m));
    worker.on("error", (err) => this.lost(t, err));
    worker.on("exit", (code) => this.lost(t, new Error(`exit code ${code}`)));
    return t;
  }

  /** The keeper, started now (from the replica's catalog, on the event loop) when there is none. */
  private ensureKeeper(): Thread {
    if (this.keeper) return this.keeper;
    // Snapshot and subscription in one synchronous step: no tx falls between them.
    // A copy of its own (the packer reuses its buffer): ~1 ms per 10 MB.
    const snapshot = new Uint8Array(this.source.catalog.serialize());
    this.unlisten ??= this.source.listen((reports) => this.forward(reports.map((r) => r.tx)));
    this.keeper = this.spawn("keeper", snapshot);
    return this.keeper;
  }

  /** Asks the keeper for a snapshot to seed a query thread with (unless one runs or is coming). */
  private seedQueryThread(): void {
    if (this.thread || this.seeding || this.closed) return;
    let keeper: Thread;
    try {
      keeper = this.ensureKeeper();
    } catch (err) {
      this.failQueue(
        new QueryEngineError(`cannot start the catalog query threads: ${(err as Error).message}`),
      );
      return;
    }
    this.seeding = [];
    const msg: ThreadRequest = { type: "snapshot" };
    keeper.worker.postMessage(msg);
  }

  private onMessage(t: Thread, m: ThreadReply): void {
    switch (m.type) {
      case "ready":
        t.ready = true;
        return;
      case "fatal":
        this.lost(t, new Error(m.message));
        return;
      case "snapshot": {
        const buffered = this.seeding;
        if (t !== this.keeper || buffered === null || this.closed) return;
        const thread = this.spawn("query", m.bytes);
        for (const txs of buffered) thread.worker.postMessage({ type: "tx", txs } satisfies ThreadRequest);
        thread.worker.postMessage({ type: "prepare" } satisfies ThreadRequest);
        this.seeding = null;
        this.thread = thread;
        this.pump();
        return;
      }
    }
    const run = this.running;
    if (t !== this.thread || run === null || run.job.id !== m.id) return;
    const job = run.job;
    switch (m.type) {
      case "started":
        run.timer = setTimeout(() => this.overrun(job), this.limits.timeoutMs);
        return;
      case "result":
        this.settle(job.id, () => job.resolve({ json: m.json, rows: m.rows }));
        return;
      case "bound":
        this.settle(job.id, () => job.reject(new QueryBoundError(m.bound, m.message)));
        return;
      case "error":
        // Whatever the thread threw came from running the caller's text: a query error.
        this.settle(job.id, () =>
          job.reject(new ConsoleError(m.query ? m.message : `query error: ${m.message}`)),
        );
        return;
    }
  }

  private overrun(job: Pending): void {
    const thread = this.thread;
    if (thread === null || this.running?.job !== job) return;
    this.lost(
      thread,
      new QueryBoundError(
        "time",
        `the query ran past its time budget of ${this.limits.timeoutMs} ms and was cancelled`,
      ),
    );
  }

  /** Ends the running job (if `id` is it) and starts the next. */
  private settle(id: number, finish: () => void): void {
    const run = this.running;
    if (run === null || run.job.id !== id) return;
    if (run.timer) clearTimeout(run.timer);
    this.running = null;
    finish();
    this.pump();
  }

  private failQueue(why: Error): void {
    for (const job of this.queue.splice(0)) job.reject(why);
  }

  /** A thread is gone (or must go). A query it was running fails with `why`, turned into the bound it hit. */
  private lost(t: Thread, cause: Error): void {
    if (t !== this.thread && t !== this.keeper) return;
    void t.worker.terminate();
    const oom = (cause as NodeJS.ErrnoException).code === "ERR_WORKER_OUT_OF_MEMORY";
    if (t === this.keeper) {
      this.keeper = null;
      if (this.seeding !== null) {
        // The query thread it was to seed cannot come: the waiting queries fail; the next one tries again.
        this.seeding = null;
        this.failQueue(
          oom
            ? new QueryBoundError(
                "memory",
                `the catalog copy does not fit the query threads' heap cap of ${this.limits.maxHeapMb} MB`,
              )
            : new QueryEngineError(`the catalog keeper thread stopped: ${cause.message}`),
        );
      }
      return;
    }
    this.thread = null;
    const why =
      cause instanceof QueryBoundError
        ? cause
        : oom
          ? new QueryBoundError(
              "memory",
              `the query reached the query thread's heap cap of ${this.limits.maxHeapMb} MB and was cancelled`,
            )
          : new QueryEngineError(`the query thread stopped: ${cause.message}`);
    // A thread that was working is replaced now, so the next query finds one started.
    if (t.ready && !this.closed) this.seedQueryThread();
    const run = this.running;
    if (run) this.settle(run.job.id, () => run.job.reject(why));
  }

  /** Fails waiting and running queries and stops the threads. */
  async close(): Promise<void> {
    this.closed = true;
    const why = new QueryEngineError("the catalog query engine is closed");
    this.failQueue(why);
    const run = this.running;
    this.running = null;
    if (run) {
      if (run.timer) clearTimeout(run.timer);
      run.job.reject(why);
    }
    this.unlisten?.();
    this.unlisten = null;
    this.seeding = null;
    const threads = [this.thread, this.keeper];
    this.thread = null;
    this.keeper = null;
    await Promise.all(threads.map((t) => t?.worker.terminate()));
  }
}
