import { describe, expect, it } from "vitest";
import { ApiError } from "../../../controller/api/errors.ts";
import { parserForTemplate, parseToolCalls } from "../../../controller/api/tool-parsers.ts";
import { parseToolFields, ToolStream, toolConstraint, toolMessage } from "../../../controller/api/tools.ts";

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      parameters: { type: "object", properties: { city: { type: "string" } } },
    },
  },
  { type: "function", function: { name: "get_time" } },
];

function err(f: () => unknown): ApiError {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(ApiError);
    return e as ApiError;
  }
  throw new Error("expected an ApiError");
}

describe("tool-call parsers (vLLM's formats)", () => {
  it("Hermes / Qwen2.5: <tool_call>{json}</tool_call> blocks, the text before as content", () => {
    const out = parseToolCalls(
      "hermes",
      'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    );
    expect(out.content).toBe("Let me check.\n");
    expect(out.calls.map((c) => [c.name, JSON.parse(c.arguments)])).toEqual([
      ["get_weather", { city: "Oslo" }],
      ["get_time", {}],
    ]);
    expect(out.calls[0]!.id).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
    // malformed JSON: the whole text is content
    expect(parseToolCalls("hermes", "<tool_call>{oops</tool_call>").calls).toEqual([]);
  });

  it("Llama 3 JSON: a leading object with parameters (or python_tag), several separated by ';'", () => {
    const out = parseToolCalls(
      "llama3_json",
      '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {}}',
    );
    expect(out.content).toBeNull();
    expect(out.calls.map((c) => c.name)).toEqual(["get_weather", "get_time"]);
    expect(JSON.parse(out.calls[0]!.arguments)).toEqual({ city: "Oslo" });
    expect(
      parseToolCalls("llama3_json", '<|python_tag|>{"name": "get_time", "parameters": {}}').calls,
    ).toHaveLength(1);
    expect(parseToolCalls("llama3_json", "It is sunny.").calls).toEqual([]);
  });

  it("Mistral: [TOOL_CALLS][…] with 9-character ids", () => {
    const out = parseToolCalls(
      "mistral",
      'ok [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
    );
    expect(out.content).toBe("ok ");
    expect(out.calls[0]!.id).toMatch(/^[A-Za-z0-9]{9}$/);
    expect(JSON.parse(out.calls[0]!.arguments)).toEqual({ city: "Oslo" });
  });

  it("picks the parser from the template's markup", () => {
    expect(parserForTemplate("{{ '<tool_call>' }}")).toBe("hermes");
    expect(parserForTemplate("[TOOL_CALLS]")).toBe("mistral");
    expect(parserForTemplate('<|start_header_id|>{"name": …, "parameters": …}')).toBe("llama3_json");
    expect(parserForTemplate("{{ messages }}")).toBeNull();
  });
});

describe("tool_choice", () => {
  it("parses tools and tool_choice as vLLM validates them", () => {
    expect(parseToolFields({})).toBeNull();
    expect(parseToolFields({ tools: TOOLS })!.choice).toBe("auto");
    expect(
      parseToolFields({ tools: TOOLS, tool_choice: { type: "function", function: { name: "get_time" } } })!
        .choice,
    ).toEqual({
      name: "get_time",
    });
    expect(err(() => parseToolFields({ tools: [] })).param).toBe("tools");
    expect(err(() => parseToolFields({ tool_choice: "required" })).param).toBe("tool_choice");
    expect(
      err(() =>
        parseToolFields({ tools: TOOLS, tool_choice: { type: "function", function: { name: "nope" } } }),
      ).param,
    ).toBe("tool_choice");
    expect(err(() => parseToolFields({ tools: TOOLS, tool_choice: "sometimes" })).param).toBe("tool_choice");
  });

  it("required and named choices constrain decoding; none and auto do not", () => {
    const f = (c: unknown) => parseToolFields({ tools: TOOLS, tool_choice: c, parallel_tool_calls: false })!;
    expect(toolConstraint(f("none"))).toBeNull();
    expect(toolConstraint(f("auto"))).toBeNull();
    const req = toolConstraint(f("required"));
    expect(req).toMatchObject({ kind: "json_schema", schema: { type: "array", minItems: 1, maxItems: 1 } });
    expect(toolConstraint(f({ type: "function", function: { name: "get_weather" } }))).toEqual({
      kind: "json_schema",
      schema: TOOLS[0]!.function.parameters,
    });
  });

  it("builds the message: required from the JSON list, named from the arguments", () => {
    const required = toolMessage(
      parseToolFields({ tools: TOOLS, tool_choice: "required" })!,
      "hermes",
      '[{"name": "get_time", "parameters": {}}]',
      true,
    );
    expect(required).toMatchObject({
      content: null,
      toolCallsFinish: true,
      calls: [{ name: "get_time", arguments: "{}" }],
    });
    const named = toolMessage(
      parseToolFields({
        tools: TOOLS,
        tool_choice: { type: "function", function: { name: "get_weather" } },
      })!,
      "hermes",
      '{"city": "Rome"}',
      true,
    );
    expect(named).toMatchObject({
      content: null,
      toolCallsFinish: false,
      calls: [{ name: "get_weather", arguments: '{"city": "Rome"}' }],
    });
  });

  it("streams content until a call could start, then the calls; a named call's arguments as they come", () => {
    const auto = new ToolStream(parseToolFields({ tools: TOOLS })!, "hermes");
    const deltas = ["Sure", ". <to", 'ol_call>\n{"name": "get_time", ', '"arguments": {}}\n</tool_call>'].map(
      (d) => auto.push(d),
    );
    expect(deltas.map((d) => d.content ?? "")).toEqual(["Sure", ". ", "", ""]);
    const end = auto.end(true);
    expect(end.toolCallsFinish).toBe(true);
    expect(end.tool_calls).toHaveLength(1);
    const plain = new ToolStream(parseToolFields({ tools: TOOLS })!, "hermes");
    expect(plain.push("a <t").content).toBe("a ");
    expect(plain.end(true)).toEqual({ content: "<t", toolCallsFinish: false });
    const named = new ToolStream(
      parseToolFields({ tools: TOOLS, tool_choice: { type: "function", function: { name: "get_time" } } })!,
      null,
    );
    const first = named.push('{"a"') as {
      tool_calls: { id: string; function: { name: string; arguments: string } }[];
    };
    expect(first.tool_calls[0]!.function).toEqual({ name: "get_time", arguments: '{"a"' });
    expect(named.push(": 1}")).toEqual({ tool_calls: [{ index: 0, function: { arguments: ": 1}" } }] });
  });
});
