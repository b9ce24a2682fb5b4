import { randomBytes, randomUUID } from "node:crypto";

/**
 * Tool calls parsed out of generated text, for the formats models are
 * trained on (vLLM's tool_parsers): Hermes / Qwen2.5 `<tool_call>{json}</tool_call>`,
 * Llama 3 JSON (`<|python_tag|>` or a leading `{"name": …, "parameters": …}`,
 * several separated by ';'), Mistral `[TOOL_CALLS][{…}, …]`. A malformed
 * call leaves the whole text as content, as vLLM does. Pure (ids are random).
 */

export const TOOL_PARSERS = ["hermes", "llama3_json", "mistral"] as const;
export type ToolParserName = (typeof TOOL_PARSERS)[number];

export interface ParsedCall {
  readonly id: string;
  readonly name: string;
  /** JSON text of the arguments object. */
  readonly arguments: string;
}

export interface ParsedOutput {
  /** Text beside the calls (null when there is none). */
  readonly content: string | null;
  readonly calls: readonly ParsedCall[];
}

/** vLLM's ids: "chatcmpl-tool-<hex>", and 9 alphanumerics for Mistral (its template checks the length). */
export function toolCallId(parser: ToolParserName | null): string {
  if (parser !== "mistral") return `chatcmpl-tool-${randomUUID().replaceAll("-", "")}`;
  const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  return [...randomBytes(9)].map((b) => alphabet[b % alphabet.length]).join("");
}

/** Where a tool call starts in the text (-1: none yet), to hold streamed content back from there. */
export function callStart(parser: ToolParserName, text: string): number {
  switch (parser) {
    case "hermes":
      return text.indexOf("<tool_call>");
    case "mistral":
      return text.indexOf("[TOOL_CALLS]");
    case "llama3_json": {
      const t = text.trimStart();
      return t.startsWith("<|python_tag|>") || t.startsWith("{") ? text.length - t.length : -1;
    }
  }
}

/** Characters at the end of `text` that could still begin a call marker (held back while streaming). */
export function markerPrefix(parser: ToolParserName, text: string): number {
  const markers =
    parser === "hermes" ? ["<tool_call>"] : parser === "mistral" ? ["[TOOL_CALLS]"] : ["<|python_tag|>", "{"];
  let best = 0;
  for (const m of markers)
    for (let k = Math.min(m.length - 1, text.length); k > best; k--)
      if (text.endsWith(m.slice(0, k)) && (parser !== "llama3_json" || text.slice(0, -k).trim() === "")) {
        best = k;
        break;
      }
  return best;
}

const asCall = (parser: ToolParserName, o: unknown): ParsedCall | null => {
  if (typeof o !== "object" || o === null || Array.isArray(o)) return null;
  const r = o as Record<string, unknown>;
  const args = r.arguments ?? r.parameters ?? {};
  if (typeof r.name !== "string" || r.name === "") return null;
  const text = typeof args === "string" ? args : JSON.stringify(args);
  return { id: toolCallId(parser), name: r.name, arguments: text };
};

function jsonPrefix(s: string): [unknown, number] | null {
  // The longest prefix of s that is one JSON value: scan bracket depth outside strings.
  let depth = 0;
  let inString = false;
  let escaped = false;
  const start = s.search(/\S/);
  if (start < 0 || (s[start] !== "{" && s[start] !== "[")) return null;
  for (let i = start; i < s.length; i++) {
    const c = s[i]!;
    if (inString) {
      if (escaped) escaped = false;
      else if (c === "\\") escaped = true;
      else if (c === '"') inString = false;
      continue;
    }
    if (c === '"') inString = true;
    else if (c === "{" || c === "[") depth++;
    else if (c === "}" || c === "]") {
      depth--;
      if (depth === 0) {
        try {
          return [JSON.parse(s.slice(start, i + 1)), i + 1];
        } catch {
          return null;
        }
      }
    }
  }
  return null;
}

export function parseToolCalls(parser: ToolParserName, text: string): ParsedOutput {
  const none = { content: text, calls: [] };
  const at = callStart(parser, text);
  if (at < 0) return none;
  const before = text.slice(0, at);
  const content = before.trim() === "" ? null : before;
  const calls: ParsedCall[] = [];
  switch (parser) {
    case "hermes": {
      const re = /<tool_call>([\s\S]*?)<\/tool_call>|<tool_call>([\s\S]*)$/g;
      for (const m of text.slice(at).matchAll(re)) {
        let obj: unknown;
        try {
          obj = JSON.parse((m[1] ?? m[2] ?? "").trim());
        } catch {
          return none;
        }
        const c = asCall(parser, obj);
        if (!c) return none;
        calls.push(c);
      }
      break;
    }
    case "mistral": {
      const parsed = jsonPrefix(text.slice(at + "[TOOL_CALLS]".length));
      const list = parsed?.[0];
      for (const o of Array.isArray(list) ? list : list === undefined ? [] : [list]) {
        const c = asCall(parser, o);
        if (!c) return none;
        calls.push(c);
      }
      if (calls.length === 0) return none;
      break;
    }
    case "llama3_json": {
      let rest = text.slice(at).replace(/^<\|python_tag\|>/, "");
      while (rest.trim() !== "") {
        const parsed = jsonPrefix(rest);
        if (!parsed) return none;
        const c = asCall(parser, parsed[0]);
        if (!c) return none;
        calls.push(c);
        rest = rest.slice(parsed[1]).replace(/^\s*;/, "");
      }
      break;
    }
  }
  return calls.length === 0 ? none : { content, calls };
}

/**
 * The parser a model's template implies: the markup its template writes for
 * an assistant's tool calls (configurable with model.toolCallParser).
 */
export function parserForTemplate(template: string | undefined): ToolParserName | null {
  if (template === undefined) return null;
  if (template.includes("<tool_call>")) return "hermes";
  if (template.includes("[TOOL_CALLS]")) return "mistral";
  if (
    template.includes("<|python_tag|>") ||
    (template.includes("<|start_header_id|>") && template.includes('"parameters"'))
  )
    return "llama3_json";
  return null;
}
