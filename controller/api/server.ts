import {
  createServer,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from "node:http";
import type { AddressInfo } from "node:net";
import type { CatalogQuery, QueryAnswer } from "../../catalog/query-engine.ts";
import { Counter, CounterView, Gauge, Histogram, LATENCY_BUCKETS_S, Registry } from "../metrics.ts";
import { Authenticator, type AuthPolicy, type Principal } from "./auth.ts";
import { readJsonBody } from "./body.ts";
import {
  CATALOG_OUTCOMES,
  type CatalogOutcome,
  catalogQueryOutcome,
  runCatalogQuery,
} from "./catalog-endpoint.ts";
import { Completions } from "./completions.ts";
import {
  CONNECTION_CLOSE_REASONS,
  ConnectionGuard,
  defaultHttpBounds,
  type HttpBounds,
} from "./connections.ts";
import { ApiError } from "./errors.ts";
import { CorsPolicy, requestIdentity } from "./headers.ts";
import {
  checkPromptLimits,
  checkRawLimits,
  checkTextLimit,
  defaultRequestLimits,
  type RequestLimits,
} from "./limits.ts";
import { type CodecThreads, encodeOne, promptIds } from "./prompts.ts";
import { parseChatRequest, parseCompletionRequest } from "./request.ts";
import {
  type Access,
  MOUNTED_ROUTE,
  PREFLIGHT_ROUTE,
  RouteTable,
  STATUS_LABELS,
  type StatusLabel,
  statusLabel,
  UNMATCHED_ROUTE,
} from "./routes.ts";
import type { InferenceService, ModelInfo } from "./service.ts";
import { detokenize, findModel, modelCard, pickModel, tokenizeAnswer, tokenizeInput } from "./tokenize.ts";
import { SERVER_VERSION } from "./version.ts";

/**
 * The OpenAI-compatible HTTP front door of the embedded default and the
 * fleet controller. Per request, in order: a request id (the client's
 * X-Request-Id or a new one, on every response), CORS headers when enabled,
 * the route (404, or 405 with Allow), who is calling (auth.ts), then the
 * route's handler. Completions: the body (body.ts: content type, size,
 * UTF-8, JSON), length limits (limits.ts) before any tokenizing, tokenizing
 * off the event loop for large inputs (prompts.ts), then generation
 * (completions.ts). Connections are bounded by connections.ts.
 *
 * /metrics counts every request once, when its response ends, under the
 * matched route's declared label (routes.ts) and its status (499: the
 * client went away first).
 */

export interface ApiServerOptions {
  readonly host: string;
  readonly port: number;
  /** Default: no API tokens (every caller is tenant "default", an admin). */
  readonly auth?: AuthPolicy;
  readonly http?: HttpBounds;
  readonly limits?: RequestLimits;
  /** Origins allowed by CORS ("*": any); empty or absent: CORS off. */
  readonly corsOrigins?: readonly string[];
  /** Tokenizer threads per served model id; absent: every prompt is tokenized inline. */
  readonly tokenizers?: ReadonlyMap<string, CodecThreads>;
  /** The bounded catalog query engine; absent: POST /v1/catalog/query answers 503. */
  readonly catalog?: { query(q: CatalogQuery): Promise<QueryAnswer> };
  /** Structured log sink: one event per call, level by what happened. */
  readonly log?: (event: string, fields: Record<string, unknown>, level?: "info" | "warn") => void;
}

/** A handler of every path under `prefix`; what it throws is answered like the API's own errors. */
export interface ApiMount {
  readonly prefix: string;
  /** `authenticate` admits an operator (the metrics token or an admin) or throws the API's 401/403. */
  handle(req: IncomingMessage, res: ServerResponse, url: URL, authenticate: () => void): Promise<void>;
}

/** One request in flight. */
interface Call {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  readonly xRequestId: string;
  readonly fromClient: boolean;
  readonly t0: number;
  label: string;
  /** The matched route's `{name}` segments, decoded. */
  params: Readonly<Record<string, string>>;
  /** What /metrics counts when the HTTP status does not say it (a failed or cancelled stream). */
  countAs: StatusLabel | null;
}

type Handler = (call: Call, who: Principal | null) => Promise<void> | void;

export class ApiServer {
  private server: Server | undefined;
  private readonly mounts: ApiMount[] = [];
  private guard: ConnectionGuard | undefined;
  readonly metrics = new Registry();
  private readonly routes: RouteTable<Handler>;
  private readonly requests: Counter<{ route: string[]; status: typeof STATUS_LABELS }>;
  private readonly catalogQueries: Counter<{ outcome: typeof CATALOG_OUTCOMES }>;
  private readonly auth: Authenticator;
  private readonly cors: CorsPolicy;
  private readonly limits: RequestLimits;
  private readonly http: HttpBounds;
  private readonly completions: Completions;

  constructor(
    private readonly service: InferenceService,
    private readonly opts: ApiServerOptions,
  ) {
    this.auth = new Authenticator(opts.auth ?? { tokens: {}, adminTenants: [], metricsToken: "" });
    this.cors = new CorsPolicy(opts.corsOrigins ?? []);
    this.limits = opts.limits ?? defaultRequestLimits;
    this.http = opts.http ?? defaultHttpBounds;
    this.routes = new RouteTable<Handler>([
      { method: "GET", path: "/health", access: "open", handler: (c) => this.json(c, 200, { status: "ok" }) },
      { method: "GET", path: "/metrics", access: "operator", handler: (c) => this.metricsText(c) },
      ...(service.workers
        ? [
            {
              method: "GET",
              path: "/workers",
              access: "operator",
              handler: (c: Call) => this.json(c, 200, { workers: service.workers!() }),
            } as const,
          ]
        : []),
      {
        method: "GET",
        path: "/version",
        access: "open",
        handler: (c) => this.json(c, 200, { version: SERVER_VERSION }),
      },
      { method: "GET", path: "/v1/models", access: "tenant", handler: (c) => this.models(c) },
      {
        method: "GET",
        path: "/v1/models/{id}",
        access: "tenant",
        handler: (c) => this.json(c, 200, modelCard(pickModel(this.service.models(), c.params.id))),
      },
      { method: "POST", path: "/tokenize", access: "tenant", handler: (c) => this.tokenize(c) },
      { method: "POST", path: "/detokenize", access: "tenant", handler: (c) => this.detokenize(c) },
      {
        method: "POST",
        path: "/v1/completions",
        access: "tenant",
        handler: (c, who) => this.complete(c, who!, "completion"),
      },
      {
        method: "POST",
        path: "/v1/chat/completions",
        access: "tenant",
        handler: (c, who) => this.complete(c, who!, "chat"),
      },
      {
        method: "POST",
        path: "/v1/catalog/query",
        access: "tenant",
        handler: (c, who) => this.catalogQuery(c, who!),
      },
    ]);
    const m = this.metrics;
    this.requests = m.add(
      new Counter(
        "continuum_http_requests_total",
        "HTTP requests by route and status (499: the client went away).",
        {
          route: this.routes.labels(),
          status: STATUS_LABELS,
        },
      ),
    );
    this.catalogQueries = m.add(
      new Counter(
        "continuum_catalog_queries_total",
        "POST /v1/catalog/query outcomes (a bound's name when one stopped it).",
        {
          outcome: CATALOG_OUTCOMES,
        },
      ),
    );
    this.completions = new Completions(
      service,
      {
        ttft: m.add(
          new Histogram(
            "continuum_ttft_seconds",
            "Time from request arrival to its first token.",
            LATENCY_BUCKETS_S,
          ),
        ),
        itl: m.add(
          new Histogram(
            "continuum_inter_token_seconds",
            "Time between consecutive tokens of one choice.",
            LATENCY_BUCKETS_S,
          ),
        ),
        tokensOut: m.add(new Counter("continuum_generated_tokens_total", "Tokens generated.")),
        promptTokens: m.add(new Counter("continuum_prompt_tokens_total", "Prompt tokens admitted.")),
      },
      (level, event, fields) => this.log(event, fields, level),
      this.http.maxUnsentBytes,
    );
    const g = () => service.gauges();
    m.add(new Gauge("continuum_pages_free", "Free KV pages.", () => [[{}, g().pagesFree]]));
    m.add(new Gauge("continuum_pages_capacity", "KV pages in the pool.", () => [[{}, g().pagesTotal]]));
    m.add(new Gauge("continuum_queue_depth", "Requests waiting or running.", () => [[{}, g().queueDepth]]));
    m.add(
      new Gauge("continuum_catalog_lag", "Catalog transactions not yet applied here.", () => [
        [{}, g().catalogLag],
      ]),
    );
    m.add(
      new Gauge(
        "continuum_cache_tokens",
        "Prompt tokens served by source (resident, ram, ssd, peer, s3, recompute).",
        () => Object.entries(g().cacheTokensBySource).map(([source, v]) => [{ source }, v] as const),
      ),
    );
    m.add(
      new Gauge(
        "continuum_http_connections",
        "Open HTTP connections, and those with no request in flight.",
        () => [
          [{ state: "open" }, this.guard?.openConnections ?? 0],
          [{ state: "idle" }, this.guard?.idleConnections ?? 0],
        ],
      ),
    );
    m.add(
      new CounterView(
        "continuum_http_connections_closed_total",
        "Connections the server closed: no_request (none within the headers timeout), shed_idle (the cap), refused_full (503 at the cap).",
        () =>
          CONNECTION_CLOSE_REASONS.map((reason) => [{ reason }, this.guard?.closed[reason] ?? 0] as const),
      ),
    );
  }

  /** Serves every path under `m.prefix` with `m` (the web view's /ui), before the API's own routes. */
  mount(m: ApiMount): void {
    this.mounts.push(m);
  }

  async start(): Promise<number> {
    const server = createServer(
      { connectionsCheckingInterval: ConnectionGuard.checkIntervalMs(this.http) },
      (req, res) => void this.dispatch(req, res),
    );
    this.guard = new ConnectionGuard(server, this.http, (event, fields) => this.log(event, fields, "warn"));
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.opts.port, this.opts.host, () => resolve());
    });
    return (server.address() as AddressInfo).port;
  }

  async close(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    this.guard?.close();
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  private log(event: string, fields: Record<string, unknown>, level: "info" | "warn" = "info"): void {
    this.opts.log?.(event, fields, level);
  }

  private async dispatch(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (this.guard?.isRefused(req.socket)) {
      req.socket.destroy();
      return;
    }
    const identity = requestIdentity(req.headers);
    const call: Call = {
      req,
      res,
      xRequestId: identity.id,
      fromClient: identity.fromClient,
      t0: performance.now(),
      label: UNMATCHED_ROUTE,
      params: {},
      countAs: null,
    };
    res.setHeader("x-request-id", identity.id);
    for (const [k, v] of Object.entries(this.cors.responseHeaders(req.headers)))
      if (v !== undefined) res.setHeader(k, v);
    res.once("close", () => {
      const status = call.countAs ?? (res.writableFinished ? statusLabel(res.statusCode) : "499");
      this.requests.inc({ route: call.label, status });
    });
    try {
      if (this.cors.isPreflight(req.method, req.headers)) {
        call.label = PREFLIGHT_ROUTE;
        const p = this.cors.preflight(req.headers);
        res.writeHead(p.status, p.headers);
        res.end();
        return;
      }
      const url = req.url ?? "/";
      const q = url.indexOf("?");
      const path = q < 0 ? url : url.slice(0, q);
      const mount = this.mounts.find((m) => path === m.prefix || path.startsWith(`${m.prefix}/`));
      if (mount) {
        call.label = MOUNTED_ROUTE;
        await mount.handle(
          req,
          res,
          new URL(url, "http://x"),
          () => void this.admit("operator", req.headers),
        );
        return;
      }
      const match = this.routes.match(req.method ?? "", path);
      if (match.kind === "none")
        throw new ApiError(
          404,
          `no route for ${req.method} ${describePath(url)}`,
          "invalid_request_error",
          null,
          "not_found",
        );
      if (match.kind === "method") {
        res.setHeader("allow", match.allow.join(", "));
        throw new ApiError(
          405,
          `${req.method} is not allowed on ${describePath(url)}; allowed: ${match.allow.join(", ")}`,
          "invalid_request_error",
          null,
          "method_not_allowed",
        );
      }
      call.label = match.label;
      call.params = match.params;
      if (identity.error) throw identity.error;
      await match.route.handler(call, this.admit(match.route.access, req.headers));
    } catch (err) {
      this.fail(call, err);
    }
  }

  private admit(access: Access, headers: IncomingHttpHeaders): Principal | null {
    if (access === "open") return null;
    if (access === "operator") {
      this.auth.operator(headers);
      return null;
    }
    return this.auth.tenant(headers);
  }

  private metricsText(call: Call): void {
    const text = this.metrics.render();
    call.res.writeHead(200, {
      "content-type": "text/plain; version=0.0.4",
      "content-length": Buffer.byteLength(text),
    });
    call.res.end(text);
  }

  private models(call: Call): void {
    this.json(call, 200, { object: "list", data: this.service.models().map(modelCard) });
  }

  /** vLLM's POST /tokenize: a prompt, or messages rendered by the chat template; large text on the threads. */
  private async tokenize(call: Call): Promise<void> {
    const raw = await readJsonBody(call.req, this.limits.maxBodyBytes);
    checkRawLimits(raw, this.limits);
    const input = tokenizeInput(this.service.models(), raw);
    checkTextLimit(input.text, this.limits);
    const ids = await encodeOne(input.model.codec, this.opts.tokenizers?.get(input.model.id), input.text, {
      addSpecialTokens: input.addSpecialTokens,
    });
    this.json(call, 200, tokenizeAnswer(input, ids));
  }

  private async detokenize(call: Call): Promise<void> {
    const raw = await readJsonBody(call.req, this.limits.maxBodyBytes);
    this.json(call, 200, detokenize(this.service.models(), raw));
  }

  private model(name: string): ModelInfo {
    return findModel(this.service.models(), name);
  }

  private async complete(call: Call, who: Principal, kind: "completion" | "chat"): Promise<void> {
    const raw = await readJsonBody(call.req, this.limits.maxBodyBytes);
    checkRawLimits(raw, this.limits);
    const parsed = kind === "chat" ? parseChatRequest(raw) : parseCompletionRequest(raw);
    const textBytes = checkPromptLimits(parsed, this.limits);
    const model = this.model(parsed.model);
    const prompts = await promptIds(parsed, model.codec, this.opts.tokenizers?.get(model.id), textBytes);
    await this.completions.run(
      {
        res: call.res,
        xRequestId: call.xRequestId,
        fromClient: call.fromClient,
        countAs: (s) => {
          call.countAs = s;
        },
      },
      parsed,
      prompts,
      model,
      who.tenant,
      call.t0,
    );
  }

  private async catalogQuery(call: Call, who: Principal): Promise<void> {
    let outcome: CatalogOutcome = "engine_error";
    try {
      if (!this.opts.catalog)
        throw new ApiError(503, "no catalog is attached to this server", "server_error");
      const body = await readJsonBody(call.req, this.limits.maxBodyBytes);
      const answer = await runCatalogQuery(this.opts.catalog, body, who);
      outcome = "ok";
      const text = `{"result":${answer.json}}`;
      call.res.writeHead(200, {
        "content-type": "application/json",
        "content-length": Buffer.byteLength(text),
      });
      call.res.end(text);
    } catch (err) {
      outcome = catalogQueryOutcome(err);
      throw err;
    } finally {
      this.catalogQueries.inc({ outcome });
    }
  }

  private json(call: Call, status: number, body: unknown): void {
    const text = JSON.stringify(body);
    call.res.writeHead(status, {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(text),
    });
    call.res.end(text);
  }

  private fail(call: Call, err: unknown): void {
    const { req, res } = call;
    const apiErr =
      err instanceof ApiError
        ? err
        : new ApiError(500, `internal error: ${(err as Error)?.message ?? String(err)}`, "server_error");
    if (apiErr.status >= 500)
      this.log(
        "request.error",
        { route: call.label, xRequestId: call.xRequestId, status: apiErr.status, message: apiErr.message },
        "warn",
      );
    if (res.headersSent) {
      if (!res.writableEnded) {
        res.write(`data: ${JSON.stringify(apiErr.body())}\n\n`);
        res.end();
      }
      call.countAs = statusLabel(apiErr.status);
      return;
    }
    if (res.destroyed) return;
    if (apiErr.retryAfterS !== null) res.setHeader("retry-after", String(apiErr.retryAfterS));
    // A body left unread cannot be skipped safely: answer, then close the connection.
    if (!req.complete) res.setHeader("connection", "close");
    this.json(call, apiErr.status, apiErr.body());
  }
}

/** A request path for a message: the path only (no query string), cut to 128 characters. */
function describePath(url: string): string {
  const q = url.indexOf("?");
  const path = q < 0 ? url : url.slice(0, q);
  return path.length > 128 ? `${path.slice(0, 128)}…` : path;
}
