import { readFile } from "node:fs/promises";
import { ApiError, badRequest } from "../../controller/api/errors.ts";
import type { ChatMessage, ChatPromptRequest, TextCodec } from "../../controller/api/service.ts";
import { parserForTemplate } from "../../controller/api/tool-parsers.ts";
import type { Config } from "../../schema/config.ts";
import type { ConstraintSpec } from "../../schema/constraint.ts";
import { ChatTemplate, TemplateError, type TemplateMessage } from "../../worker/model/chat-template.ts";
import type { ModelIdentity } from "../../worker/model/model-dir.ts";
import { ConstraintCompiler } from "../../worker/structured/constraint.ts";
import { GrammarError } from "../../worker/structured/nfa.ts";
import { encodeText } from "./codec.ts";

/**
 * The front door's view of a loaded model: its tokenizer and its chat
 * template, rendered as vLLM renders it (worker/model/chat-template.ts).
 * Template choice: the request's chat_template, else the configured one
 * (model.chatTemplate), else the model's ("tool_use" when the request has
 * tools and the model names one, else "default"); none → 400, as vLLM.
 */
export function textCodec(
  model: ModelIdentity,
  configuredTemplate?: string,
  /** Compiles output constraints against this model's vocabulary (shared with the runtime's requests). */
  constraints: ConstraintCompiler = new ConstraintCompiler(model.tokenizer.tokenBytes()),
  /** model.toolCallParser: "auto" reads the template's tool-call markup. */
  toolCallParser: Config["model"]["toolCallParser"] = "auto",
): TextCodec {
  const tok = model.tokenizer;
  const parsed = new Map<string, ChatTemplate>();
  const named = (name: string): ChatTemplate | null => {
    const source = name === "configured" ? configuredTemplate : tok.chatTemplates.get(name);
    if (source === undefined) return null;
    let t = parsed.get(name);
    if (!t) {
      t = new ChatTemplate(source);
      parsed.set(name, t);
    }
    return t;
  };
  const choose = (req: ChatPromptRequest): ChatTemplate => {
    if (req.template !== null) return new ChatTemplate(req.template);
    const t =
      named("configured") ??
      (req.tools !== null && tok.chatTemplates.has("tool_use") ? named("tool_use") : null) ??
      named("default") ??
      (tok.chatTemplates.size === 1 ? named([...tok.chatTemplates.keys()][0]!) : null);
    if (!t)
      throw badRequest(
        "this model has no chat template: pass 'chat_template' in the request or configure model.chatTemplate " +
          "(as of transformers v4.44 no default template is assumed)",
        "chat_template",
      );
    return t;
  };
  let bytesOf: readonly (Uint8Array | null)[] | null = null;
  return {
    encode: (text, opts) => encodeText(tok, text, opts),
    decode: (ids, opts) => tok.decode(ids, { skipSpecialTokens: opts?.skipSpecialTokens ?? true }),
    tokenString: (id) => tok.idToToken(id) ?? "",
    tokenBytes(id) {
      // The whole table once, on first use (only chat logprobs read it).
      bytesOf ??= tok.tokenBytes();
      return bytesOf[id] ?? null;
    },
    renderChat(req) {
      try {
        return choose(req).render(
          {
            messages: req.messages.map(templateMessage),
            tools: req.tools,
            documents: req.documents,
            addGenerationPrompt: req.addGenerationPrompt,
            continueFinalMessage: req.continueFinalMessage,
            kwargs: req.kwargs,
          },
          tok.specialTokens,
        );
      } catch (err) {
        if (err instanceof TemplateError)
          throw new ApiError(400, err.message, "invalid_request_error", "messages");
        throw err;
      }
    },
    checkConstraint(spec) {
      try {
        const m = constraints.machine(spec);
        return m.dfa.minDist(m.start);
      } catch (err) {
        if (err instanceof GrammarError)
          throw new ApiError(400, err.message, "invalid_request_error", constraintParam(spec));
        throw err;
      }
    },
    eosTokenIds: model.eosTokenIds,
    vocabSize: model.config.spec.vocab,
    toolParser:
      toolCallParser === "none"
        ? null
        : toolCallParser === "auto"
          ? parserForTemplate(
              configuredTemplate ?? tok.chatTemplates.get("tool_use") ?? tok.chatTemplates.get("default"),
            )
          : toolCallParser,
  };
}

const constraintParam = (spec: ConstraintSpec) =>
  spec.kind === "json_schema" || spec.kind === "json_object" ? "response_format" : "structured_outputs";

/**
 * A message as templates read it (vLLM's conversation): content null → "";
 * tool call arguments parsed from JSON into objects ("" → {}), as
 * transformers' tool templates expect; "developer" (OpenAI's newer name for
 * the system role) is shown to the template as "system", which every
 * template knows.
 */
function templateMessage(m: ChatMessage): TemplateMessage {
  const out: {
    role: string;
    content: string;
    tool_calls?: unknown[];
    tool_call_id?: string;
    name?: string;
  } = { role: m.role === "developer" ? "system" : m.role, content: m.content ?? "" };
  if (m.toolCalls)
    out.tool_calls = m.toolCalls.map((c) => ({
      id: c.id,
      type: c.type,
      function: {
        name: c.function.name,
        arguments: c.function.arguments === "" ? {} : JSON.parse(c.function.arguments),
      },
    }));
  if (m.toolCallId !== undefined) out.tool_call_id = m.toolCallId;
  if (m.name !== undefined) out.name = m.name;
  return out;
}

/** model.chatTemplate: a Jinja file replacing the model's own template; undefined when unset. */
export async function configuredChatTemplate(config: Config): Promise<string | undefined> {
  const path = config.model.chatTemplate;
  if (path === "") return undefined;
  let source: string;
  try {
    source = await readFile(path, "utf8");
  } catch (err) {
    throw new Error(`model.chatTemplate: cannot read ${path}: ${(err as Error).message}`);
  }
  // Parse now so a broken file stops start-up instead of failing every chat request.
  new ChatTemplate(source);
  return source;
}
