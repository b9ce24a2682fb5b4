import { describe, expect, it } from "vitest";
import { parseChatRequest, parseCompletionRequest } from "../../../controller/api/request.ts";
import { REFUSED_FIELDS } from "../../../controller/api/request-fields.ts";

/**
 * Nothing accepted and ignored: every field of vLLM's CompletionRequest and
 * ChatCompletionRequest (vllm/entrypoints/openai/protocol.py) and of OpenAI's
 * two endpoints is either read by the parser or in REFUSED_FIELDS for that
 * endpoint. The parser's reads are observed through a Proxy over the body,
 * so a field added to the lists below that no code reads fails here. What
 * each read field does is asserted by the request and e2e tests.
 */

const COMMON = [
  "model",
  "stream",
  "stream_options",
  "n",
  "best_of",
  "temperature",
  "top_p",
  "top_k",
  "min_p",
  "seed",
  "stop",
  "stop_token_ids",
  "include_stop_str_in_output",
  "ignore_eos",
  "min_tokens",
  "max_tokens",
  "frequency_penalty",
  "presence_penalty",
  "repetition_penalty",
  "logit_bias",
  "allowed_token_ids",
  "bad_words",
  "logprobs",
  "prompt_logprobs",
  "echo",
  "user",
  "priority",
  "request_id",
  "cache_salt",
  "skip_special_tokens",
  "spaces_between_special_tokens",
  "truncate_prompt_tokens",
  "add_special_tokens",
  "response_format",
  "structured_outputs",
  "guided_json",
  "guided_regex",
  "guided_choice",
  "guided_grammar",
  "guided_decoding_backend",
  "guided_whitespace_pattern",
  "use_beam_search",
  "length_penalty",
  "early_stopping",
  "return_tokens_as_token_ids",
  "return_token_ids",
  "kv_transfer_params",
  "vllm_xargs",
  "logprob_token_ids",
  "service_tier",
];
const COMPLETION = [...COMMON, "prompt", "suffix", "prompt_embeds"];
const CHAT = [
  ...COMMON,
  "messages",
  "max_completion_tokens",
  "top_logprobs",
  "tools",
  "tool_choice",
  "parallel_tool_calls",
  "reasoning_effort",
  "include_reasoning",
  "add_generation_prompt",
  "continue_final_message",
  "documents",
  "chat_template",
  "chat_template_kwargs",
  "mm_processor_kwargs",
  "media_io_kwargs",
  "return_prompt_text",
  "modalities",
  "audio",
  "prediction",
  "store",
  "metadata",
  "functions",
  "function_call",
  "web_search_options",
  "verbosity",
];

/** The keys a parse looked at (read or tested), over a minimal valid body. */
function keysRead(parse: (b: unknown) => unknown, body: Record<string, unknown>): Set<string> {
  const seen = new Set<string>();
  const proxy = new Proxy(body, {
    get(t, k) {
      if (typeof k === "string") seen.add(k);
      return Reflect.get(t, k);
    },
    has(t, k) {
      if (typeof k === "string") seen.add(k);
      return Reflect.has(t, k);
    },
  });
  parse(proxy);
  return seen;
}

describe("every vLLM and OpenAI request field", () => {
  it.each([
    ["completion", COMPLETION, parseCompletionRequest, { model: "m", prompt: "x" }],
    ["chat", CHAT, parseChatRequest, { model: "m", messages: [{ role: "user", content: "x" }] }],
  ] as const)("%s: each is read by the parser or refused by name", (endpoint, fields, parse, body) => {
    const read = keysRead(parse, { ...body });
    const ignored = fields.filter(
      (f) => !read.has(f) && !REFUSED_FIELDS[f]?.endpoints.includes(endpoint as "completion" | "chat"),
    );
    expect(ignored).toEqual([]);
  });
});
