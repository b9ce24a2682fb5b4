import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { RequestId, TenantId } from "../../schema/ids.ts";
import { Counter, Gauge, Histogram, LATENCY_BUCKETS_S, Registry } from "../metrics.ts";
import { ApiError, badRequest } from "./errors.ts";
import {
  type ChatRequest,
  type CompletionRequest,
  checkContext,
  parseChatRequest,
  parseCompletionRequest,
} from "./request.ts";
import type { FinishReason, Generation, GenerationRequest, InferenceService, ModelInfo } from "./service.ts";
import { IncrementalDetokenizer, StopMatcher } from "./text-stream.ts";

/** Largest request body accepted (bytes); larger is answered 413 before parsing. */
export const MAX_BODY_BYTES = 8 * 1024 * 1024;

export interface ApiServerOptions {
  readonly host: string;
  readonly port: number;
  /** Bearer token → tenant. Empty: no authentication, every request is tenant "default". */
  readonly tokens: Readonly<Record<string, string>>;
  /** Structured log sink: one object per event. */
  readonly log?: (event: Record<string, unknown>) => void;
}

/** A handler of every path under `prefix`; what it throws is answered like the API's own errors. */
export interface ApiMount {
  readonly prefix: string;
  handle(req: IncomingMessage, res: ServerResponse, url: URL, authenticate: () => TenantId): Promise<void>;
}

/** One choice being generated: its prompt index, its generation and its text pipeline. */
interface ChoiceRun {
  readonly index: number;
  readonly promptTokens: number;
  readonly gen: Generation;
  readonly detok: IncrementalDetokenizer;
  readonly stop: StopMatcher;
  completionTokens: number;
  cachedTokens: number;
  text: string;
  finish: FinishReason | null;
  /** Why the choice failed, when it ended with an error instead of a finish reason. */
  error: string | null;
}

type ChoiceChunk = { index: number; text: string; finish: FinishReason | null };

/**
 * The OpenAI-compatible HTTP front door. It authenticates, validates,
 * tokenizes and checks the context before anything is admitted; then it
 * streams each choice's tokens through incremental detokenization and stop
 * sequences. A client that disconnects cancels its choices.
 */
export class ApiServer {
  private server: Server | undefined;
  private readonly mounts: ApiMount[] = [];
  readonly metrics = new Registry();
  private readonly requests = this.metrics.add(
    new Counter("continuum_http_requests_total", "HTTP requests by route and status."),
  );
  private readonly ttft = this.metrics.add(
    new Histogram(
      "continuum_ttft_seconds",
      "Time from request arrival to its first token.",
      LATENCY_BUCKETS_S,
    ),
  );
  private readonly itl = this.metrics.add(
    new Histogram(
      "continuum_inter_token_seconds",
      "Time between consecutive tokens of one choice.",
      LATENCY_BUCKETS_S,
    ),
  );
  private readonly tokensOut = this.metrics.add(
    new Counter("continuum_generated_tokens_total", "Tokens generated."),
  );
  private readonly promptTokens = this.metrics.add(
    new Counter("continuum_prompt_tokens_total", "Prompt tokens admitted."),
  );

  constructor(
    private readonly service: InferenceService,
    private readonly opts: ApiServerOptions,
  ) {
    const g = () => service.gauges();
    this.metrics.add(new Gauge("continuum_pages_free", "Free KV pages.", () => [[{}, g().pagesFree]]));
    this.metrics.add(
      new Gauge("continuum_pages_capacity", "KV pages in the pool.", () => [[{}, g().pagesTotal]]),
    );
    this.metrics.add(
      new Gauge("continuum_queue_depth", "Requests waiting or running.", () => [[{}, g().queueDepth]]),
    );
    this.metrics.add(
      new Gauge("continuum_catalog_lag", "Catalog transactions not yet applied here.", () => [
        [{}, g().catalogLag],
      ]),
    );
    this.metrics.add(
      new Gauge(
        "continuum_cache_tokens",
        "Prompt tokens served by source (resident, ram, ssd, peer, s3, recompute).",
        () => Object.entries(g().cacheTokensBySource).map(([source, v]) => [{ source }, v] as const),
      ),
    );
  }

  /** Serves every path under `m.prefix` with `m` (the web view's /ui), before the API's own routes. */
  mount(m: ApiMount): void {
    this.mounts.push(m);
  }

  async start(): Promise<number> {
    const server = createServer((req, res) => {
      this.handle(req, res).catch((err) => this.fail(res, err, req.url ?? ""));
    });
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
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  private log(event: Record<string, unknown>): void {
    this.opts.log?.(event);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://x");
    const route = `${req.method} ${url.pathname}`;
    const mount = this.mounts.find(
      (m) => url.pathname === m.prefix || url.pathname.startsWith(`${m.prefix}/`),
    );
    if (mount) return mount.handle(req, res, url, () => this.authenticate(req));
    if (route === "GET /health") return this.json(res, 200, { status: "ok" }, route);
    if (route === "GET /metrics") {
      res.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
      res.end(this.metrics.render());
      this.requests.inc({ route, status: "200" });
      return;
    }
    if (route === "GET /workers" && this.service.workers)
      return this.json(res, 200, { workers: this.service.workers() }, route);
    const tenant = this.authenticate(req);
    switch (route) {
      case "GET /v1/models":
        return this.json(
          res,
          200,
          {
            object: "list",
            data: this.service.models().map((m) => ({
              id: m.id,
              object: "model",
              created: m.created,
              owned_by: "continuum",
              max_model_len: m.maxContext,
            })),
          },
          route,
        );
      case "POST /v1/completions":
        return this.complete(res, parseCompletionRequest(await this.body(req)), tenant, route);
      case "POST /v1/chat/completions":
        return this.complete(res, parseChatRequest(await this.body(req)), tenant, route);
      case "POST /v1/catalog/query":
        return this.catalogQuery(req, res, route);
      default:
        throw new ApiError(404, `no route ${route}`, "invalid_request_error", null, "not_found");
    }
  }

  private authenticate(req: IncomingMessage): TenantId {
    const tokens = this.opts.tokens;
    if (Object.keys(tokens).length === 0) return TenantId("default");
    const header = req.headers.authorization ?? "";
    const m = /^Bearer\s+(.+)$/i.exec(header);
    const tenant = m ? tokens[m[1]!.trim()] : undefined;
    if (tenant === undefined)
      throw new ApiError(
        401,
        "missing or invalid bearer token",
        "authentication_error",
        null,
        "invalid_api_key",
      );
    return TenantId(tenant);
  }

  private async body(req: IncomingMessage): Promise<unknown> {
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of req) {
      size += (chunk as Buffer).length;
      if (size > MAX_BODY_BYTES) throw new ApiError(413, `request body over ${MAX_BODY_BYTES} bytes`);
      chunks.push(chunk as Buffer);
    }
    const text = Buffer.concat(chunks).toString("utf8");
    try {
      return JSON.parse(text);
    } catch (err) {
      throw badRequest(`malformed JSON: ${(err as Error).message}`);
    }
  }

  private model(name: string): ModelInfo {
    const m = this.service.models().find((x) => x.id === name);
    if (!m)
      throw new ApiError(
        404,
        `the model '${name}' does not exist`,
        "invalid_request_error",
        "model",
        "model_not_found",
      );
    return m;
  }

  /** Tokenizes and checks every prompt, then admits every choice; on any failure nothing stays admitted. */
  private admit(parsed: CompletionRequest | ChatRequest, tenant: TenantId, requestId: string): ChoiceRun[] {
    const model = this.model(parsed.model);
    const codec = model.codec;
    const prompts =
      parsed.kind === "chat"
        ? [codec.chatPrompt(parsed.messages)]
        : parsed.prompts.map((p) => (p.kind === "text" ? codec.encode(p.text) : p.ids));
    const plans = prompts.map((ids, i) => {
      const bad = ids.find((t) => t >= codec.vocabSize);
      if (bad !== undefined)
        throw badRequest(
          `prompt ${i} has token id ${bad}, outside the vocabulary of ${codec.vocabSize}`,
          "prompt",
        );
      return { ids, maxTokens: checkContext(ids.length, parsed.maxTokens, model.maxContext) };
    });
    const runs: ChoiceRun[] = [];
    try {
      plans.forEach((plan, p) => {
        for (let j = 0; j < parsed.n; j++) {
          const index = p * parsed.n + j;
          const seed = parsed.sampling.seed === undefined ? undefined : parsed.sampling.seed + index;
          const greq: GenerationRequest = {
            requestId: RequestId(
              runs.length === 0 && plans.length * parsed.n === 1 ? requestId : `${requestId}.${index}`,
            ),
            tenant,
            model: model.id,
            prompt: plan.ids,
            maxTokens: plan.maxTokens,
            sampling: { ...parsed.sampling, seed },
            stopTokenIds: codec.eosTokenIds,
          };
          runs.push({
            index,
            promptTokens: plan.ids.length,
            gen: this.service.generate(greq),
            detok: new IncrementalDetokenizer((ids) => codec.decode(ids)),
            stop: new StopMatcher(parsed.stop),
            completionTokens: 0,
            cachedTokens: 0,
            text: "",
            finish: null,
            error: null,
          });
        }
      });
    } catch (err) {
      for (const r of runs) r.gen.cancel();
      throw err;
    }
    return runs;
  }

  private async complete(
    res: ServerResponse,
    parsed: CompletionRequest | ChatRequest,
    tenant: TenantId,
    route: string,
  ): Promise<void> {
    const t0 = performance.now();
    const requestId = `${parsed.kind === "chat" ? "chatcmpl" : "cmpl"}-${randomUUID()}`;
    const runs = this.admit(parsed, tenant, requestId);
    for (const r of runs) this.promptTokens.inc({}, r.promptTokens);
    this.log({
      event: "request.admitted",
      requestId,
      tenant,
      model: parsed.model,
      choices: runs.length,
      stream: parsed.stream,
    });
    let closed = false;
    res.on("close", () => {
      if (!res.writableFinished) {
        closed = true;
        for (const r of runs) r.gen.cancel();
      }
    });
    const created = Math.floor(Date.now() / 1000);
    const object = parsed.kind === "chat" ? "chat.completion" : "text_completion";
    const chunkObject = parsed.kind === "chat" ? "chat.completion.chunk" : "text_completion";
    const choiceJson = (c: ChoiceChunk, stream: boolean) =>
      parsed.kind === "chat"
        ? stream
          ? {
              index: c.index,
              delta: c.text ? { content: c.text } : {},
              finish_reason: c.finish,
              logprobs: null,
            }
          : {
              index: c.index,
              message: { role: "assistant", content: c.text },
              finish_reason: c.finish,
              logprobs: null,
            }
        : { index: c.index, text: c.text, finish_reason: c.finish, logprobs: null };
    const usage = () => {
      const prompt = runs.reduce((a, r) => a + (runs.indexOf(r) % parsed.n === 0 ? r.promptTokens : 0), 0);
      const completion = runs.reduce((a, r) => a + r.completionTokens, 0);
      const cached = runs.reduce((a, r) => a + r.cachedTokens, 0);
      return {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        prompt_tokens_details: { cached_tokens: cached },
      };
    };

    let firstToken = true;
    const onToken = () => {
      if (firstToken) {
        firstToken = false;
        const ttft = (performance.now() - t0) / 1000;
        this.ttft.observe(ttft);
        this.log({ event: "request.first_token", requestId, ttftMs: Math.round(ttft * 1000) });
      }
    };

    if (!parsed.stream) {
      await Promise.all(runs.map((r) => this.drive(r, onToken, () => {})));
      if (closed) return;
      const failed = runs.find((r) => r.finish === null);
      if (failed)
        throw new ApiError(500, `generation failed: ${failed.error ?? "no result"}`, "server_error");
      this.json(
        res,
        200,
        {
          id: requestId,
          object,
          created,
          model: parsed.model,
          choices: runs.map((r) => choiceJson({ index: r.index, text: r.text, finish: r.finish }, false)),
          usage: usage(),
        },
        route,
      );
      this.log({ event: "request.done", requestId, ms: Math.round(performance.now() - t0) });
      return;
    }

    res.writeHead(200, {
      "content-type": "text/event-stream",
      "cache-control": "no-cache",
      connection: "keep-alive",
    });
    const send = (payload: unknown) => {
      if (!closed) res.write(`data: ${JSON.stringify(payload)}\n\n`);
    };
    const frame = (choices: unknown[], extra: Record<string, unknown> = {}) =>
      send({ id: requestId, object: chunkObject, created, model: parsed.model, choices, ...extra });
    if (parsed.kind === "chat") {
      for (const r of runs)
        frame([
          { index: r.index, delta: { role: "assistant", content: "" }, finish_reason: null, logprobs: null },
        ]);
    }
    await Promise.all(runs.map((r) => this.drive(r, onToken, (c) => frame([choiceJson(c, true)]))));
    const failed = runs.find((r) => r.finish === null);
    if (failed && !closed) {
      // A choice failed mid-stream: say so in OpenAI's stream error shape (the
      // client raises it) instead of ending as if the text were complete.
      const err = new ApiError(500, `generation failed: ${failed.error ?? "no result"}`, "server_error");
      res.end(`data: ${JSON.stringify(err.body())}\n\n`);
      this.requests.inc({ route, status: "500" });
      this.log({ event: "request.failed", requestId, message: err.message });
      return;
    }
    if (parsed.includeUsageInStream) frame([], { usage: usage() });
    if (!closed) res.end("data: [DONE]\n\n");
    this.requests.inc({ route, status: "200" });
    this.log({ event: "request.done", requestId, ms: Math.round(performance.now() - t0) });
  }

  /** Runs one choice to its end, emitting text chunks (and a last chunk with the finish reason). */
  private async drive(r: ChoiceRun, onToken: () => void, emit: (c: ChoiceChunk) => void): Promise<void> {
    let last = performance.now();
    for await (const ev of r.gen.events) {
      if (ev.type === "token") {
        onToken();
        const now = performance.now();
        if (r.completionTokens > 0) this.itl.observe((now - last) / 1000);
        last = now;
        r.completionTokens += 1;
        this.tokensOut.inc();
        if (r.stop.isStopped) continue;
        const out = r.stop.push(r.detok.push(ev.token));
        if (out.emit) {
          r.text += out.emit;
          emit({ index: r.index, text: out.emit, finish: null });
        }
        if (out.stopped) r.gen.cancel();
      } else if (ev.type === "end") {
        r.cachedTokens = ev.cachedTokens;
        const tail = r.stop.isStopped ? "" : r.stop.push(r.detok.flush()).emit + r.stop.flush();
        r.text += tail;
        r.finish = r.stop.isStopped ? "stop" : ev.reason;
        emit({ index: r.index, text: tail, finish: r.finish });
        return;
      } else {
        this.log({ event: "choice.error", index: r.index, message: ev.message });
        r.finish = null;
        r.error = ev.message;
        return;
      }
    }
  }

  private async catalogQuery(req: IncomingMessage, res: ServerResponse, route: string): Promise<void> {
    const q = this.service.catalogQuery;
    if (!q) throw new ApiError(503, "no catalog is attached to this server", "server_error");
    const body = await this.body(req);
    if (typeof body !== "object" || body === null) throw badRequest("body must be an object");
    const { query, args, rules } = body as Record<string, unknown>;
    if (typeof query !== "string" || query === "")
      throw badRequest("'query' must be a Datalog query string", "query");
    if (args !== undefined && !Array.isArray(args)) throw badRequest("'args' must be a list", "args");
    if (rules !== undefined && typeof rules !== "string")
      throw badRequest("'rules' must be a string", "rules");
    const result = await q.call(this.service, query, (args as unknown[]) ?? [], rules as string | undefined);
    this.json(res, 200, { result }, route);
  }

  private json(res: ServerResponse, status: number, body: unknown, route: string): void {
    const text = JSON.stringify(body);
    res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
    res.end(text);
    this.requests.inc({ route, status: String(status) });
  }

  private fail(res: ServerResponse, err: unknown, url: string): void {
    const apiErr =
      err instanceof ApiError
        ? err
        : new ApiError(500, `internal error: ${(err as Error)?.message ?? String(err)}`, "server_error");
    if (apiErr.status >= 500) this.log({ event: "request.error", url, message: apiErr.message });
    if (res.headersSent) {
      if (!res.writableEnded) {
        res.write(`data: ${JSON.stringify(apiErr.body())}\n\n`);
        res.end();
      }
      return;
    }
    this.json(res, apiErr.status, apiErr.body(), url);
  }
}
