import { ConsoleError } from "../../catalog/console.ts";
import {
  type CatalogQuery,
  type QueryAnswer,
  type QueryBound,
  QueryBoundError,
  QueryEngineError,
} from "../../catalog/query-engine.ts";
import type { Principal } from "./auth.ts";
import { ApiError, badRequest, unavailable } from "./errors.ts";
import { describeValue } from "./limits.ts";

/**
 * POST /v1/catalog/query: `{"query": "[:find …]", "rules"?: "[…]"}` checked,
 * scoped to the caller (an admin reads the whole catalog, a tenant its own
 * part: catalog/query-scope.ts), run by the bounded engine, and every
 * failure mapped to what a client can act on:
 *
 *   bad query text                    400 query_error
 *   time budget, heap cap             400 query_time_budget, query_memory_cap
 *   result over its row or byte cap   400 query_result_too_large
 *   queue full                        503 query_queue_full, Retry-After
 *   the engine itself failed          503
 *
 * Each message names its config key (controller.catalogQuery.*).
 */

const KNOWN_FIELDS = new Set(["query", "rules", "args"]);

const BOUND_ANSWERS: Record<QueryBound, { key: string; code: string }> = {
  time: { key: "timeoutMs", code: "query_time_budget" },
  memory: { key: "maxHeapMb", code: "query_memory_cap" },
  rows: { key: "maxResultRows", code: "query_result_too_large" },
  bytes: { key: "maxResultBytes", code: "query_result_too_large" },
  queue: { key: "maxQueued", code: "query_queue_full" },
};

export const CATALOG_OUTCOMES = [
  "ok",
  "bad_request",
  "query_error",
  "time",
  "memory",
  "rows",
  "bytes",
  "queue",
  "engine_error",
] as const;
export type CatalogOutcome = (typeof CATALOG_OUTCOMES)[number];

function parseBody(body: unknown): { query: string; rules: string | undefined } {
  if (typeof body !== "object" || body === null || Array.isArray(body))
    throw badRequest("body must be a JSON object");
  const b = body as Record<string, unknown>;
  for (const k of Object.keys(b))
    if (!KNOWN_FIELDS.has(k))
      throw badRequest(`unknown field '${k.slice(0, 64)}' (known: query, rules)`, k.slice(0, 64));
  if (typeof b.query !== "string" || b.query === "")
    throw badRequest(`'query' must be a Datalog query string, got ${describeValue(b.query)}`, "query");
  if (b.args !== undefined && !(Array.isArray(b.args) && b.args.length === 0))
    throw badRequest("query arguments are not supported; inline them in the query", "args");
  if (b.rules !== undefined && typeof b.rules !== "string")
    throw badRequest(`'rules' must be a string, got ${describeValue(b.rules)}`, "rules");
  return { query: b.query, rules: b.rules as string | undefined };
}

export async function runCatalogQuery(
  engine: { query(q: CatalogQuery): Promise<QueryAnswer> },
  body: unknown,
  who: Principal,
): Promise<QueryAnswer> {
  const { query, rules } = parseBody(body);
  try {
    return await engine.query({
      query,
      rules,
      scope: who.admin ? { kind: "all" } : { kind: "tenant", tenant: who.tenant },
    });
  } catch (err) {
    if (err instanceof ConsoleError) throw badRequest(err.message, "query", "query_error");
    if (err instanceof QueryBoundError) {
      const a = BOUND_ANSWERS[err.bound];
      const message = `${err.message} (controller.catalogQuery.${a.key})`;
      if (err.bound === "queue") throw unavailable(message, 1, a.code);
      throw badRequest(message, "query", a.code);
    }
    if (err instanceof QueryEngineError) throw unavailable(err.message);
    throw err;
  }
}

/** The outcome /metrics counts for a failed query. */
export function catalogQueryOutcome(err: unknown): CatalogOutcome {
  if (err instanceof ApiError) {
    switch (err.code) {
      case "query_error":
        return "query_error";
      case "query_time_budget":
        return "time";
      case "query_memory_cap":
        return "memory";
      case "query_queue_full":
        return "queue";
      case "query_result_too_large":
        return err.message.includes("maxResultRows") ? "rows" : "bytes";
    }
    return err.status < 500 ? "bad_request" : "engine_error";
  }
  return "engine_error";
}
