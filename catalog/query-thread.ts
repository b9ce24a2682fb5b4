import { parentPort, workerData } from "node:worker_threads";
import type { TxRecord } from "../schema/catalog.ts";
import { ConsoleError, runQuery } from "./console.ts";
import { CatalogDb } from "./db.ts";
import { type QueryScope, scopedDb } from "./query-scope.ts";

/**
 * The catalog query thread (catalog/query-engine.ts runs it): a private copy
 * of the replica's catalog, seeded from a snapshot and kept current by the
 * transactions the replica forwards, and user Datalog run against it. One
 * query at a time; the engine terminates the thread when a query overruns.
 *
 * Per query: fold pending transactions into the Datalog view (not the
 * query's cost), say "started" (the engine's time budget starts then), scope
 * the view to the caller, run, then check the row cap before serializing and
 * the byte cap after.
 */

export type ThreadRequest =
  | { readonly type: "tx"; readonly txs: readonly TxRecord[] }
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
const { snapshot } = (workerData as { data: { snapshot: Uint8Array } }).data;
const db = CatalogDb.deserialize(snapshot);
const reply = (r: ThreadReply) => port.postMessage(r);
reply({ type: "ready" });

port.on("message", (m: ThreadRequest) => {
  if (m.type === "tx") {
    try {
      for (const tx of m.txs) db.apply(tx);
    } catch (err) {
      // The copy can no longer follow the replica: the engine starts a fresh thread.
      reply({ type: "fatal", message: `query thread's catalog copy: ${(err as Error).message}` });
      process.exit(1);
    }
    return;
  }
  const view = db.datalog();
  reply({ type: "started", id: m.id });
  try {
    const result = runQuery(scopedDb(view, m.scope), m.query, m.rules);
    const rows = Array.isArray(result) ? result.length : 1;
    if (rows > m.maxRows) {
      reply({
        type: "bound",
        id: m.id,
        bound: "rows",
        message: `the result has ${rows} rows, over the cap of ${m.maxRows} rows`,
      });
      return;
    }
    const json = JSON.stringify(result) ?? "null";
    const bytes = Buffer.byteLength(json);
    if (bytes > m.maxBytes) {
      reply({
        type: "bound",
        id: m.id,
        bound: "bytes",
        message: `the result is ${bytes} bytes of JSON, over the cap of ${m.maxBytes} bytes`,
      });
      return;
    }
    reply({ type: "result", id: m.id, json, rows });
  } catch (err) {
    reply({ type: "error", id: m.id, message: (err as Error).message, query: err instanceof ConsoleError });
  }
});
