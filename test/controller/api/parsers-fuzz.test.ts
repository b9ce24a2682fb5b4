import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { checkJsonContentType, parseJsonBytes } from "../../../controller/api/body.ts";
import { ApiError } from "../../../controller/api/errors.ts";
import { requestIdentity } from "../../../controller/api/headers.ts";
import {
  checkPromptLimits,
  checkRawLimits,
  defaultRequestLimits,
  describeValue,
} from "../../../controller/api/limits.ts";
import { parseChatRequest, parseCompletionRequest } from "../../../controller/api/request.ts";

/**
 * Fuzzing the request parsers: whatever a client sends — any JSON value in
 * any field, nested a hundred thousand deep, numbers past 2^53 or written
 * 1e400, wrong types, bytes that are not UTF-8 — the front door's pure
 * request path (bytes → JSON → limits → request) either yields a request or
 * throws an ApiError with a 4xx status and a short message. Anything else
 * would be answered 500.
 */

/** Field names vLLM's protocol defines (and some it does not), so new parsers are fuzzed too. */
const FIELDS = [
  "model",
  "prompt",
  "messages",
  "max_tokens",
  "max_completion_tokens",
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "seed",
  "n",
  "best_of",
  "stop",
  "stop_token_ids",
  "stream",
  "stream_options",
  "logprobs",
  "top_logprobs",
  "echo",
  "presence_penalty",
  "frequency_penalty",
  "repetition_penalty",
  "logit_bias",
  "tools",
  "tool_choice",
  "response_format",
  "user",
  "ignore_eos",
  "min_tokens",
  "chat_template",
  "chat_template_kwargs",
  "add_generation_prompt",
  "guided_json",
  "whatever",
];

/** A JSON value nested `depth` deep, built without recursion. */
function nested(depth: number, kind: "array" | "object"): unknown {
  let v: unknown = 1;
  for (let i = 0; i < depth; i++) v = kind === "array" ? [v] : { a: v };
  return v;
}
/** Deep enough to overflow any recursive walk (JSON.stringify overflows near 10,000 here). */
const DEEP = [nested(100_000, "array"), nested(100_000, "object"), nested(2_000, "array")];

const hostileValue: fc.Arbitrary<unknown> = fc.oneof(
  fc.jsonValue({ maxDepth: 4 }),
  fc.constantFrom(
    Number.MAX_VALUE,
    -Number.MAX_VALUE,
    2 ** 53 + 2,
    -(2 ** 60),
    1e-320,
    0.1,
    -0,
    "",
    "\ud800",
    "x".repeat(10_000),
    [],
    {},
    [[]],
    [1, "a", null],
    [-1],
    [1.5],
    [[1], ["a"]],
  ),
  fc.constantFrom(...DEEP),
);

const body = fc.dictionary(fc.constantFrom(...FIELDS), hostileValue, { maxKeys: 8 });

/** Runs the pure request path on a parsed body; returns the ApiError thrown, or null. */
function requestPath(b: unknown, kind: "completion" | "chat"): ApiError | null {
  try {
    checkRawLimits(b, defaultRequestLimits);
    const parsed = kind === "chat" ? parseChatRequest(b) : parseCompletionRequest(b);
    checkPromptLimits(parsed, defaultRequestLimits);
    return null;
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
}

function expectClientError(err: ApiError | null): void {
  if (err === null) return;
  expect(err.status).toBeGreaterThanOrEqual(400);
  expect(err.status).toBeLessThan(500);
  expect(err.message.length).toBeLessThan(1_000);
}

describe("request parsers under fuzzing", () => {
  it("answer any body with a request or a 4xx, for completions and chat", () => {
    fc.assert(
      fc.property(body, fc.constantFrom("completion" as const, "chat" as const), (b, kind) => {
        expectClientError(requestPath(b, kind));
      }),
      { numRuns: 400 },
    );
  });

  it("answer a valid request with one hostile field with a request or a 4xx", () => {
    fc.assert(
      fc.property(fc.constantFrom(...FIELDS), hostileValue, (field, value) => {
        const b = {
          model: "m",
          prompt: "hello",
          messages: [{ role: "user", content: "hi" }],
          [field]: value,
        };
        for (const kind of ["completion", "chat"] as const) {
          const err = requestPath(b, kind);
          expectClientError(err);
        }
      }),
      { numRuns: 400 },
    );
  });

  it("describe any value in bounded time and length", () => {
    fc.assert(
      fc.property(hostileValue, (v) => {
        expect(describeValue(v).length).toBeLessThan(120);
      }),
      { numRuns: 300 },
    );
  });

  it("answer any bytes with JSON or a 400 (invalid UTF-8, truncated, huge numbers, deep nesting)", () => {
    const bytes = fc.oneof(
      fc.uint8Array({ maxLength: 200 }),
      fc.jsonValue().map((v) => new TextEncoder().encode(JSON.stringify(v))),
      fc.constantFrom(
        new TextEncoder().encode(`{"max_tokens": 1e400, "n": ${"9".repeat(400)}}`),
        new TextEncoder().encode(`${"[".repeat(100_000)}${"]".repeat(100_000)}`),
        new TextEncoder().encode('{"prompt": "\\ud800"}'),
        Uint8Array.of(0x7b, 0x22, 0xc3, 0x28, 0x22, 0x7d),
        Uint8Array.of(0xef, 0xbb, 0xbf, 0x7b, 0x7d),
      ),
    );
    fc.assert(
      fc.property(bytes, (b) => {
        let parsed: unknown;
        try {
          parsed = parseJsonBytes(b);
        } catch (err) {
          expect(err).toBeInstanceOf(ApiError);
          expect((err as ApiError).status).toBe(400);
          return;
        }
        expectClientError(requestPath(parsed, "completion"));
        expectClientError(requestPath(parsed, "chat"));
      }),
      { numRuns: 300 },
    );
  });

  it("answer any content type or request id header with a decision, never a throw of another kind", () => {
    fc.assert(
      fc.property(fc.option(fc.string({ maxLength: 300 }), { nil: undefined }), (h) => {
        try {
          checkJsonContentType(h);
        } catch (err) {
          expect(err).toBeInstanceOf(ApiError);
          expect((err as ApiError).status).toBe(415);
        }
        const id = requestIdentity(h === undefined ? {} : { "x-request-id": h });
        expect(id.id.length).toBeLessThanOrEqual(96);
        if (id.error) expect(id.error.status).toBe(400);
      }),
      { numRuns: 300 },
    );
  });
});
