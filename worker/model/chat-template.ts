import { Template } from "@huggingface/jinja";

/**
 * Renders a model's Jinja chat template as transformers' apply_chat_template
 * does, with @huggingface/jinja (the renderer transformers.js uses):
 * `messages`, `tools`, `documents`, `add_generation_prompt`, the special
 * tokens (bos_token, eos_token, …) and the caller's chat_template_kwargs, with
 * the template's own helpers (raise_exception, strftime_now). With
 * continue_final_message the render is cut right after the final message's
 * content, so the model continues it (transformers' rule, whitespace
 * included).
 */
export class TemplateError extends Error {
  override readonly name = "TemplateError";
}

/** A message as templates read it (vLLM's ConversationMessage). */
export interface TemplateMessage {
  readonly role: string;
  readonly content: string;
  /** {id, type, function: {name, arguments}} with arguments as an object (vLLM parses the JSON). */
  readonly tool_calls?: readonly unknown[];
  readonly tool_call_id?: string;
  readonly name?: string;
}

export interface RenderInput {
  readonly messages: readonly TemplateMessage[];
  readonly tools: readonly unknown[] | null;
  readonly documents: readonly unknown[] | null;
  readonly addGenerationPrompt: boolean;
  readonly continueFinalMessage: boolean;
  /** chat_template_kwargs: more variables the template may read. */
  readonly kwargs: Readonly<Record<string, unknown>>;
}

/** Names the renderer sets itself; chat_template_kwargs may not replace them. */
export const RESERVED_TEMPLATE_VARIABLES = [
  "messages",
  "tools",
  "documents",
  "add_generation_prompt",
  "chat_template",
  "tokenize",
] as const;

/** A parsed template. Parsing is the expensive part; a model's own template is parsed once. */
export class ChatTemplate {
  private readonly template: Template;

  constructor(readonly source: string) {
    try {
      this.template = new Template(source);
    } catch (err) {
      throw new TemplateError(`the chat template does not parse: ${(err as Error).message}`);
    }
  }

  render(input: RenderInput, specialTokens: Readonly<Record<string, string>>): string {
    for (const k of RESERVED_TEMPLATE_VARIABLES)
      if (k in input.kwargs) throw new TemplateError(`chat_template_kwargs may not set '${k}'`);
    if (input.continueFinalMessage && input.addGenerationPrompt)
      throw new TemplateError("continue_final_message and add_generation_prompt cannot both be true");
    const context: Record<string, unknown> = {
      ...specialTokens,
      ...input.kwargs,
      messages: input.messages,
      add_generation_prompt: input.addGenerationPrompt,
    };
    if (input.tools !== null) context.tools = input.tools;
    if (input.documents !== null) context.documents = input.documents;
    let rendered: string;
    try {
      rendered = this.template.render(context);
    } catch (err) {
      throw new TemplateError(`the chat template failed: ${(err as Error).message}`);
    }
    return input.continueFinalMessage ? cutAfterFinal(rendered, input.messages) : rendered;
  }
}

/**
 * transformers' continue_final_message: the rendered chat up to the final
 * message's content, keeping its trailing whitespace when the template kept it.
 */
function cutAfterFinal(rendered: string, messages: readonly TemplateMessage[]): string {
  const last = messages[messages.length - 1];
  if (!last) throw new TemplateError("continue_final_message needs a final message");
  const final = last.content;
  const stripped = final.trim();
  const at = rendered.lastIndexOf(stripped);
  if (at < 0)
    throw new TemplateError(
      "continue_final_message is set but the final message does not appear in the chat after applying the chat template",
    );
  const keep = final.trimStart().length;
  return rendered.slice(at, at + keep) === final
    ? rendered.slice(0, at + keep)
    : rendered.slice(0, at + stripped.length);
}
