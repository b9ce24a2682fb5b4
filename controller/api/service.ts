import type { ConstraintSpec } from "../../schema/constraint.ts";
import type { WorkerStatus } from "../../schema/control.ts";
import type { RequestId, TenantId } from "../../schema/ids.ts";
import type { ToolParserName } from "./tool-parsers.ts";

/**
 * What the HTTP front door needs from the rest of the system. The embedded
 * default implements it with in-process workers; a fleet controller with the
 * router and WebSocket-connected workers. The front door tokenizes, applies
 * stop strings and formats responses; the service schedules and generates.
 */

/** A tool call as OpenAI's API carries it (arguments: a JSON string). */
export interface ToolCall {
  readonly id: string;
  readonly type: "function";
  readonly function: { readonly name: string; readonly arguments: string };
}

export interface ChatMessage {
  readonly role: "system" | "developer" | "user" | "assistant" | "tool";
  /** Text parts joined by "\n", as vLLM joins them; null: an assistant turn of tool calls only. */
  readonly content: string | null;
  readonly toolCalls?: readonly ToolCall[];
  /** A tool message's answer to this call. */
  readonly toolCallId?: string;
  readonly name?: string;
}

/** Everything a chat template renders from (vLLM's ChatParams). */
export interface ChatPromptRequest {
  readonly messages: readonly ChatMessage[];
  /** OpenAI tool definitions ({type: "function", function: {...}}), as given; null: none. */
  readonly tools: readonly unknown[] | null;
  /** RAG documents for templates that read them; null: none. */
  readonly documents: readonly unknown[] | null;
  readonly addGenerationPrompt: boolean;
  readonly continueFinalMessage: boolean;
  /** The request's own chat_template; null: the model's (or the configured one). */
  readonly template: string | null;
  /** chat_template_kwargs. */
  readonly kwargs: Readonly<Record<string, unknown>>;
}

/** Tokenizer and chat template of one served model. */
export interface EncodeOptions {
  /** The tokenizer's post-processor adds what it adds (a BOS); default false. */
  readonly addSpecialTokens?: boolean;
}

export interface TextCodec {
  encode(text: string, opts?: EncodeOptions): number[];
  /** skipSpecialTokens defaults to true. */
  decode(ids: readonly number[], opts?: { readonly skipSpecialTokens?: boolean }): string;
  /** The vocabulary's string for an id (e.g. "Ġthe"), as convert_ids_to_tokens gives it. */
  tokenString(id: number): string;
  /** The bytes an id adds to the output (a partial UTF-8 sequence included); null: a special token. */
  tokenBytes(id: number): Uint8Array | null;
  /**
   * Compiles an output constraint (throws an ApiError 400 naming what it
   * cannot enforce) and returns the fewest tokens its shortest output needs.
   */
  checkConstraint(spec: ConstraintSpec): number;
  /**
   * The conversation rendered by the chat template (no tokenization).
   * Throws an ApiError (400) when there is no template or it fails.
   */
  renderChat(req: ChatPromptRequest): string;
  readonly eosTokenIds: readonly number[];
  readonly vocabSize: number;
  /** How tool calls are read out of this model's text (tool_choice "auto"); null: no parser. */
  readonly toolParser: ToolParserName | null;
}

export interface ModelInfo {
  readonly id: string;
  readonly created: number;
  /** Prompt plus generated tokens may not exceed this. */
  readonly maxContext: number;
  readonly codec: TextCodec;
}

export interface SamplingParams {
  /** 0 means greedy. */
  readonly temperature: number;
  readonly topP: number;
  /** 0 means no top-k cut. */
  readonly topK: number;
  /** 0 means no min-p cut. */
  readonly minP: number;
  /** Seed of this choice's private PRNG; absent → a fresh one. */
  readonly seed: number | undefined;
  /** 1 means off; over prompt and generated ids. */
  readonly repetitionPenalty: number;
  /** 0 means off; over generated ids. */
  readonly presencePenalty: number;
  readonly frequencyPenalty: number;
  /** [token id, bias] pairs added to the logits. */
  readonly logitBias: readonly (readonly [number, number])[];
  /** Stop ids (EOS included) cannot be sampled before this many tokens. */
  readonly minTokens: number;
  /** Only these ids may be sampled; null: any. */
  readonly allowedTokenIds: readonly number[] | null;
}

export interface GenerationRequest {
  readonly requestId: RequestId;
  readonly tenant: TenantId;
  readonly model: string;
  readonly prompt: readonly number[];
  readonly maxTokens: number;
  readonly sampling: SamplingParams;
  /** Generation ends (reason "stop") after emitting any of these ids. */
  readonly stopTokenIds: readonly number[];
  /** The request's cache_salt (vLLM): with the tenant it salts the prefix chain; null: the tenant's alone. */
  readonly cacheSalt: string | null;
  /** Larger is served first (vLLM's priority negated); 0 by default. */
  readonly priority: number;
  /** Log-probabilities of each generated token with this many alternatives; null: none. */
  readonly logprobs: number | null;
  /**
   * Score the prompt: log-probabilities of each prompt token after the
   * first, with this many alternatives; null: none. The prompt is then
   * computed whole (no cached prefix holds its logits).
   */
  readonly promptLogprobs: number | null;
  /** The grammar the output follows (structured output, required tool calls); null: free. */
  readonly constraint: ConstraintSpec | null;
}

export type FinishReason = "length" | "stop" | "cancelled";

/** One position's log-probabilities: the token's, and the most likely ids' (rank order). */
export interface TokenLogprob {
  readonly token: number;
  readonly logprob: number;
  /** 1 + the number of ids strictly more likely. */
  readonly rank: number;
  readonly top: readonly (readonly [token: number, logprob: number])[];
}

export type GenerationEvent =
  | {
      readonly type: "token";
      readonly token: number;
      /** When the request asked for log-probabilities. */
      readonly logprob?: TokenLogprob | null;
      /** On the first token of a request that scores its prompt: prompt positions 1, 2, … */
      readonly promptLogprobs?: readonly TokenLogprob[];
    }
  | { readonly type: "end"; readonly reason: FinishReason; readonly cachedTokens: number }
  | {
      readonly type: "error";
      readonly message: string;
      /**
       * Whose failure: "unavailable" when the serving fleet lost or could not
       * find a worker (503, retry), "deadline" when the request ran out of time
       * (504); absent, an internal error (500).
       */
      readonly failure?: GenerationFailure;
    };

export type GenerationFailure = "unavailable" | "deadline";

export interface Generation {
  readonly events: AsyncIterable<GenerationEvent>;
  /** Stops generation; the events end with reason "cancelled" (or earlier). */
  cancel(): void;
}

export interface ServiceGauges {
  readonly pagesFree: number;
  readonly pagesTotal: number;
  readonly queueDepth: number;
  readonly catalogLag: number;
  /** Prompt tokens served from each source since start: resident, ram, ssd, peer, s3, recompute. */
  readonly cacheTokensBySource: Readonly<Record<string, number>>;
}

/** One worker as the controller sees it, for operators (GET /workers). */
export interface FleetWorkerView {
  readonly workerId: string;
  /** A heartbeat within the TTL. */
  readonly live: boolean;
  /** Its newest heartbeat says it is warm (offers go only to ready workers); null: none held. */
  readonly ready: boolean | null;
  /** Milliseconds since its newest heartbeat (null: none held, the connection closed or expired). */
  readonly heartbeatAgeMs: number | null;
  readonly freePages: number | null;
  readonly evictablePages: number | null;
  readonly queuedRequests: number | null;
  readonly runningRequests: number | null;
  /** The worker's own status from its newest heartbeat (null: none reported). */
  readonly status: WorkerStatus | null;
}

export interface InferenceService {
  models(): readonly ModelInfo[];
  /** Admits one choice. Throws ApiError when it cannot be admitted (nothing is queued then). */
  generate(req: GenerationRequest): Generation;
  gauges(): ServiceGauges;
  /** Per worker, the newest heartbeat's figures; absent where the service has no workers (embedded). */
  workers?(): readonly FleetWorkerView[];
}

/**
 * The prefix-chain salt of a request: the tenant's (none for the default
 * tenant) and the request's cache_salt, so prefixes are shared only within
 * one tenant and one salt. undefined: the unsalted chain.
 */
export function prefixSalt(tenant: string, cacheSalt: string | null): string | undefined {
  const base = tenant === "default" ? "" : tenant;
  if (cacheSalt === null) return base === "" ? undefined : base;
  // Length-prefixed so ("a", "bc") and ("ab", "c") differ.
  return `${base.length}:${base}|${cacheSalt}`;
}
