import type { WorkerStatus } from "../../schema/control.ts";
import type { RequestId, TenantId } from "../../schema/ids.ts";

/**
 * What the HTTP front door needs from the rest of the system. The embedded
 * default implements it with in-process workers; a fleet controller with the
 * router and WebSocket-connected workers. The front door tokenizes, applies
 * stop strings and formats responses; the service schedules and generates.
 */

export interface ChatMessage {
  readonly role: "system" | "user" | "assistant" | "tool";
  readonly content: string;
}

/** Tokenizer and chat template of one served model. */
export interface TextCodec {
  encode(text: string): number[];
  decode(ids: readonly number[]): string;
  /** Token ids of the chat-formatted conversation, ending where the assistant's reply begins. */
  chatPrompt(messages: readonly ChatMessage[]): number[];
  readonly eosTokenIds: readonly number[];
  readonly vocabSize: number;
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
  /** Seed of this choice's private PRNG; absent → a fresh one. */
  readonly seed: number | undefined;
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
}

export type FinishReason = "length" | "stop" | "cancelled";

export type GenerationEvent =
  | { readonly type: "token"; readonly token: number }
  | { readonly type: "end"; readonly reason: FinishReason; readonly cachedTokens: number }
  | { readonly type: "error"; readonly message: string };

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
