import { parentPort, workerData } from "node:worker_threads";
import type { TxRecord } from "../schema/catalog.ts";
import { ConsoleError, runQuery } from "./console.ts";
import { CatalogDb } from "./db.ts";
import { type QueryScope, scopedDb } from "./query-scope.ts";

/**
 * A thread of the catalog query engine (catalog/query-engine.ts) holding a
 * private copy of the replica's catalog: seeded from a snapshot, kept current
 * by the transactions the replica forwards (one it already holds is skipped,
 * so a copy seeded mid-stream can be sent the stream from before its seed).
 *
 * Two roles. The keeper only follows and, asked, serializes its copy: a new
 * query thread is seeded from it without the event loop serializing the
 * catalog. The query thread runs user Datalog, one query at a time: fold
 * pending transactions into the Datalog view (not the query's cost), say
 * "started" (the engine's time budget starts then), scope the view to the
 * caller, run, then check the row cap before serializing and the byte cap
 * after. The engine terminates a query thread whose query overruns.
 */

export type ThreadRole = "keeper" | "query";

export type ThreadRequest =
  | { readonly type: "tx"; readonly txs: readonly TxRecord[] }
  | { readonly type: "snapshot" }
  /** Build the Datalog view now, so the first query does not wait for it. */
  | { readonly type: "prepare" }
  | {
      readonly type: "query";
      readonly id: number;
      readonly query: string;
      readonly rules: string | undefined;
      readonly scope: QueryScope;
      readonly maxRows: number;
      readonly maxBytes: number;
    };

export type ThreadReply =
  | { readonly type: "ready" }
  | { readonly type: "snapshot"; readonly bytes: Uint8Array }
  | { readonly type: "started"; readonly id: number }
  | { readonly type: "result"; readonly id: number; readonly json: string; readonly rows: number }
  | {
      readonly type: "bound";
      readonly id: number;
      readonly bound: "rows" | "bytes";
      readonly message: string;
    }
  | { readonly type: "error"; readonly id: number; readonly message: string; readonly query: boolean }
  | { readonly type: "fatal"; readonly message: string };

const port = parentPort!;
const { role, snapshot } = (workerData as { data: { role: ThreadRole; snapshot: Uint8Array } }).data;
const db = CatalogDb.deserialize(snapshot);
const reply = (r: ThreadReply, transfer: ArrayBuffer[] = []) => port.postMessage(r, transfer);
reply({ type: "ready" });

function apply(txs: readonly TxRecord[]): void {
  try {
    for (const tx of txs) if (tx.txNo > db.lastTxNo) db.apply(tx);
  } catch (err) {
    // The copy can no longer follow the replica: the engine replaces the thread.
    reply({ type: "fatal", message: `${role} thread's catalog copy: ${(err as Error).message}` });
    process.exit(1);
  }
}

function query(m: Extract<ThreadRequest, { type: "query" }>): void {
  const view = db.datalog();
  reply({ type: "started", id: m.id });
  try {
    const result = runQuery(scopedDb(view, m.scope), m.query, m.rules);
    const rows = Array.isArray(result) ? result.length : 1;
    if (rows > m.maxRows) {
      const message = `the result has ${rows} rows, over the cap of ${m.maxRows} rows`;
      reply({ type: "bound", id: m.id, bound: "rows", message });
      return;
    }
    const json = JSON.stringify(result) ?? "null";
    const bytes = Buffer.byteLength(json);
    if (bytes > m.maxBytes) {
      const message = `the result is ${bytes} bytes of JSON, over the cap of ${m.maxBytes} bytes`;
      reply({ type: "bound", id: m.id, bound: "bytes", message });
      return;
    }
    reply({ type: "result", id: m.id, json, rows });
  } catch (err) {
    reply({ type: "error", id: m.id, message: (err as Error).message, query: err instanceof ConsoleError });
  }
}

port.on("message", (m: ThreadRequest) => {
  if (m.type === "tx") apply(m.txs);
  else if (m.type === "snapshot" && role === "keeper") {
    // A copy of its own: the packer's buffer is reused, a transferred one would not be.
    const bytes = new Uint8Array(db.serialize());
    reply({ type: "snapshot", bytes }, [bytes.buffer as ArrayBuffer]);
  } else if (m.type === "prepare" && role === "query") db.datalog();
  else if (m.type === "query" && role === "query") query(m);
});
