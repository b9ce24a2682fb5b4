import type { ChoiceDelta, ChoiceRun } from "./choice.ts";
import {
  chatLogprobs,
  legacyLogprobs,
  promptLogprobsJson,
  type TokenBytes,
  type TokenText,
  tokenBytes,
  tokenText,
} from "./logprobs-format.ts";
import type { ChatRequest, CompletionRequest } from "./request.ts";
import type { TextCodec } from "./service.ts";
import type { ToolParserName } from "./tool-parsers.ts";
import { ToolStream, toolCallsJson, toolMessage } from "./tools.ts";

/**
 * The JSON of a completion or chat response, whole or as stream chunks, in
 * OpenAI's shapes with vLLM's additions (stop_reason, prompt_logprobs,
 * token_ids). Pure over the runs it is shown.
 */
export class ResponseShape {
  private readonly text: TokenText;
  private readonly bytes: TokenBytes;
  /** Characters of token text already streamed per run (the legacy text_offset). */
  private readonly offsets = new Map<ChoiceRun, number>();
  private readonly toolStreams = new Map<ChoiceRun, ToolStream>();
  /** Streamed runs whose finish_reason becomes tool_calls. */
  private readonly toolFinish = new Set<ChoiceRun>();

  constructor(
    private readonly parsed: CompletionRequest | ChatRequest,
    codec: TextCodec,
    /** The text echo prepends for a run (completions: its prompt; chat: the last assistant message). */
    private readonly echoText: (run: ChoiceRun) => string,
    /** return_prompt_text: the rendered chat prompt; null: not returned. */
    private readonly promptText: string | null = null,
    private readonly toolParser: ToolParserName | null = null,
  ) {
    this.text = tokenText(codec, parsed.lp.tokensAsIds);
    this.bytes = tokenBytes(codec, this.text, parsed.lp.tokensAsIds);
  }

  /** A non-streamed choice, shown at `index`. */
  choice(run: ChoiceRun, index: number): Record<string, unknown> {
    const lp = this.parsed.lp;
    const echo = lp.echo ? this.echoText(run) : "";
    const base = {
      index,
      finish_reason: run.finish,
      stop_reason: run.stopReason,
      ...(lp.returnTokenIds ? { token_ids: run.tokens } : {}),
    };
    if (this.parsed.kind === "chat") {
      const tools = this.parsed.tools;
      const m = tools === null ? null : toolMessage(tools, this.toolParser, run.text, run.finish === "stop");
      const message =
        m === null || m.calls.length === 0
          ? { role: "assistant", content: echo + run.text }
          : {
              role: "assistant",
              content: m.content === null && echo === "" ? null : echo + (m.content ?? ""),
              tool_calls: toolCallsJson(m.calls, false),
            };
      return {
        ...base,
        finish_reason: m?.toolCallsFinish ? "tool_calls" : run.finish,
        message,
        logprobs:
          lp.logprobs === null
            ? null
            : { content: chatLogprobs(run.logprobs, lp.logprobs, this.text, this.bytes) },
      };
    }
    return {
      ...base,
      text: echo + run.text,
      logprobs: this.legacy(run, lp.echo, run.tokens, run.logprobs, 0),
      ...this.promptExtras(run),
    };
  }

  /** vLLM's per-choice prompt fields (completions; chat puts them at the top level). */
  promptExtras(run: ChoiceRun): Record<string, unknown> {
    const lp = this.parsed.lp;
    return {
      ...(lp.promptLogprobs === null
        ? {}
        : {
            prompt_logprobs: promptLogprobsJson(
              run.prompt,
              run.promptLogprobs ?? [],
              lp.promptLogprobs,
              this.text,
            ),
          }),
      ...(lp.returnTokenIds ? { prompt_token_ids: run.prompt } : {}),
    };
  }

  /** vLLM's top-level chat fields: prompt_logprobs, prompt_token_ids, prompt_text. */
  chatExtras(run: ChoiceRun): Record<string, unknown> {
    return { ...this.promptExtras(run), ...this.streamExtras() };
  }

  /** What a chat stream's first chunk carries besides its choices. */
  streamExtras(): Record<string, unknown> {
    return this.promptText === null ? {} : { prompt_text: this.promptText };
  }

  /** The chunk that opens a streamed choice (chat: the role; echo: the prompt), or null. */
  opening(run: ChoiceRun): Record<string, unknown> | null {
    const lp = this.parsed.lp;
    if (this.parsed.kind === "chat") {
      const echo = lp.echo ? this.echoText(run) : "";
      return {
        index: run.index,
        delta: { role: "assistant", content: echo },
        finish_reason: null,
        logprobs: null,
      };
    }
    if (!lp.echo) return null;
    const text = this.echoText(run);
    const logprobs = this.legacy(run, true, [], [], 0);
    if (logprobs) this.offsets.set(run, logprobs.text_offset.length === 0 ? 0 : this.endOffset(logprobs));
    return { index: run.index, text, logprobs, finish_reason: null, stop_reason: null };
  }

  /** A streamed delta of one choice. */
  chunk(run: ChoiceRun, d: ChoiceDelta): Record<string, unknown> {
    const lp = this.parsed.lp;
    const ids = lp.returnTokenIds ? { token_ids: d.tokens } : {};
    if (this.parsed.kind === "chat") {
      return {
        index: d.index,
        delta: this.chatDelta(run, d),
        logprobs:
          lp.logprobs === null || d.logprobs.length === 0
            ? null
            : { content: chatLogprobs(d.logprobs, lp.logprobs, this.text, this.bytes) },
        finish_reason: d.finish !== null && this.toolFinish.has(run) ? "tool_calls" : d.finish,
        stop_reason: d.stopReason,
        ...ids,
      };
    }
    let logprobs = null;
    if (lp.logprobs !== null && d.tokens.length > 0) {
      const l = legacyLogprobs(d.tokens, d.logprobs, lp.logprobs, this.text, this.offsets.get(run) ?? 0);
      this.offsets.set(run, this.endOffset(l));
      logprobs = l;
    }
    return {
      index: d.index,
      text: d.text,
      logprobs,
      finish_reason: d.finish,
      stop_reason: d.stopReason,
      ...ids,
    };
  }

  /** A chat delta's message part: plain content, or what the tool handling releases of it. */
  private chatDelta(run: ChoiceRun, d: ChoiceDelta): Record<string, unknown> {
    const tools = this.parsed.kind === "chat" ? this.parsed.tools : null;
    if (tools === null) return d.text ? { content: d.text } : {};
    let stream = this.toolStreams.get(run);
    if (!stream) {
      stream = new ToolStream(tools, this.toolParser);
      this.toolStreams.set(run, stream);
    }
    const out: Record<string, unknown> = { ...stream.push(d.text) };
    if (d.finish !== null) {
      const end = stream.end(d.finish === "stop");
      if (end.content) out.content = `${(out.content as string | undefined) ?? ""}${end.content}`;
      if (end.tool_calls)
        out.tool_calls = [...((out.tool_calls as unknown[] | undefined) ?? []), ...end.tool_calls];
      if (end.toolCallsFinish) this.toolFinish.add(run);
    }
    return out;
  }

  /** Legacy logprobs of a completion: the prompt's entries first when echoed, then `ids`. */
  private legacy(
    run: ChoiceRun,
    withPrompt: boolean,
    ids: readonly number[],
    entries: ChoiceRun["logprobs"],
    offset: number,
  ) {
    const topN = this.parsed.lp.logprobs;
    if (topN === null) return null;
    if (!withPrompt) return legacyLogprobs(ids, entries, topN, this.text, offset);
    const scored = run.promptLogprobs ?? [];
    return legacyLogprobs(
      [...run.prompt, ...ids],
      [null, ...run.prompt.slice(1).map((_, i) => scored[i] ?? null), ...entries],
      topN,
      this.text,
      offset,
    );
  }

  private endOffset(l: { tokens: string[]; text_offset: number[] }): number {
    const n = l.tokens.length;
    return n === 0 ? 0 : l.text_offset[n - 1]! + l.tokens[n - 1]!.length;
  }
}

/**
 * The n choices shown per prompt: all of them, or with best_of the n of
 * highest cumulative log-probability (ties: the lower index), in that order.
 */
export function shownChoices(runs: readonly ChoiceRun[], perPrompt: number, n: number): ChoiceRun[] {
  if (perPrompt === n) return [...runs];
  const out: ChoiceRun[] = [];
  for (let p = 0; p * perPrompt < runs.length; p++) {
    const group = runs.slice(p * perPrompt, (p + 1) * perPrompt);
    group.sort((a, b) => b.cumulativeLogprob - a.cumulativeLogprob || a.index - b.index);
    out.push(...group.slice(0, n));
  }
  return out;
}

/** OpenAI's usage: the prompt counted once per prompt, every generated token (best_of's too). */
export function usageJson(runs: readonly ChoiceRun[], perPrompt: number) {
  let prompt = 0;
  let completion = 0;
  let cached = 0;
  runs.forEach((r, i) => {
    if (i % perPrompt === 0) prompt += r.promptTokens;
    completion += r.completionTokens;
    cached += r.cachedTokens;
  });
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: cached },
  };
}
