import { randomBytes } from "node:crypto";
import type { ServerResponse } from "node:http";
import { maxScoredPromptTokens } from "../../schema/control.ts";
import { RequestId, type TenantId } from "../../schema/ids.ts";
import type { Counter, Histogram } from "../metrics.ts";
import { type ChoiceDelta, ChoiceRun, endTokenIds } from "./choice.ts";
import { ApiError, badRequest, unavailable } from "./errors.ts";
import type { Prompts } from "./prompts.ts";
import { type ChatRequest, type CompletionRequest, checkContext } from "./request.ts";
import { promptScoring } from "./request-logprobs.ts";
import { checkTokenIds } from "./request-sampling.ts";
import { ResponseShape, shownChoices, usageJson } from "./responses.ts";
import { type StatusLabel, statusLabel } from "./routes.ts";
import type { GenerationRequest, InferenceService, ModelInfo } from "./service.ts";
import { toolConstraint } from "./tools.ts";

/**
 * One completion or chat request after it is parsed and tokenized: check
 * its prompts, sampling ids and output constraint, admit every choice (all
 * or none), then drive each choice (choice.ts: detokenization, stop rules,
 * log-probabilities) and shape the answer (responses.ts) as one JSON body
 * or as server-sent events.
 *
 * Outcomes, each logged once with the request id and the client's
 * X-Request-Id: `request.done`; `request.failed` (a choice failed: a 500, or
 * an error event mid-stream); `request.cancelled` (the client went away, or
 * let more than `maxUnsentBytes` of a stream pile up unread (a stalled reader must not hold memory) — then its
 * connection is closed): its choices are cancelled at once and /metrics
 * counts it under status 499.
 */

export interface CompletionContext {
  readonly res: ServerResponse;
  /** The client's X-Request-Id (or the generated one) and whether the client chose it. */
  readonly xRequestId: string;
  readonly fromClient: boolean;
  /** Sets the status /metrics counts this request under, when the HTTP status alone does not say it. */
  countAs(status: StatusLabel): void;
}

export interface CompletionMetrics {
  readonly ttft: Histogram;
  readonly itl: Histogram;
  readonly tokensOut: Counter;
  readonly promptTokens: Counter;
}

/**
 * The id a request runs under: its kind and vLLM's `request_id` when the
 * body names one, else the X-Request-Id, made unique when the client chose it.
 */
export function internalRequestId(
  kind: "chat" | "completion",
  xRequestId: string,
  fromClient: boolean,
  bodyRequestId: string | null = null,
): string {
  const prefix = kind === "chat" ? "chatcmpl" : "cmpl";
  if (bodyRequestId !== null) return `${prefix}-${bodyRequestId}`;
  return fromClient ? `${prefix}-${xRequestId}-${randomBytes(4).toString("hex")}` : `${prefix}-${xRequestId}`;
}

export class Completions {
  constructor(
    private readonly service: InferenceService,
    private readonly metrics: CompletionMetrics,
    private readonly log: (level: "info" | "warn", event: string, fields: Record<string, unknown>) => void,
    private readonly maxUnsentBytes: number,
  ) {}

  /** Checks every prompt, the sampling ids and the constraint, then admits every choice; on any failure nothing stays admitted. */
  private admit(
    parsed: CompletionRequest | ChatRequest,
    prompts: Prompts,
    model: ModelInfo,
    tenant: TenantId,
    requestId: string,
  ): { runs: ChoiceRun[]; shape: ResponseShape } {
    const codec = model.codec;
    const plans = prompts.ids.map((whole, i) => {
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
    if (promptLogprobs !== null) {
      // The scores travel in one fleet message (schema/control.ts): bounded here, in every mode alike.
      const most = maxScoredPromptTokens(promptLogprobs) + 1;
      const long = plans.find((p) => p.ids.length > most);
      if (long)
        throw badRequest(
          `scoring a ${long.ids.length}-token prompt with ${promptLogprobs} alternatives per position is more than ` +
            `one response carries: at most ${most} prompt tokens at ${promptLogprobs} alternatives`,
          lp.promptLogprobs !== null ? "prompt_logprobs" : "echo",
        );
    }
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
    const promptText = parsed.kind === "chat" && parsed.chat.returnPromptText ? prompts.rendered : null;
    return { runs, shape: new ResponseShape(parsed, codec, echoText, promptText, codec.toolParser) };
  }

  async run(
    ctx: CompletionContext,
    parsed: CompletionRequest | ChatRequest,
    prompts: Prompts,
    model: ModelInfo,
    tenant: TenantId,
    t0: number,
  ): Promise<void> {
    const { res } = ctx;
    const requestId = internalRequestId(parsed.kind, ctx.xRequestId, ctx.fromClient, parsed.requestId);
    const ids = { requestId, xRequestId: ctx.xRequestId };
    if (res.destroyed) {
      // The client left while its prompt was being tokenized: nothing was admitted.
      this.log("info", "request.cancelled", {
        ...ids,
        ms: Math.round(performance.now() - t0),
        admitted: false,
      });
      return;
    }
    const { runs, shape } = this.admit(parsed, prompts, model, tenant, requestId);
    for (const r of runs) this.metrics.promptTokens.inc({}, r.promptTokens);
    this.log("info", "request.admitted", {
      ...ids,
      tenant,
      model: parsed.model,
      choices: runs.length,
      stream: parsed.stream,
      ...(parsed.user === undefined ? {} : { user: parsed.user }),
    });
    let closed = false;
    let cutOff = false;
    res.on("close", () => {
      if (!res.writableFinished) {
        closed = true;
        for (const r of runs) r.gen.cancel();
      }
    });
    const cancelled = () => {
      ctx.countAs("499");
      this.log("info", "request.cancelled", {
        ...ids,
        ms: Math.round(performance.now() - t0),
        completionTokens: runs.reduce((a, r) => a + r.completionTokens, 0),
        reason: cutOff ? "client_too_slow" : "client_closed",
        stream: parsed.stream,
      });
    };
    const created = Math.floor(Date.now() / 1000);
    const object = parsed.kind === "chat" ? "chat.completion" : "text_completion";
    const chunkObject = parsed.kind === "chat" ? "chat.completion.chunk" : "text_completion";
    const usage = () => usageJson(runs, parsed.bestOf);

    let firstToken = true;
    const onToken = () => {
      if (firstToken) {
        firstToken = false;
        const ttft = (performance.now() - t0) / 1000;
        this.metrics.ttft.observe(ttft);
        this.log("info", "request.first_token", { ...ids, ttftMs: Math.round(ttft * 1000) });
      }
    };

    if (!parsed.stream) {
      await Promise.all(runs.map((r) => this.drive(r, onToken, () => {})));
      if (closed) return cancelled();
      const failed = runs.find((r) => r.finish === null);
      if (failed) {
        this.log("warn", "request.failed", { ...ids, message: failed.error ?? "no result" });
        throw generationFailed(failed);
      }
      const shown = shownChoices(runs, parsed.bestOf, parsed.n);
      const text = JSON.stringify({
        id: requestId,
        object,
        created,
        model: parsed.model,
        choices: shown.map((r, i) => shape.choice(r, i)),
        usage: usage(),
        ...(parsed.kind === "chat" ? shape.chatExtras(runs[0]!) : {}),
      });
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
      res.end(text);
      this.log("info", "request.done", { ...ids, ms: Math.round(performance.now() - t0) });
      return;
    }

    res.writeHead(200, {
      "content-type": "text/event-stream",
      "cache-control": "no-cache",
      connection: "keep-alive",
    });
    const send = (payload: unknown) => {
      if (closed) return;
      res.write(`data: ${JSON.stringify(payload)}\n\n`);
      if (res.writableLength > this.maxUnsentBytes) {
        cutOff = true;
        res.destroy();
      }
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
    if (closed) return cancelled();
    const failed = runs.find((r) => r.finish === null);
    if (failed) {
      // A choice failed mid-stream: say so in OpenAI's stream error shape (the
      // client raises it) instead of ending as if the text were complete.
      const err = generationFailed(failed);
      res.end(`data: ${JSON.stringify(err.body())}\n\n`);
      ctx.countAs(statusLabel(err.status));
      this.log("warn", "request.failed", { ...ids, message: err.message });
      return;
    }
    if (parsed.includeUsageInStream) frame([], { usage: usage() });
    res.end("data: [DONE]\n\n");
    this.log("info", "request.done", { ...ids, ms: Math.round(performance.now() - t0) });
  }

  /** Runs one choice to its end, emitting its deltas (the last one carries the finish reason). */
  private async drive(r: ChoiceRun, onToken: () => void, emit: (c: ChoiceDelta) => void): Promise<void> {
    let last = performance.now();
    for await (const ev of r.gen.events) {
      if (ev.type === "token") {
        onToken();
        const now = performance.now();
        if (r.completionTokens > 0) this.metrics.itl.observe((now - last) / 1000);
        last = now;
        this.metrics.tokensOut.inc();
        const d = r.onToken(ev.token, ev.logprob, ev.promptLogprobs);
        if (d && (d.text || d.logprobs.length > 0 || d.tokens.length > 0)) emit(d);
      } else if (ev.type === "end") {
        emit(r.onEnd(ev.reason, ev.cachedTokens));
        return;
      } else {
        this.log("info", "choice.error", { index: r.index, message: ev.message });
        r.onError(ev.message, ev.failure ?? null);
        return;
      }
    }
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

/**
 * The error a failed choice answers: a fleet that lost or found no worker is
 * unavailable (503, retry), a request out of time 504, anything else internal.
 */
function generationFailed(c: ChoiceRun): ApiError {
  const message = `generation failed: ${c.error ?? "no result"}`;
  if (c.failure === "unavailable") return unavailable(message);
  if (c.failure === "deadline") return new ApiError(504, message, "server_error", null, "deadline_exceeded");
  return new ApiError(500, message, "server_error");
}
