import datascript, { type DB } from "datascript";
import type { Attr } from "../schema/catalog.ts";

/**
 * What a caller's Datalog may read. An admin (or the single user of a server
 * without API tokens) reads the whole catalog. A tenant reads a filtered view
 * of it holding only:
 *
 * - its own demand (`demand/*` of entities whose `demand/tenant` is it);
 * - its own routing decisions, without their internals (no
 *   `decision/candidates`, no `decision/worker`);
 * - the chunks its demand names — its salted prefixes — as structure only
 *   (`chunk/node`, `prefix`, `parent`, `model`, `start`, `tokens`; no content
 *   id, size, layout or time);
 * - the models (public: GET /v1/models names them too).
 *
 * Workers (their peer addresses), replicas, placements and leases are admin
 * only. Anything not listed is invisible: a query over it is answered as if
 * the catalog held none (the result is empty, never an error that would
 * confirm what exists).
 */
export type QueryScope = { readonly kind: "all" } | { readonly kind: "tenant"; readonly tenant: string };

const TENANT_ATTRIBUTES: ReadonlySet<string> = new Set<Attr>([
  "model/fingerprint",
  "model/name",
  "model/layout",
  "model/chunk-tokens",
  "demand/node",
  "demand/model",
  "demand/tenant",
  "demand/time",
  "demand/count",
  "decision/key",
  "decision/request",
  "decision/attempt",
  "decision/tenant",
  "decision/model",
  "decision/time",
  "decision/source",
  "decision/cached-tokens",
  "decision/predicted-ttft-ms",
  "decision/measured-ttft-ms",
  "chunk/node",
  "chunk/prefix",
  "chunk/parent",
  "chunk/model",
  "chunk/start",
  "chunk/tokens",
]);

/** The entities a tenant may see (before the attribute filter). */
function tenantEntities(db: DB, tenant: string): Set<number> {
  const visible = new Set<number>();
  for (const d of datascript.datoms(db, ":aevt", "model/fingerprint")) visible.add(d.e);
  for (const d of datascript.datoms(db, ":aevt", "decision/tenant")) if (d.v === tenant) visible.add(d.e);
  for (const d of datascript.datoms(db, ":aevt", "demand/tenant")) {
    if (d.v !== tenant) continue;
    visible.add(d.e);
    for (const n of datascript.datoms(db, ":eavt", d.e, "demand/node"))
      for (const c of datascript.datoms(db, ":avet", "chunk/node", n.v)) visible.add(c.e);
  }
  return visible;
}

/** The db a query in `scope` runs against. */
export function scopedDb(db: DB, scope: QueryScope): DB {
  if (scope.kind === "all") return db;
  const visible = tenantEntities(db, scope.tenant);
  return datascript.filter(db, (_db, d) => visible.has(d.e) && TENANT_ATTRIBUTES.has(d.a));
}
