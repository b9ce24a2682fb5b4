import { describe, expect, it } from "vitest";
import { ApiError } from "../../../controller/api/errors.ts";
import { checkContext, parseChatRequest, parseCompletionRequest } from "../../../controller/api/request.ts";
import { prefixSalt } from "../../../controller/api/service.ts";

function err(f: () => unknown): ApiError {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(ApiError);
    return e as ApiError;
  }
  throw new Error("expected an ApiError");
}

describe("OpenAI request parsing", () => {
  it("parses a completion with defaults and every prompt form", () => {
    const r = parseCompletionRequest({ model: "m", prompt: "hi" });
    expect(r.prompts).toEqual([{ kind: "text", text: "hi" }]);
    expect(r.n).toBe(1);
    expect(r.stream).toBe(false);
    expect(r.sampling).toEqual({
      temperature: 1,
      topP: 1,
      topK: 0,
      minP: 0,
      seed: undefined,
      repetitionPenalty: 1,
      presencePenalty: 0,
      frequencyPenalty: 0,
      logitBias: [],
      minTokens: 0,
      allowedTokenIds: null,
    });
    expect(r.stop).toEqual({ strings: [], tokenIds: [], includeStopStr: false, ignoreEos: false });
    expect(r.skipSpecialTokens).toBe(true);
    expect(parseCompletionRequest({ model: "m", prompt: [1, 2] }).prompts).toEqual([
      { kind: "tokens", ids: [1, 2] },
    ]);
    expect(parseCompletionRequest({ model: "m", prompt: ["a", "b"] }).prompts).toHaveLength(2);
    expect(parseCompletionRequest({ model: "m", prompt: [[1], [2, 3]] }).prompts).toHaveLength(2);
    expect(parseCompletionRequest({ model: "m", prompt: "x", top_k: -1 }).sampling.topK).toBe(0);
  });

  it("names the field of a wrong type or range", () => {
    expect(err(() => parseCompletionRequest({ prompt: "x" })).param).toBe("model");
    expect(err(() => parseCompletionRequest({ model: "m" })).param).toBe("prompt");
    expect(err(() => parseCompletionRequest({ model: "m", prompt: "x", max_tokens: "5" })).param).toBe(
      "max_tokens",
    );
    expect(err(() => parseCompletionRequest({ model: "m", prompt: "x", max_tokens: 1.5 })).param).toBe(
      "max_tokens",
    );
    expect(err(() => parseCompletionRequest({ model: "m", prompt: "x", temperature: 3 })).param).toBe(
      "temperature",
    );
    expect(err(() => parseCompletionRequest({ model: "m", prompt: "x", top_p: 0 })).param).toBe("top_p");
    expect(err(() => parseCompletionRequest({ model: "m", prompt: "x", n: 17 })).param).toBe("n");
    expect(err(() => parseCompletionRequest({ model: "m", prompt: "x", stream: "yes" })).param).toBe(
      "stream",
    );
    expect(err(() => parseCompletionRequest({ model: "m", prompt: "x", stop: ["a", ""] })).param).toBe(
      "stop",
    );
    expect(err(() => parseCompletionRequest({ model: "m", prompt: [1, -2] })).param).toBe("prompt");
    expect(err(() => parseCompletionRequest({ model: "m", prompt: "x", presence_penalty: 2.5 })).param).toBe(
      "presence_penalty",
    );
    expect(err(() => parseCompletionRequest([1, 2])).status).toBe(400);
  });

  it("parses every sampling and stopping field with vLLM's names and bounds", () => {
    const r = parseCompletionRequest({
      model: "m",
      prompt: "x",
      max_tokens: 8,
      min_p: 0.1,
      repetition_penalty: 1.3,
      presence_penalty: -0.5,
      frequency_penalty: 1.5,
      logit_bias: { "7": 250, "12": -3 },
      min_tokens: 4,
      allowed_token_ids: [1, 2],
      stop: ["a", "b"],
      stop_token_ids: [9],
      include_stop_str_in_output: true,
      ignore_eos: true,
      skip_special_tokens: false,
      priority: -3,
      user: "u-1",
    });
    expect(r.sampling).toMatchObject({
      minP: 0.1,
      repetitionPenalty: 1.3,
      presencePenalty: -0.5,
      frequencyPenalty: 1.5,
      // clamped to [-100, 100] as OpenAI and vLLM do
      logitBias: [
        [7, 100],
        [12, -3],
      ],
      minTokens: 4,
      allowedTokenIds: [1, 2],
    });
    expect(r.stop).toEqual({ strings: ["a", "b"], tokenIds: [9], includeStopStr: true, ignoreEos: true });
    expect(r.skipSpecialTokens).toBe(false);
    expect(r.priority).toBe(-3);
    expect(r.user).toBe("u-1");
    const bad = (extra: Record<string, unknown>) =>
      err(() => parseCompletionRequest({ model: "m", prompt: "x", ...extra }));
    expect(bad({ min_tokens: 9, max_tokens: 8 }).param).toBe("min_tokens");
    expect(bad({ logit_bias: { x: 1 } }).param).toBe("logit_bias");
    expect(bad({ logit_bias: [1] }).param).toBe("logit_bias");
    expect(bad({ allowed_token_ids: [] }).param).toBe("allowed_token_ids");
    expect(bad({ stop_token_ids: [-1] }).param).toBe("stop_token_ids");
    expect(bad({ repetition_penalty: 0 }).param).toBe("repetition_penalty");
    expect(bad({ min_p: 2 }).param).toBe("min_p");
    expect(bad({ stream_options: { include_usage: true } }).param).toBe("stream_options");
  });

  it("refuses what it does not implement, naming the field, and accepts the values that change nothing", () => {
    const refused = (extra: Record<string, unknown>) =>
      err(() => parseCompletionRequest({ model: "m", prompt: "x", ...extra }));
    for (const [field, value] of [
      ["use_beam_search", true],
      ["suffix", "tail"],
      ["length_penalty", 2],
      ["bad_words", ["x"]],
      ["spaces_between_special_tokens", false],
      ["kv_transfer_params", {}],
      ["vllm_xargs", { a: 1 }],
      ["logprob_token_ids", [1]],
    ] as const) {
      const e = refused({ [field]: value });
      expect(e.param).toBe(field);
      expect(e.message).toContain("not supported");
    }
    expect(
      parseCompletionRequest({
        model: "m",
        prompt: "x",
        use_beam_search: false,
        length_penalty: 1,
        bad_words: [],
        spaces_between_special_tokens: true,
        suffix: null,
      }).model,
    ).toBe("m");
    expect(
      err(() => parseChatRequest({ model: "m", messages: [{ role: "user", content: "x" }], audio: {} }))
        .param,
    ).toBe("audio");
  });

  it("has vLLM's completion defaults and the prompt-handling fields", () => {
    const r = parseCompletionRequest({ model: "m", prompt: "x" });
    expect(r.maxTokens).toBe(16);
    expect(r.addSpecialTokens).toBe(true);
    expect(r.truncate).toEqual({ tokens: null, side: "left" });
    expect(r.cacheSalt).toBeNull();
    expect(r.requestId).toBeNull();
    expect(
      parseChatRequest({ model: "m", messages: [{ role: "user", content: "x" }] }).maxTokens,
    ).toBeUndefined();
    const full = parseCompletionRequest({
      model: "m",
      prompt: "x",
      add_special_tokens: false,
      truncate_prompt_tokens: 8,
      truncation_side: "right",
      cache_salt: "s",
      request_id: "r-1",
    });
    expect(full).toMatchObject({
      addSpecialTokens: false,
      truncate: { tokens: 8, side: "right" },
      cacheSalt: "s",
      requestId: "r-1",
    });
    const bad = (extra: Record<string, unknown>) =>
      err(() => parseCompletionRequest({ model: "m", prompt: "x", ...extra }));
    expect(bad({ truncate_prompt_tokens: 0 }).param).toBe("truncate_prompt_tokens");
    expect(bad({ truncation_side: "middle" }).param).toBe("truncation_side");
    expect(bad({ cache_salt: "" }).param).toBe("cache_salt");
    expect(bad({ request_id: "has space" }).param).toBe("request_id");
    expect(bad({ min_tokens: 17 }).param).toBe("min_tokens");
  });

  it("salts prefixes by tenant and cache_salt, never colliding across the two", () => {
    expect(prefixSalt("default", null)).toBeUndefined();
    expect(prefixSalt("t1", null)).toBe("t1");
    expect(prefixSalt("default", "s")).not.toBe(prefixSalt("t1", "s"));
    expect(prefixSalt("a", "bc")).not.toBe(prefixSalt("ab", "c"));
    expect(prefixSalt("t1", "s")).not.toBe(prefixSalt("t1", null));
  });

  it("ignores unknown fields", () => {
    expect(parseCompletionRequest({ model: "m", prompt: "x", some_future_field: { a: 1 } }).model).toBe("m");
  });

  it("parses chat messages, including text parts", () => {
    const r = parseChatRequest({
      model: "m",
      messages: [
        { role: "system", content: "be brief" },
        {
          role: "user",
          content: [
            { type: "text", text: "a" },
            { type: "text", text: "b" },
          ],
        },
      ],
      max_completion_tokens: 7,
    });
    // text parts joined by "\n", as vLLM joins them
    expect(r.messages).toEqual([
      { role: "system", content: "be brief" },
      { role: "user", content: "a\nb" },
    ]);
    expect(r.maxTokens).toBe(7);
    expect(err(() => parseChatRequest({ model: "m", messages: [] })).param).toBe("messages");
    expect(
      err(() => parseChatRequest({ model: "m", messages: [{ role: "robot", content: "x" }] })).param,
    ).toBe("messages[0].role");
  });

  it("parses the roles, tool calls and template fields vLLM's chat takes", () => {
    const r = parseChatRequest({
      model: "m",
      messages: [
        { role: "developer", content: "rules" },
        { role: "user", content: "weather?" },
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "c1", type: "function", function: { name: "w", arguments: '{"a":1}' } }],
        },
        { role: "tool", content: "sunny", tool_call_id: "c1" },
        { role: "assistant", content: [{ type: "refusal", refusal: "no" }] },
      ],
      chat_template: "{{ x }}",
      chat_template_kwargs: { x: 1 },
      add_generation_prompt: false,
      documents: [{ title: "t", text: "d" }],
      return_prompt_text: true,
    });
    expect(r.messages[2]).toEqual({
      role: "assistant",
      content: null,
      toolCalls: [{ id: "c1", type: "function", function: { name: "w", arguments: '{"a":1}' } }],
    });
    expect(r.messages[3]).toEqual({ role: "tool", content: "sunny", toolCallId: "c1" });
    expect(r.messages[4]!.content).toBe("no");
    expect(r.chat.prompt).toMatchObject({
      template: "{{ x }}",
      kwargs: { x: 1 },
      addGenerationPrompt: false,
      continueFinalMessage: false,
      documents: [{ title: "t", text: "d" }],
    });
    expect(r.chat.returnPromptText).toBe(true);
    expect(r.chat.addSpecialTokens).toBe(false);
    const chat = (extra: Record<string, unknown>) =>
      parseChatRequest({ model: "m", messages: [{ role: "user", content: "x" }], ...extra });
    // continue_final_message implies no generation prompt; both true is refused (vLLM)
    expect(chat({ continue_final_message: true }).chat.prompt.addGenerationPrompt).toBe(false);
    expect(err(() => chat({ continue_final_message: true, add_generation_prompt: true })).param).toBe(
      "continue_final_message",
    );
    expect(err(() => chat({ messages: [{ role: "user", content: null }] })).param).toBe(
      "messages[0].content",
    );
    expect(
      err(() =>
        chat({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }),
      ).param,
    ).toBe("messages[0].content");
    expect(
      err(() =>
        chat({
          messages: [
            {
              role: "assistant",
              content: null,
              tool_calls: [{ type: "function", function: { name: "w", arguments: "{" } }],
            },
          ],
        }),
      ).param,
    ).toBe("messages[0].tool_calls[0]");
    expect(err(() => chat({ chat_template_kwargs: [1] })).param).toBe("chat_template_kwargs");
  });

  it("checks prompt plus max_tokens against the context", () => {
    expect(checkContext(10, 5, 100)).toBe(5);
    expect(checkContext(10, undefined, 100)).toBe(90);
    const e = err(() => checkContext(10, 95, 100));
    expect(e.code).toBe("context_length_exceeded");
    expect(e.param).toBe("max_tokens");
    expect(err(() => checkContext(100, 1, 100)).param).toBe("prompt");
  });
});
