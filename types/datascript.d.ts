/**
 * The part of datascript@1.8.1's JavaScript API (src/datascript/js.cljs) this
 * project uses. The package ships no types. Attributes are plain strings
 * ("chunk/node"); schema keys and values are strings like ":db/valueType".
 */
declare module "datascript" {
  /** An immutable database value. */
  export interface DB {
    readonly __datascriptDb: unique symbol;
  }
  /** A mutable reference to a DB. */
  export interface Conn {
    readonly __datascriptConn: unique symbol;
  }
  export interface Datom {
    readonly e: number;
    readonly a: string;
    readonly v: unknown;
    readonly tx: number;
  }
  export type Schema = Record<string, Record<string, string | boolean>>;
  /** [":db/add" | ":db/retract", e, a, v] or an entity map. */
  export type TxItem = readonly [string, number, string, unknown] | Record<string, unknown>;
  export interface TxReport {
    readonly db_before: DB;
    readonly db_after: DB;
    readonly tx_data: readonly Datom[];
    readonly tempids: Record<string, number>;
  }
  export type Index = ":eavt" | ":aevt" | ":avet";

  export function empty_db(schema?: Schema): DB;
  /** Builds a DB from [e, a, v, tx?] arrays in one bulk pass (no transaction checks). */
  export function init_db(
    datoms: readonly (readonly [number, string, unknown, number?])[],
    schema?: Schema,
  ): DB;
  export function db_with(db: DB, tx: readonly TxItem[]): DB;
  export function conn_from_db(db: DB): Conn;
  export function db(conn: Conn): DB;
  export function transact(conn: Conn, tx: readonly TxItem[], txMeta?: unknown): TxReport;
  export function reset_conn(conn: Conn, db: DB, txMeta?: unknown): DB;
  /** Query text in EDN; inputs follow (a DB for `$`, an EDN string or array for rules `%`). */
  export function q(query: string, ...inputs: unknown[]): unknown;
  export function pull(db: DB, pattern: string | unknown[], eid: number | unknown[]): unknown;
  export function datoms(db: DB, index: Index, ...components: unknown[]): Datom[];
  /** A view of `db` holding only the datoms `pred` admits (queries over it see nothing else). */
  export function filter(db: DB, pred: (db: DB, datom: Datom) => boolean): DB;
  export function serializable(db: DB): unknown;
  export function from_serializable(value: unknown): DB;

  const datascript: {
    empty_db: typeof empty_db;
    init_db: typeof init_db;
    db_with: typeof db_with;
    conn_from_db: typeof conn_from_db;
    db: typeof db;
    transact: typeof transact;
    reset_conn: typeof reset_conn;
    q: typeof q;
    pull: typeof pull;
    datoms: typeof datoms;
    filter: typeof filter;
    serializable: typeof serializable;
    from_serializable: typeof from_serializable;
  };
  export default datascript;
}
