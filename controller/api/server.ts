import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import pkg from "../../package.json" with { type: "json" };
import { RequestId, TenantId } from "../../schema/ids.ts";
import { Counter, Gauge, Histogram, LATENCY_BUCKETS_S, Registry } from "../metrics.ts";
import { type ChoiceDelta, ChoiceRun, endTokenIds } from "./choice.ts";
import { ApiError, badRequest } from "./errors.ts";
import {
  type ChatRequest,
  type CompletionRequest,
  checkContext,
  parseChatRequest,
  parseCompletionRequest,
} from "./request.ts";
import { promptScoring } from "./request-logprobs.ts";
import { checkTokenIds } from "./request-sampling.ts";
import { ResponseShape, shownChoices, usageJson } from "./responses.ts";
import type { GenerationRequest, InferenceService, ModelInfo } from "./service.ts";
import { detokenize, modelCard, pickModel, tokenize } from "./tokenize.ts";
import { toolConstraint } from "./tools.ts";

/** What GET /version answers: the package's version. */
export const SERVER_VERSION: string = pkg.version;

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

/**
 * The OpenAI-compatible HTTP front door. It authenticates, validates,
 * tokenizes and checks the context before anything is admitted; then it
 * streams each choice's tokens through incremental detokenization and stop
 * sequences. A client that disconnects cancels its choices.
 */
export class ApiServer {
  private server: Server | undefined;
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
      new Gauge("continuum_pages_total", "KV pages in the pool.", () => [[{}, g().pagesTotal]]),
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
    if (route === "GET /health") return this.json(res, 200, { status: "ok" }, route);
    if (route === "GET /metrics") {
      res.writeHead(200, { "content-type": "text/plain; version=0.0.4" });
      res.end(this.metrics.render());
      this.requests.inc({ route, status: "200" });
      return;
    }
    if (route === "GET /workers" && this.service.workers)
      return this.json(res, 200, { workers: this.service.workers() }, route);
    if (route === "GET /version") return this.json(res, 200, { version: SERVER_VERSION }, route);
    const tenant = this.authenticate(req);
    if (req.method === "GET" && url.pathname.startsWith("/v1/models/")) {
      const id = decodeURIComponent(url.pathname.slice("/v1/models/".length));
      return this.json(res, 200, modelCard(pickModel(this.service.models(), id)), "GET /v1/models/{id}");
    }
    switch (route) {
      case "GET /v1/models":
        return this.json(res, 200, { object: "list", data: this.service.models().map(modelCard) }, route);
      case "POST /tokenize":
        return this.json(res, 200, tokenize(this.service.models(), await this.body(req)), route);
      case "POST /detokenize":
        return this.json(res, 200, detokenize(this.service.models(), await this.body(req)), route);
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
  private admit(
    parsed: CompletionRequest | ChatRequest,
    tenant: TenantId,
    requestId: string,
  ): { runs: ChoiceRun[]; shape: ResponseShape } {
    const model = this.model(parsed.model);
    const codec = model.codec;
    const rendered = parsed.kind === "chat" ? codec.renderChat(parsed.chat.prompt) : null;
    const prompts =
      parsed.kind === "chat"
        ? [codec.encode(rendered!, { addSpecialTokens: parsed.chat.addSpecialTokens })]
        : parsed.prompts.map((p) =>
            p.kind === "text" ? codec.encode(p.text, { addSpecialTokens: parsed.addSpecialTokens }) : p.ids,
          );
    const plans = prompts.map((whole, i) => {
      const ids = truncated(whole, parsed.truncate, model.maxContext, parsed.maxTokens);
      const bad = ids.find((t) => t >= codec.vocabSize);
      if (bad !== undefined)
        throw badRequest(
          `prompt ${i} has token id ${bad}, outside the vocabulary of ${codec.vocabSize}`,
          "prompt",
        );
      // max_tokens 0 (echo): one token is generated and dropped, as vLLM does.
      const budget = checkContext(
        ids.length,
        parsed.maxTokens === 0 ? 1 : parsed.maxTokens,
        model.maxContext,
      );
      return { ids, maxTokens: budget };
    });
    checkTokenIds(parsed.sampling, parsed.stop, codec.vocabSize);
    const tools = parsed.kind === "chat" ? parsed.tools : null;
    if (tools?.choice === "auto" && codec.toolParser === null)
      throw badRequest(
        "tool_choice 'auto' needs a tool-call parser for this model: set model.toolCallParser",
        "tool_choice",
      );
    const constraint = parsed.constraint ?? (tools ? toolConstraint(tools) : null);
    if (constraint !== null) {
      let least: number;
      try {
        least = codec.checkConstraint(constraint);
      } catch (err) {
        // A tool's parameters the grammar cannot enforce: name the tools, not response_format.
        if (err instanceof ApiError && parsed.constraint === null) throw badRequest(err.message, "tools");
        throw err;
      }
      const short = plans.find((p) => p.maxTokens < least);
      if (short)
        throw badRequest(
          `max_tokens (${short.maxTokens}) is below the ${least} tokens the requested format's shortest output may need`,
          "max_tokens",
        );
    }
    const lp = parsed.lp;
    // best_of ranks choices by their tokens' log-probabilities.
    const logprobs = lp.logprobs ?? (parsed.bestOf > parsed.n ? 0 : null);
    const promptLogprobs = promptScoring(lp, parsed.kind);
    const stopTokenIds = endTokenIds(parsed.stop, codec.eosTokenIds);
    const perPrompt = parsed.bestOf;
    const runs: ChoiceRun[] = [];
    try {
      plans.forEach((plan, p) => {
        for (let j = 0; j < perPrompt; j++) {
          const index = p * perPrompt + j;
          const seed = parsed.sampling.seed === undefined ? undefined : parsed.sampling.seed + index;
          const greq: GenerationRequest = {
            requestId: RequestId(
              runs.length === 0 && plans.length * perPrompt === 1 ? requestId : `${requestId}.${index}`,
            ),
            tenant,
            model: model.id,
            prompt: plan.ids,
            maxTokens: plan.maxTokens,
            sampling: { ...parsed.sampling, seed },
            stopTokenIds,
            cacheSalt: parsed.cacheSalt,
            priority: -parsed.priority,
            logprobs,
            promptLogprobs,
            constraint,
          };
          runs.push(
            new ChoiceRun(index, plan.ids, this.service.generate(greq), codec, {
              stop: parsed.stop,
              eosTokenIds: codec.eosTokenIds,
              // Mistral's [TOOL_CALLS] is a special token the parser must see (vLLM does the same).
              skipSpecialTokens:
                parsed.skipSpecialTokens && !(tools?.choice === "auto" && codec.toolParser === "mistral"),
              minTokens: parsed.sampling.minTokens,
              discardGenerated: parsed.maxTokens === 0,
            }),
          );
        }
      });
    } catch (err) {
      for (const r of runs) r.gen.cancel();
      throw err;
    }
    const echoText = (r: ChoiceRun): string => {
      if (parsed.kind === "chat") {
        const last = parsed.messages[parsed.messages.length - 1];
        return last?.role === "assistant" ? (last.content ?? "") : "";
      }
      const p = parsed.prompts[Math.floor(r.index / perPrompt)]!;
      return p.kind === "text"
        ? p.text
        : codec.decode(p.ids, { skipSpecialTokens: parsed.skipSpecialTokens });
    };
    const promptText = parsed.kind === "chat" && parsed.chat.returnPromptText ? rendered : null;
    return { runs, shape: new ResponseShape(parsed, codec, echoText, promptText, codec.toolParser) };
  }

  private async complete(
    res: ServerResponse,
    parsed: CompletionRequest | ChatRequest,
    tenant: TenantId,
    route: string,
  ): Promise<void> {
    const t0 = performance.now();
    const requestId = `${parsed.kind === "chat" ? "chatcmpl" : "cmpl"}-${parsed.requestId ?? randomUUID()}`;
    const { runs, shape } = this.admit(parsed, tenant, requestId);
    for (const r of runs) this.promptTokens.inc({}, r.promptTokens);
    this.log({
      event: "request.admitted",
      requestId,
      tenant,
      model: parsed.model,
      choices: runs.length,
      stream: parsed.stream,
      ...(parsed.user === undefined ? {} : { user: parsed.user }),
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
    const usage = () => usageJson(runs, parsed.bestOf);

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
      const shown = shownChoices(runs, parsed.bestOf, parsed.n);
      this.json(
        res,
        200,
        {
          id: requestId,
          object,
          created,
          model: parsed.model,
          choices: shown.map((r, i) => shape.choice(r, i)),
          usage: usage(),
          ...(parsed.kind === "chat" ? shape.chatExtras(runs[0]!) : {}),
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
      send({
        id: requestId,
        object: chunkObject,
        created,
        model: parsed.model,
        choices,
        ...(parsed.continuousUsage ? { usage: usage() } : {}),
        ...extra,
      });
    const opened = new Set<ChoiceRun>();
    const open = (r: ChoiceRun) => {
      if (opened.has(r)) return;
      opened.add(r);
      const first = shape.opening(r);
      if (first) frame([first]);
    };
    // Chat opens with the role at once (and prompt_text); an echo opens when the prompt's scores arrive.
    if (parsed.kind === "chat") {
      for (const [i, r] of runs.entries()) {
        opened.add(r);
        frame([shape.opening(r)], i === 0 ? shape.streamExtras() : {});
      }
    }
    await Promise.all(
      runs.map((r) =>
        this.drive(r, onToken, (d) => {
          open(r);
          frame([shape.chunk(r, d)]);
        }),
      ),
    );
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

  /** Runs one choice to its end, emitting its deltas (the last one carries the finish reason). */
  private async drive(r: ChoiceRun, onToken: () => void, emit: (c: ChoiceDelta) => void): Promise<void> {
    let last = performance.now();
    for await (const ev of r.gen.events) {
      if (ev.type === "token") {
        onToken();
        const now = performance.now();
        if (r.completionTokens > 0) this.itl.observe((now - last) / 1000);
        last = now;
        this.tokensOut.inc();
        const d = r.onToken(ev.token, ev.logprob, ev.promptLogprobs);
        if (d && (d.text || d.logprobs.length > 0 || d.tokens.length > 0)) emit(d);
      } else if (ev.type === "end") {
        emit(r.onEnd(ev.reason, ev.cachedTokens));
        return;
      } else {
        this.log({ event: "choice.error", index: r.index, message: ev.message });
        r.onError(ev.message);
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

/**
 * vLLM's truncate_prompt_tokens: keep the last (side "left") or first
 * ("right") n tokens; -1 keeps what fits beside max_tokens in the context.
 */
function truncated(
  ids: number[],
  t: { readonly tokens: number | null; readonly side: "left" | "right" },
  maxContext: number,
  maxTokens: number | undefined,
): number[] {
  if (t.tokens === null) return ids;
  const n = t.tokens === -1 ? maxContext - Math.max(1, maxTokens ?? 1) : t.tokens;
  if (ids.length <= n) return ids;
  return t.side === "left" ? ids.slice(ids.length - n) : ids.slice(0, n);
}
