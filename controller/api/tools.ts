import type { ConstraintSpec } from "../../schema/constraint.ts";
import { badRequest } from "./errors.ts";
import { type Body, given, optBool } from "./request-fields.ts";
import {
  callStart,
  markerPrefix,
  type ParsedCall,
  parseToolCalls,
  type ToolParserName,
  toolCallId,
} from "./tool-parsers.ts";

/**
 * Chat tools (vLLM's rules): `tools` go into the template; `tool_choice`
 * none (no parsing), auto (the model decides; calls parsed out of its text),
 * required (decoding constrained to a JSON list of {name, parameters} of the
 * given tools), or a named function (decoding constrained to its parameters'
 * schema). The response carries `tool_calls`, streamed as deltas. Pure.
 */

export const MAX_TOOLS = 128;

export type ToolChoice = "none" | "auto" | "required" | { readonly name: string };

export interface ToolFields {
  /** As given, for the template. */
  readonly raw: readonly unknown[];
  readonly functions: readonly { readonly name: string; readonly parameters: unknown }[];
  readonly choice: ToolChoice;
  /** parallel_tool_calls: false keeps at most one call. */
  readonly parallel: boolean;
}

export function parseToolFields(b: Body): ToolFields | null {
  const raw = b.tools;
  // Checked even without tools (where there are no calls for it to limit).
  const parallel = optBool(b, "parallel_tool_calls") ?? true;
  if (!given(b, "tools")) {
    if (given(b, "tool_choice") && b.tool_choice !== "none")
      throw badRequest("when using 'tool_choice', 'tools' must be set", "tool_choice");
    return null;
  }
  if (!Array.isArray(raw) || raw.length === 0)
    throw badRequest("'tools' must be a non-empty list (or omitted)", "tools");
  if (raw.length > MAX_TOOLS) throw badRequest(`'tools' takes at most ${MAX_TOOLS} tools`, "tools");
  const functions = raw.map((t, i) => {
    const at = `tools[${i}]`;
    const tool = t as Body | null;
    const fn = tool?.function as Body | null | undefined;
    if (typeof tool !== "object" || tool === null || (tool.type !== undefined && tool.type !== "function"))
      throw badRequest(`${at} must be {type: "function", function: {...}}`, "tools");
    if (typeof fn !== "object" || fn === null || typeof fn.name !== "string" || fn.name === "")
      throw badRequest(`${at}.function needs a name`, "tools");
    if (fn.parameters !== undefined && (typeof fn.parameters !== "object" || fn.parameters === null))
      throw badRequest(`${at}.function.parameters must be a JSON schema object`, "tools");
    return { name: fn.name, parameters: fn.parameters ?? { type: "object" } };
  });
  const c = b.tool_choice ?? "auto";
  let choice: ToolChoice;
  if (c === "none" || c === "auto" || c === "required") choice = c;
  else if (typeof c === "object" && c !== null) {
    const fn = (c as Body).function as Body | undefined;
    if (typeof fn !== "object" || fn === null || typeof fn.name !== "string" || fn.name === "")
      throw badRequest(
        '\'tool_choice\' must be none, auto, required or {"type": "function", "function": {"name": …}}',
        "tool_choice",
      );
    if (!functions.some((f) => f.name === fn.name))
      throw badRequest("the tool named in 'tool_choice' is not among 'tools'", "tool_choice");
    choice = { name: fn.name };
  } else throw badRequest("'tool_choice' must be none, auto, required or a named function", "tool_choice");
  return { raw, functions, choice, parallel };
}

/** The decoding constraint required and named choices impose (null for none and auto). */
export function toolConstraint(t: ToolFields): ConstraintSpec | null {
  if (t.choice === "none" || t.choice === "auto") return null;
  if (t.choice === "required") {
    // vLLM's schema for required tool calls: a list of {name, parameters} of the given tools.
    return {
      kind: "json_schema",
      schema: {
        type: "array",
        minItems: 1,
        ...(t.parallel ? {} : { maxItems: 1 }),
        items: {
          type: "object",
          anyOf: t.functions.map((f) => ({
            properties: { name: { type: "string", enum: [f.name] }, parameters: f.parameters },
            required: ["name", "parameters"],
          })),
        },
      },
    };
  }
  const name = t.choice.name;
  return { kind: "json_schema", schema: t.functions.find((f) => f.name === name)!.parameters };
}

export interface ToolMessage {
  readonly content: string | null;
  readonly calls: readonly ParsedCall[];
  /** finish_reason becomes "tool_calls" (auto found calls; required ended normally). */
  readonly toolCallsFinish: boolean;
}

/** The whole output as the assistant's message. */
export function toolMessage(
  t: ToolFields,
  parser: ToolParserName | null,
  text: string,
  ended: boolean,
): ToolMessage {
  const keep = (calls: readonly ParsedCall[]) => (t.parallel ? calls : calls.slice(0, 1));
  if (t.choice === "none") return { content: text, calls: [], toolCallsFinish: false };
  if (t.choice === "auto") {
    if (parser === null) return { content: text, calls: [], toolCallsFinish: false };
    const p = parseToolCalls(parser, text);
    return { content: p.content, calls: keep(p.calls), toolCallsFinish: p.calls.length > 0 };
  }
  if (t.choice === "required") {
    let list: unknown;
    try {
      list = JSON.parse(text);
    } catch {
      return { content: text, calls: [], toolCallsFinish: false };
    }
    const calls = (Array.isArray(list) ? list : []).map((c: { name: string; parameters: unknown }) => ({
      id: toolCallId(parser),
      name: c.name,
      arguments: JSON.stringify(c.parameters),
    }));
    return { content: null, calls: keep(calls), toolCallsFinish: ended };
  }
  return {
    content: null,
    calls: [{ id: toolCallId(parser), name: t.choice.name, arguments: text }],
    toolCallsFinish: false,
  };
}

/** OpenAI's tool_calls entries (index set for streamed deltas). */
export function toolCallsJson(calls: readonly ParsedCall[], streamed: boolean) {
  return calls.map((c, index) => ({
    ...(streamed ? { index } : {}),
    id: c.id,
    type: "function" as const,
    function: { name: c.name, arguments: c.arguments },
  }));
}

export interface ToolDelta {
  readonly content?: string;
  readonly tool_calls?: unknown[];
}

/**
 * One streamed choice's tool handling: content streams until a call's
 * marker could start (auto), a named call streams its arguments as they
 * come, required calls are sent whole at the end.
 */
export class ToolStream {
  private text = "";
  private sent = 0;
  private named: ParsedCall | null = null;

  constructor(
    private readonly t: ToolFields,
    private readonly parser: ToolParserName | null,
  ) {}

  push(delta: string): ToolDelta {
    this.text += delta;
    const choice = this.t.choice;
    if (choice === "none" || (choice === "auto" && this.parser === null))
      return delta ? { content: delta } : {};
    if (typeof choice === "object") {
      if (delta === "") return {};
      if (this.named === null) {
        this.named = { id: toolCallId(this.parser), name: choice.name, arguments: "" };
        return {
          tool_calls: [
            {
              index: 0,
              id: this.named.id,
              type: "function",
              function: { name: choice.name, arguments: delta },
            },
          ],
        };
      }
      return { tool_calls: [{ index: 0, function: { arguments: delta } }] };
    }
    if (choice === "required") return {};
    // auto: release content up to where a call starts or could start.
    const start = callStart(this.parser!, this.text);
    const upTo = start >= 0 ? start : this.text.length - markerPrefix(this.parser!, this.text);
    if (upTo <= this.sent) return {};
    const out = this.text.slice(this.sent, upTo);
    this.sent = upTo;
    return { content: out };
  }

  /** At the end: held content or the calls, and whether finish_reason becomes tool_calls. */
  end(ended: boolean): ToolDelta & { readonly toolCallsFinish: boolean } {
    const choice = this.t.choice;
    if (choice === "none" || typeof choice === "object" || (choice === "auto" && this.parser === null))
      return { toolCallsFinish: false };
    const m = toolMessage(this.t, this.parser, this.text, ended);
    if (m.calls.length === 0) {
      const rest = this.text.slice(this.sent);
      this.sent = this.text.length;
      return { ...(rest ? { content: rest } : {}), toolCallsFinish: false };
    }
    return { tool_calls: toolCallsJson(m.calls, true), toolCallsFinish: m.toolCallsFinish };
  }
}
