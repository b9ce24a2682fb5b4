import type { Worker } from "node:worker_threads";
import { startTsThread } from "../schema/threads.ts";
import { ConsoleError } from "./console.ts";
import type { CatalogDb } from "./db.ts";
import type { QueryScope } from "./query-scope.ts";
import type { ThreadReply, ThreadRequest } from "./query-thread.ts";
import type { ReplicaListener } from "./replica.ts";

/**
 * User Datalog, bounded and off the event loop. One query thread
 * (catalog/query-thread.ts) holds a copy of the replica's catalog: seeded
 * with a snapshot when it starts, then sent every transaction the replica
 * applies, in order, so it is current without re-copying. Queries run there
 * one at a time, FIFO, with these bounds:
 *
 * - time: `timeoutMs` from the moment the thread starts the query (folding
 *   new transactions into its view comes before, and is not the query's);
 *   past it the thread is terminated — a runaway recursive rule stops;
 * - result: at most `maxResultRows` rows and `maxResultBytes` of JSON;
 * - memory: the thread's heap is capped at `maxHeapMb` (catalog copy
 *   included); a query that reaches it kills only the thread;
 * - queue: `maxQueued` queries wait at most; one more is refused at once.
 *
 * A thread terminated for a query's overrun is replaced at once (a new
 * snapshot), so the next query does not wait for a thread to start; one
 * that died before it was ready is replaced only by the next query (no
 * restart loop). The first query on a new thread pays for building its
 * Datalog view. Errors: a bound is a QueryBoundError naming it; a bad query
 * is a ConsoleError.
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
  readonly unlisten: () => void;
  /** It loaded its copy of the catalog. */
  ready: boolean;
}

const THREAD_ENTRY = new URL("./query-thread.ts", import.meta.url);

export class CatalogQueryEngine {
  private thread: Thread | null = null;
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
    if (this.running !== null && this.queue.length >= this.limits.maxQueued)
      return Promise.reject(
        new QueryBoundError(
          "queue",
          `a query is running and ${this.queue.length} are waiting, the most allowed; retry shortly`,
        ),
      );
    return new Promise((resolve, reject) => {
      this.queue.push({ id: this.nextId++, q, resolve, reject });
      this.pump();
    });
  }

  private pump(): void {
    if (this.running !== null || this.closed) return;
    const job = this.queue.shift();
    if (job === undefined) return;
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
    let thread: Thread;
    try {
      thread = this.ensureThread();
    } catch (err) {
      this.settle(job.id, () =>
        job.reject(new QueryEngineError(`cannot start the query thread: ${(err as Error).message}`)),
      );
      return;
    }
    thread.worker.postMessage(msg);
  }

  /** The live thread, or a new one seeded with the replica's catalog now (and every tx after). */
  private ensureThread(): Thread {
    if (this.thread) return this.thread;
    // Snapshot and subscription in one synchronous step: no tx falls between them.
    const snapshot = this.source.catalog.serialize();
    const buffer = snapshot.buffer.slice(
      snapshot.byteOffset,
      snapshot.byteOffset + snapshot.byteLength,
    ) as ArrayBuffer;
    const worker = startTsThread(
      THREAD_ENTRY,
      { snapshot: new Uint8Array(buffer) },
      { transfer: [buffer], resourceLimits: { maxOldGenerationSizeMb: this.limits.maxHeapMb } },
    );
    const unlisten = this.source.listen((reports) => {
      const tx: ThreadRequest = { type: "tx", txs: reports.map((r) => r.tx) };
      worker.postMessage(tx);
    });
    const thread: Thread = { worker, unlisten, ready: false };
    worker.on("message", (m: ThreadReply) => {
      if (m.type === "ready") thread.ready = true;
      else this.onReply(m);
    });
    worker.on("error", (err) => {
      const oom = (err as NodeJS.ErrnoException).code === "ERR_WORKER_OUT_OF_MEMORY";
      this.lost(
        thread,
        oom
          ? new QueryBoundError(
              "memory",
              `the query reached the query thread's heap cap of ${this.limits.maxHeapMb} MB and was cancelled`,
            )
          : new QueryEngineError(`the query thread failed: ${err.message}`),
      );
    });
    worker.on("exit", (code) =>
      this.lost(thread, new QueryEngineError(`the query thread exited (code ${code})`)),
    );
    this.thread = thread;
    return thread;
  }

  private onReply(m: Exclude<ThreadReply, { type: "ready" }>): void {
    const run = this.running;
    if (m.type === "fatal") {
      if (this.thread) this.lost(this.thread, new QueryEngineError(m.message));
      return;
    }
    if (run === null || run.job.id !== m.id) return;
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

  /** The thread is gone (or must go): the running query fails with `why`; the next query starts a new thread. */
  private lost(thread: Thread, why: Error): void {
    if (this.thread !== thread) return;
    this.thread = null;
    thread.unlisten();
    void thread.worker.terminate();
    // A thread that was working is replaced now, so the next query finds one started.
    if (thread.ready && !this.closed) this.respawn();
    const run = this.running;
    if (run) this.settle(run.job.id, () => run.job.reject(why));
  }

  private respawn(): void {
    try {
      this.ensureThread();
    } catch {
      // The next query tries again and reports why.
    }
  }

  /** Fails waiting and running queries and stops the thread. */
  async close(): Promise<void> {
    this.closed = true;
    const why = new QueryEngineError("the catalog query engine is closed");
    for (const job of this.queue.splice(0)) job.reject(why);
    const run = this.running;
    this.running = null;
    if (run) {
      if (run.timer) clearTimeout(run.timer);
      run.job.reject(why);
    }
    const thread = this.thread;
    this.thread = null;
    if (thread) {
      thread.unlisten();
      await thread.worker.terminate();
    }
  }
}
