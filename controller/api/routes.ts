/**
 * The front door's routes and the fixed label sets /metrics counts them
 * under. A route is a method and a path; a path segment written `{name}`
 * matches any one segment (`/v1/models/{id}`). Every GET route answers HEAD
 * too. What a route is labelled is its declared `METHOD path`, never the URL
 * a client sent: a request that matches no route counts as `unmatched` (its
 * status, 404 or 405, says which), so the label set is the table's, fixed
 * when the server is made.
 */

/** Who may call a route: anyone, an operator (scrape token or admin tenant), or any API tenant. */
export type Access = "open" | "operator" | "tenant";

export interface RouteSpec<H> {
  readonly method: "GET" | "POST";
  readonly path: string;
  readonly access: Access;
  readonly handler: H;
}

export type RouteMatch<H> =
  | {
      readonly kind: "route";
      readonly route: RouteSpec<H>;
      readonly label: string;
      readonly params: Readonly<Record<string, string>>;
    }
  /** The path exists, the method does not: answer 405 with these in `Allow`. */
  | { readonly kind: "method"; readonly allow: readonly string[] }
  | { readonly kind: "none" };

export const UNMATCHED_ROUTE = "unmatched";
/** A CORS preflight (OPTIONS with Access-Control-Request-Method), when CORS is on. */
export const PREFLIGHT_ROUTE = "preflight";
/** A path under a mounted handler (ApiServer.mount: the web view's /ui). */
export const MOUNTED_ROUTE = "mounted";

/** Statuses the front door answers; anything else counts as "other" (so the set stays fixed). */
export const STATUS_LABELS = [
  "200",
  "204",
  "400",
  "401",
  "403",
  "404",
  "405",
  "408",
  "413",
  "415",
  "429",
  "499",
  "500",
  "503",
  "504",
  "other",
] as const;
export type StatusLabel = (typeof STATUS_LABELS)[number];

/** The status label of a response; 499 (nginx's "client closed request") is a cancelled one. */
export function statusLabel(status: number): StatusLabel {
  const s = String(status);
  return (STATUS_LABELS as readonly string[]).includes(s) ? (s as StatusLabel) : "other";
}

interface Compiled<H> {
  readonly spec: RouteSpec<H>;
  readonly segments: readonly string[];
}

const split = (path: string) => path.split("/").slice(1);

export class RouteTable<H> {
  private readonly routes: readonly Compiled<H>[];

  constructor(routes: readonly RouteSpec<H>[]) {
    const seen = new Set<string>();
    for (const r of routes) {
      const key = `${r.method} ${r.path}`;
      if (seen.has(key)) throw new Error(`route ${key} declared twice`);
      seen.add(key);
    }
    this.routes = routes.map((spec) => ({ spec, segments: split(spec.path) }));
  }

  /** Every label a request can be counted under. */
  labels(): string[] {
    const out: string[] = [];
    for (const { spec } of this.routes) {
      out.push(`${spec.method} ${spec.path}`);
      if (spec.method === "GET") out.push(`HEAD ${spec.path}`);
    }
    out.push(UNMATCHED_ROUTE, PREFLIGHT_ROUTE, MOUNTED_ROUTE);
    return out;
  }

  match(method: string, path: string): RouteMatch<H> {
    const segments = split(path);
    const allow = new Set<string>();
    for (const r of this.routes) {
      const params = matchSegments(r.segments, segments);
      if (params === null) continue;
      const methods = r.spec.method === "GET" ? ["GET", "HEAD"] : [r.spec.method];
      if (methods.includes(method))
        return { kind: "route", route: r.spec, label: `${method} ${r.spec.path}`, params };
      for (const m of methods) allow.add(m);
    }
    return allow.size > 0 ? { kind: "method", allow: [...allow] } : { kind: "none" };
  }
}

function matchSegments(pattern: readonly string[], got: readonly string[]): Record<string, string> | null {
  if (pattern.length !== got.length) return null;
  const params: Record<string, string> = {};
  for (let i = 0; i < pattern.length; i++) {
    const p = pattern[i]!;
    const g = got[i]!;
    if (p.startsWith("{") && p.endsWith("}")) {
      if (g === "") return null;
      params[p.slice(1, -1)] = g;
    } else if (p !== g) return null;
  }
  return params;
}
