import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ChatTemplate, type RenderInput, TemplateError } from "../../../worker/model/chat-template.ts";

/**
 * The real chat templates of Llama 3.2, Qwen2.5, Mistral (Nemo, Mixtral,
 * v0.3 with tools) and Gemma 2, copied verbatim into ./templates, rendered
 * with @huggingface/jinja against what the reference implementation
 * (transformers' apply_chat_template on Python Jinja) produces. Sources of
 * the expected strings:
 *  - Mixtral and Mistral v0.3 (tools): huggingface.js packages/jinja/test/e2e.test.js,
 *    whose targets were generated with transformers;
 *  - Gemma 2: the google/gemma-2-2b-it model card's apply_chat_template output;
 *  - Llama 3.2: Meta's documented Llama 3.1/3.2 prompt format (system header with
 *    the knowledge cut-off and date; the JSON tool-calling user turn);
 *  - Qwen2.5: Qwen's function-calling guide (the Hermes-style system turn, the
 *    <tool_call> / <tool_response> round trip);
 *  - continue_final_message: vLLM's test_chat_template.py rule (the render is cut after
 *    the final message's content).
 */
const tpl = (name: string) =>
  new ChatTemplate(readFileSync(join(import.meta.dirname, "templates", name), "utf8"));

const input = (r: Partial<RenderInput>): RenderInput => ({
  messages: [],
  tools: null,
  documents: null,
  addGenerationPrompt: true,
  continueFinalMessage: false,
  kwargs: {},
  ...r,
});

const EXAMPLE_CHAT = [
  { role: "user", content: "Hello, how are you?" },
  { role: "assistant", content: "I'm doing great. How can I help you today?" },
  { role: "user", content: "I'd like to show off how chat templating works!" },
];

const WEATHER_TOOL = {
  type: "function",
  function: {
    name: "get_current_weather",
    description: "Get the current weather in a given location",
    parameters: {
      type: "object",
      properties: {
        location: { type: "string", description: "The city and state, e.g. San Francisco, CA" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
      },
      required: ["location"],
    },
  },
};

const TEMPERATURE_TOOL = {
  type: "function",
  function: {
    name: "get_current_temperature",
    description: "Get current temperature at a location.",
    parameters: {
      type: "object",
      properties: { location: { type: "string", description: "The location." } },
      required: ["location"],
    },
  },
};

describe("real chat templates rendered as transformers renders them", () => {
  it("Mixtral-8x7B-Instruct", () => {
    const out = tpl("Mixtral-8x7B-Instruct-v0.1.jinja").render(
      input({ messages: EXAMPLE_CHAT, addGenerationPrompt: false }),
      { bos_token: "<s>", eos_token: "</s>" },
    );
    expect(out).toBe(
      "<s>[INST] Hello, how are you? [/INST]I'm doing great. How can I help you today?</s>[INST] I'd like to show off how chat templating works! [/INST]",
    );
  });

  it("Mistral-7B-Instruct v0.3 with tools (tojson as Python's json.dumps)", () => {
    const out = tpl("CISCai-Mistral-7B-Instruct-v0.3-SOTA.jinja").render(
      input({
        messages: [{ role: "user", content: "What's the weather like in Oslo and Stockholm?" }],
        tools: [WEATHER_TOOL],
        addGenerationPrompt: false,
      }),
      { bos_token: "<s>", eos_token: "</s>" },
    );
    expect(out).toBe(
      '<s>[AVAILABLE_TOOLS] [{"name": "get_current_weather", "description": "Get the current weather in a given location", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}][/AVAILABLE_TOOLS][INST] What\'s the weather like in Oslo and Stockholm?[/INST]',
    );
  });

  it("Gemma 2: user turns as 'user', assistant as 'model'; a system turn is the template's error", () => {
    const g = tpl("gemma-2-2b-it.jinja");
    const specials = { bos_token: "<bos>", eos_token: "<eos>" };
    expect(
      g.render(input({ messages: [{ role: "user", content: "Write a hello world program" }] }), specials),
    ).toBe("<bos><start_of_turn>user\nWrite a hello world program<end_of_turn>\n<start_of_turn>model\n");
    expect(g.render(input({ messages: EXAMPLE_CHAT, addGenerationPrompt: false }), specials)).toBe(
      "<bos><start_of_turn>user\nHello, how are you?<end_of_turn>\n<start_of_turn>model\nI'm doing great. How can I help you today?<end_of_turn>\n<start_of_turn>user\nI'd like to show off how chat templating works!<end_of_turn>\n",
    );
    expect(() => g.render(input({ messages: [{ role: "system", content: "x" }] }), specials)).toThrow(
      /System role not supported/,
    );
  });

  it("Llama 3.2: the system header with the knowledge cut-off and date, then the turns", () => {
    const l = tpl("Llama-3.2-3B-Instruct.jinja");
    const specials = { bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>" };
    const out = l.render(
      input({
        messages: [
          { role: "system", content: "You are a helpful assistant" },
          { role: "user", content: "What is the capital of France?" },
        ],
        kwargs: { date_string: "23 July 2024" },
      }),
      specials,
    );
    expect(out).toBe(
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 23 July 2024\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    );
    // JSON tool calling: the tools go into the first user turn, indented by tojson(indent=4)
    const withTools = l.render(
      input({
        messages: [{ role: "user", content: "What is the temperature in Paris?" }],
        tools: [TEMPERATURE_TOOL],
        kwargs: { date_string: "26 Jul 2024" },
      }),
      specials,
    );
    expect(withTools).toBe(
      `<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n${JSON.stringify(TEMPERATURE_TOOL, null, 4)}\n\nWhat is the temperature in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n`,
    );
    // an earlier tool call (arguments as an object) and its result; a string is "iterable" to
    // Jinja, so the template JSON-encodes the tool's content (Python renders the same)
    const roundTrip = l.render(
      input({
        messages: [
          { role: "assistant", content: "", tool_calls: [{ function: { name: "f", arguments: { x: 1 } } }] },
          { role: "tool", content: '{"ok": true}' },
        ],
        addGenerationPrompt: false,
        kwargs: { date_string: "26 Jul 2024" },
      }),
      specials,
    );
    expect(roundTrip).toBe(
      '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{"name": "f", "parameters": {"x": 1}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"{\\"ok\\": true}"<|eot_id|>',
    );
  });

  it("Qwen2.5: the default system turn, tools in it, and a tool call round trip", () => {
    const q = tpl("Qwen2.5-7B-Instruct.jinja");
    const specials = { eos_token: "<|im_end|>", pad_token: "<|endoftext|>" };
    expect(q.render(input({ messages: [{ role: "user", content: "Hi" }] }), specials)).toBe(
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    );
    const out = q.render(
      input({
        messages: [
          { role: "user", content: "What's the temperature in San Francisco now?" },
          {
            role: "assistant",
            content: "",
            tool_calls: [
              {
                type: "function",
                function: {
                  name: "get_current_temperature",
                  arguments: { location: "San Francisco, CA, USA" },
                },
              },
            ],
          },
          { role: "tool", content: '{"temperature": 26.1, "location": "San Francisco, CA, USA"}' },
        ],
        tools: [TEMPERATURE_TOOL],
      }),
      specials,
    );
    expect(out).toBe(
      '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{"type": "function", "function": {"name": "get_current_temperature", "description": "Get current temperature at a location.", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "The location."}}, "required": ["location"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' +
        "<|im_start|>user\nWhat's the temperature in San Francisco now?<|im_end|>\n" +
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA"}}\n</tool_call><|im_end|>\n' +
        '<|im_start|>user\n<tool_response>\n{"temperature": 26.1, "location": "San Francisco, CA, USA"}\n</tool_response><|im_end|>\n' +
        "<|im_start|>assistant\n",
    );
  });

  it("Mistral Nemo: the system text joins the last user turn; tools before it; [TOOL_CALLS] with 9-character ids", () => {
    const m = tpl("Mistral-Nemo-Instruct-2407.jinja");
    const specials = { bos_token: "<s>", eos_token: "</s>" };
    const out = m.render(
      input({
        messages: [
          { role: "system", content: "Be brief." },
          { role: "user", content: "Weather in Oslo?" },
          {
            role: "assistant",
            content: "",
            tool_calls: [
              {
                id: "abcdefghi",
                type: "function",
                function: { name: "get_current_weather", arguments: { location: "Oslo" } },
              },
            ],
          },
          { role: "tool", content: "-3", tool_call_id: "abcdefghi" },
          { role: "assistant", content: "It is -3." },
          { role: "user", content: "And now?" },
        ],
        tools: [WEATHER_TOOL],
        addGenerationPrompt: false,
      }),
      specials,
    );
    expect(out).toBe(
      '<s>[INST]Weather in Oslo?[/INST][TOOL_CALLS][{"name": "get_current_weather", "arguments": {"location": "Oslo"}, "id": "abcdefghi"}]</s>[TOOL_RESULTS]{"content": -3, "call_id": "abcdefghi"}[/TOOL_RESULTS]It is -3.</s>' +
        '[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_current_weather", "description": "Get the current weather in a given location", "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}][/AVAILABLE_TOOLS]' +
        "[INST]Be brief.\n\nAnd now?[/INST]",
    );
  });
});

describe("rendering rules", () => {
  const chatml = new ChatTemplate(
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
  );
  const chat = [
    { role: "user", content: "Hello" },
    { role: "assistant", content: "Hi there!" },
    { role: "user", content: "What is the capital of" },
  ];

  it("add_generation_prompt opens the assistant turn; continue_final_message leaves the last one open", () => {
    expect(chatml.render(input({ messages: chat }), {})).toBe(
      "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|>\n<|im_start|>user\nWhat is the capital of<|im_end|>\n<|im_start|>assistant\n",
    );
    expect(chatml.render(input({ messages: chat, addGenerationPrompt: false }), {})).toBe(
      "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|>\n<|im_start|>user\nWhat is the capital of<|im_end|>\n",
    );
    const cont = [...chat, { role: "assistant", content: "The capital of" }];
    expect(
      chatml.render(input({ messages: cont, addGenerationPrompt: false, continueFinalMessage: true }), {}),
    ).toBe(
      "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|>\n<|im_start|>user\nWhat is the capital of<|im_end|>\n<|im_start|>assistant\nThe capital of",
    );
    // trailing whitespace the template kept stays; the template trimmed it (Gemma's | trim) → cut after the text
    const trailing = [
      { role: "user", content: "Q" },
      { role: "assistant", content: "Answer: " },
    ];
    expect(
      chatml.render(
        input({ messages: trailing, addGenerationPrompt: false, continueFinalMessage: true }),
        {},
      ),
    ).toMatch(/Answer: $/);
    const gemma = tpl("gemma-2-2b-it.jinja");
    expect(
      gemma.render(input({ messages: trailing, addGenerationPrompt: false, continueFinalMessage: true }), {}),
    ).toMatch(/<start_of_turn>model\nAnswer:$/);
  });

  it("chat_template_kwargs reach the template; the renderer's own names are not replaceable; errors are TemplateErrors", () => {
    const t = new ChatTemplate(
      "{{ greeting }} {{ messages | length }}{% if enable_thinking is defined %}!{% endif %}",
    );
    expect(t.render(input({ messages: chat, kwargs: { greeting: "hey", enable_thinking: false } }), {})).toBe(
      "hey 3!",
    );
    expect(() => t.render(input({ messages: chat, kwargs: { messages: [] } }), {})).toThrow(TemplateError);
    expect(() => new ChatTemplate("{% if %}")).toThrow(TemplateError);
    expect(() => chatml.render(input({ messages: chat, continueFinalMessage: true }), {})).toThrow(
      /cannot both be true/,
    );
  });
});
