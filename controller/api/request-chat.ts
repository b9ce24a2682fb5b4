import { badRequest } from "./errors.ts";
import { describeValue } from "./limits.ts";
import { type Body, optBool, optObject, optString } from "./request-fields.ts";
import type { ChatMessage, ChatPromptRequest, ToolCall } from "./service.ts";

/**
 * The chat-specific fields: messages (vLLM's parse_chat_messages: text parts
 * joined by "\n", an assistant's tool_calls with content null, a tool's
 * tool_call_id) and the template's inputs (chat_template, chat_template_kwargs,
 * add_generation_prompt, continue_final_message, documents). Pure.
 */

export const MAX_TEMPLATE_CHARS = 256 * 1024;
export const MAX_TOOL_CALLS = 128;

const ROLES = new Set(["system", "developer", "user", "assistant", "tool"]);

export interface ChatFields {
  readonly prompt: ChatPromptRequest;
  /** return_prompt_text: the rendered prompt in the response (vLLM). */
  readonly returnPromptText: boolean;
  /** The chat add_special_tokens default is false: the template adds what it needs. */
  readonly addSpecialTokens: boolean;
}

function messageText(content: unknown, at: string): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    const parts: string[] = [];
    for (const [k, part] of content.entries()) {
      const p = part as Body | null;
      const type = typeof p === "object" && p !== null ? p.type : undefined;
      // vLLM treats refusal parts as text.
      const text = type === "text" ? p!.text : type === "refusal" ? p!.refusal : undefined;
      if (type !== "text" && type !== "refusal")
        throw badRequest(
          `${at}.content[${k}]: only text parts are supported, got ${describeValue(type ?? null)}`,
          `${at}.content`,
        );
      if (typeof text !== "string")
        throw badRequest(`${at}.content[${k}]: a ${type} part needs '${type}'`, `${at}.content`);
      parts.push(text);
    }
    return parts.join("\n");
  }
  throw badRequest(`${at}.content must be a string or a list of text parts`, `${at}.content`);
}

function toolCalls(v: unknown, at: string): ToolCall[] {
  if (!Array.isArray(v)) throw badRequest(`${at}.tool_calls must be a list`, `${at}.tool_calls`);
  if (v.length > MAX_TOOL_CALLS)
    throw badRequest(`${at}.tool_calls takes at most ${MAX_TOOL_CALLS} calls`, `${at}.tool_calls`);
  return v.map((c, k) => {
    const call = c as Body | null;
    const fn = (call?.function ?? null) as Body | null;
    const where = `${at}.tool_calls[${k}]`;
    if (typeof call !== "object" || call === null || typeof fn !== "object" || fn === null)
      throw badRequest(`${where} must be {id, type: "function", function: {name, arguments}}`, where);
    if (call.type !== undefined && call.type !== "function")
      throw badRequest(`${where}.type must be "function"`, where);
    if (typeof fn.name !== "string" || fn.name === "")
      throw badRequest(`${where}.function.name must be a string`, where);
    const args = fn.arguments ?? "";
    if (typeof args !== "string")
      throw badRequest(`${where}.function.arguments must be a JSON string`, where);
    if (args !== "") {
      try {
        JSON.parse(args);
      } catch {
        throw badRequest(`${where}.function.arguments is not JSON`, where);
      }
    }
    const id = call.id ?? "";
    if (typeof id !== "string") throw badRequest(`${where}.id must be a string`, where);
    return { id, type: "function" as const, function: { name: fn.name, arguments: args } };
  });
}

export function parseMessages(raw: unknown): ChatMessage[] {
  if (!Array.isArray(raw) || raw.length === 0)
    throw badRequest("'messages' must be a non-empty list", "messages");
  return raw.map((m, i) => {
    const at = `messages[${i}]`;
    if (typeof m !== "object" || m === null || Array.isArray(m))
      throw badRequest(`${at} must be an object`, at);
    const msg = m as Body;
    const role = msg.role;
    if (typeof role !== "string" || !ROLES.has(role))
      throw badRequest(`${at}.role must be one of system, developer, user, assistant, tool`, `${at}.role`);
    const calls = role === "assistant" && msg.tool_calls !== undefined && msg.tool_calls !== null;
    let content: string | null;
    if (msg.content === undefined || msg.content === null) {
      if (role !== "assistant")
        throw badRequest(`${at}.content is required for role ${role}`, `${at}.content`);
      content = null;
    } else content = messageText(msg.content, at);
    const out: {
      role: ChatMessage["role"];
      content: string | null;
      toolCalls?: ToolCall[];
      toolCallId?: string;
      name?: string;
    } = { role: role as ChatMessage["role"], content };
    if (calls) out.toolCalls = toolCalls(msg.tool_calls, at);
    if (role === "tool") {
      const id = optString(msg, "tool_call_id", 256, `${at}.tool_call_id`);
      if (id !== undefined) out.toolCallId = id;
    }
    const name = optString(msg, "name", 256, `${at}.name`);
    if (name !== undefined) out.name = name;
    return out;
  });
}

function documents(b: Body): unknown[] | null {
  const v = b.documents;
  if (v === undefined || v === null) return null;
  if (!Array.isArray(v) || v.some((d) => typeof d !== "object" || d === null || Array.isArray(d)))
    throw badRequest("'documents' must be a list of objects (e.g. {title, text})", "documents");
  return v;
}

export function parseChatFields(b: Body, tools: readonly unknown[] | null): ChatFields {
  const continueFinalMessage = optBool(b, "continue_final_message") ?? false;
  const given = optBool(b, "add_generation_prompt");
  if (continueFinalMessage && given === true)
    throw badRequest(
      "cannot set both 'continue_final_message' and 'add_generation_prompt' to true",
      "continue_final_message",
    );
  const messages = parseMessages(b.messages);
  if (continueFinalMessage && messages[messages.length - 1]!.content === null)
    throw badRequest("continue_final_message needs a final message with content", "continue_final_message");
  const template = optString(b, "chat_template", MAX_TEMPLATE_CHARS) ?? null;
  if (template === "") throw badRequest("'chat_template' must not be empty", "chat_template");
  return {
    prompt: {
      messages,
      tools,
      documents: documents(b),
      // vLLM's default is true; continuing the final message implies false.
      addGenerationPrompt: given ?? !continueFinalMessage,
      continueFinalMessage,
      template,
      kwargs: optObject(b, "chat_template_kwargs") ?? {},
    },
    returnPromptText: optBool(b, "return_prompt_text") ?? false,
    addSpecialTokens: optBool(b, "add_special_tokens") ?? false,
  };
}
