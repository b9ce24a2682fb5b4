import { badRequest } from "./errors.ts";

/**
 * Length limits of one request, checked on the parsed JSON before anything
 * is tokenized or rendered, so an oversized input costs a few linear scans
 * and a 400 naming its limit, never seconds of tokenizing. Each limit is a
 * config key (schema/config.ts `controller.limits`); the messages name it so
 * a client (or operator) knows which one to change.
 */
export interface RequestLimits {
  /** Largest request body (bytes); more is answered 413 before it is read. */
  readonly maxBodyBytes: number;
  /** UTF-8 bytes of all prompt text of one request (completion prompts, chat message contents). */
  readonly maxPromptBytes: number;
  /** Chat messages in one request. */
  readonly maxMessages: number;
}

export const defaultRequestLimits: RequestLimits = {
  maxBodyBytes: 8 * 1024 * 1024,
  maxPromptBytes: 4 * 1024 * 1024,
  maxMessages: 4096,
};

/** Longest excerpt of a client's string echoed in an error message. */
const ECHO_CHARS = 48;

/**
 * A short description of a client's value for an error message: a
 * primitive as JSON (strings cut), a container by its kind only. Bounded in
 * time and length whatever the value (a value nested a million deep
 * describes as "an array").
 */
export function describeValue(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return `an array of ${v.length}`;
  switch (typeof v) {
    case "string":
      return v.length > ECHO_CHARS
        ? `${JSON.stringify(v.slice(0, ECHO_CHARS))}… (${v.length} chars)`
        : JSON.stringify(v);
    case "number":
    case "boolean":
      return String(v);
    case "object":
      return "an object";
    default:
      return typeof v;
  }
}

/**
 * Checks the raw body's counts that parsing would walk: the chat message
 * count. Runs before the request parser, so 120,000 messages cost one length
 * read, not a parse.
 */
export function checkRawLimits(body: unknown, limits: RequestLimits): void {
  if (typeof body !== "object" || body === null) return;
  const messages = (body as { messages?: unknown }).messages;
  if (Array.isArray(messages) && messages.length > limits.maxMessages)
    throw badRequest(
      `${messages.length} messages is over the limit of ${limits.maxMessages} (controller.limits.maxMessages)`,
      "messages",
      "too_many_messages",
    );
}

/** Prompt text of a parsed request: completion prompts, or chat message contents. */
export type PromptTexts =
  | {
      readonly kind: "completion";
      readonly prompts: readonly ({ kind: "text"; text: string } | { kind: "tokens" })[];
    }
  | { readonly kind: "chat"; readonly messages: readonly { readonly content: string | null }[] };

/** Total UTF-8 bytes of a request's prompt text (token-id prompts count 0). */
export function promptBytes(r: PromptTexts): number {
  let n = 0;
  if (r.kind === "chat") for (const m of r.messages) n += Buffer.byteLength(m.content ?? "", "utf8");
  else for (const p of r.prompts) if (p.kind === "text") n += Buffer.byteLength(p.text, "utf8");
  return n;
}

/** Refuses prompt text over maxPromptBytes, before any tokenizing. */
export function checkPromptLimits(r: PromptTexts, limits: RequestLimits): number {
  const bytes = promptBytes(r);
  if (bytes > limits.maxPromptBytes)
    throw badRequest(
      `the prompt text is ${bytes} bytes, over the limit of ${limits.maxPromptBytes} (controller.limits.maxPromptBytes)`,
      r.kind === "chat" ? "messages" : "prompt",
      "prompt_too_large",
    );
  return bytes;
}

/** Refuses one text (POST /tokenize's prompt or rendered chat) over maxPromptBytes. */
export function checkTextLimit(text: string, limits: RequestLimits): void {
  const bytes = Buffer.byteLength(text, "utf8");
  if (bytes > limits.maxPromptBytes)
    throw badRequest(
      `the text is ${bytes} bytes, over the limit of ${limits.maxPromptBytes} (controller.limits.maxPromptBytes)`,
      "prompt",
      "prompt_too_large",
    );
}
