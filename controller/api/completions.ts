import { randomBytes } from "node:crypto";
import type { ServerResponse } from "node:http";
import { RequestId, type TenantId } from "../../schema/ids.ts";
import type { Counter, Histogram } from "../metrics.ts";
import { ApiError, badRequest } from "./errors.ts";
import { type ChatRequest, type CompletionRequest, checkContext } from "./request.ts";
import type { FinishReason, Generation, GenerationRequest, InferenceService, ModelInfo } from "./service.ts";
import { IncrementalDetokenizer, StopMatcher } from "./text-stream.ts";

/**
 * One completion or chat request after it is parsed and tokenized: admit
 * every choice (all or none), then stream each choice's tokens through
 * incremental detokenization and stop sequences, as one JSON answer or as
 * server-sent events.
 *
 * Outcomes, each logged once with the request id and the client's
 * X-Request-Id: `request.done`; `request.failed` (a choice failed: a 500, or
 * an error event mid-stream); `request.cancelled` (the client went away, or
 * let more than `maxUnsentBytes` of a stream pile up unread (a stalled reader must not hold memory) — then its
 * connection is closed): its choices are cancelled at once and /metrics
 * counts it under status 499.
 */

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

export interface CompletionContext {
  readonly res: ServerResponse;
  /** The client's X-Request-Id (or the generated one) and whether the client chose it. */
  readonly xRequestId: string;
  readonly fromClient: boolean;
  /** Sets the status /metrics counts this request under, when the HTTP status alone does not say it. */
  countAs(status: "499" | "500"): void;
}

export interface CompletionMetrics {
  readonly ttft: Histogram;
  readonly itl: Histogram;
  readonly tokensOut: Counter;
  readonly promptTokens: Counter;
}

/** The id a request runs under: its kind and the X-Request-Id, made unique when the client chose it. */
export function internalRequestId(
  kind: "chat" | "completion",
  xRequestId: string,
  fromClient: boolean,
): string {
  const prefix = kind === "chat" ? "chatcmpl" : "cmpl";
  return fromClient ? `${prefix}-${xRequestId}-${randomBytes(4).toString("hex")}` : `${prefix}-${xRequestId}`;
}

export class Completions {
  constructor(
    private readonly service: InferenceService,
    private readonly metrics: CompletionMetrics,
    private readonly log: (level: "info" | "warn", event: string, fields: Record<string, unknown>) => void,
    private readonly maxUnsentBytes: number,
  ) {}

  /** Checks every prompt's tokens, then admits every choice; on any failure nothing stays admitted. */
  private admit(
    parsed: CompletionRequest | ChatRequest,
    prompts: readonly number[][],
    model: ModelInfo,
    tenant: TenantId,
    requestId: string,
  ): ChoiceRun[] {
    const codec = model.codec;
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

  async run(
    ctx: CompletionContext,
    parsed: CompletionRequest | ChatRequest,
    prompts: readonly number[][],
    model: ModelInfo,
    tenant: TenantId,
    t0: number,
  ): Promise<void> {
    const { res } = ctx;
    const requestId = internalRequestId(parsed.kind, ctx.xRequestId, ctx.fromClient);
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
    const runs = this.admit(parsed, prompts, model, tenant, requestId);
    for (const r of runs) this.metrics.promptTokens.inc({}, r.promptTokens);
    this.log("info", "request.admitted", {
      ...ids,
      tenant,
      model: parsed.model,
      choices: runs.length,
      stream: parsed.stream,
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
      const prompt = runs.reduce((a, r, i) => a + (i % parsed.n === 0 ? r.promptTokens : 0), 0);
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
        throw new ApiError(500, `generation failed: ${failed.error ?? "no result"}`, "server_error");
      }
      const text = JSON.stringify({
        id: requestId,
        object,
        created,
        model: parsed.model,
        choices: runs.map((r) => choiceJson({ index: r.index, text: r.text, finish: r.finish }, false)),
        usage: usage(),
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
      send({ id: requestId, object: chunkObject, created, model: parsed.model, choices, ...extra });
    if (parsed.kind === "chat") {
      for (const r of runs)
        frame([
          { index: r.index, delta: { role: "assistant", content: "" }, finish_reason: null, logprobs: null },
        ]);
    }
    await Promise.all(runs.map((r) => this.drive(r, onToken, (c) => frame([choiceJson(c, true)]))));
    if (closed) return cancelled();
    const failed = runs.find((r) => r.finish === null);
    if (failed) {
      // A choice failed mid-stream: say so in OpenAI's stream error shape (the
      // client raises it) instead of ending as if the text were complete.
      const err = new ApiError(500, `generation failed: ${failed.error ?? "no result"}`, "server_error");
      res.end(`data: ${JSON.stringify(err.body())}\n\n`);
      ctx.countAs("500");
      this.log("warn", "request.failed", { ...ids, message: err.message });
      return;
    }
    if (parsed.includeUsageInStream) frame([], { usage: usage() });
    res.end("data: [DONE]\n\n");
    this.log("info", "request.done", { ...ids, ms: Math.round(performance.now() - t0) });
  }

  /** Runs one choice to its end, emitting text chunks (and a last chunk with the finish reason). */
  private async drive(r: ChoiceRun, onToken: () => void, emit: (c: ChoiceChunk) => void): Promise<void> {
    let last = performance.now();
    for await (const ev of r.gen.events) {
      if (ev.type === "token") {
        onToken();
        const now = performance.now();
        if (r.completionTokens > 0) this.metrics.itl.observe((now - last) / 1000);
        last = now;
        r.completionTokens += 1;
        this.metrics.tokensOut.inc();
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
        this.log("info", "choice.error", { index: r.index, message: ev.message });
        r.finish = null;
        r.error = ev.message;
        return;
      }
    }
  }
}
