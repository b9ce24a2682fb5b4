import { describe, expect, it } from "vitest";
import { ApiError } from "../../../controller/api/errors.ts";
import { checkContext, parseChatRequest, parseCompletionRequest } from "../../../controller/api/request.ts";

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
    expect(r.sampling).toEqual({ temperature: 1, topP: 1, topK: 0, seed: undefined });
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
    expect(err(() => parseCompletionRequest({ model: "m", prompt: "x", presence_penalty: 0.5 })).param).toBe(
      "presence_penalty",
    );
    expect(err(() => parseCompletionRequest([1, 2])).status).toBe(400);
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
    expect(r.messages).toEqual([
      { role: "system", content: "be brief" },
      { role: "user", content: "ab" },
    ]);
    expect(r.maxTokens).toBe(7);
    expect(err(() => parseChatRequest({ model: "m", messages: [] })).param).toBe("messages");
    expect(
      err(() => parseChatRequest({ model: "m", messages: [{ role: "robot", content: "x" }] })).param,
    ).toBe("messages[0].role");
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
