import { Schema } from "effect";
import {
  InvalidIdError,
  type ModelFingerprint,
  ModelFingerprint as makeFingerprint,
  NodeId,
  type PageCount,
  RequestId,
  type TokenCount,
  WorkerId,
} from "./ids.ts";
import { defineMessage, MAX_MESSAGE_BYTES, type MessageKind, MessageRegistry } from "./wire.ts";

/**
 * The control plane between workers and the controller (a WebSocket per
 * worker): heartbeats, the fenced assignment lifecycle (offer → accept |
 * decline, tokens, result, cancel) and the routing decision record.
 *
 * Fencing: every assignment message carries `(requestId, attempt)`. Attempts
 * of one request strictly increase (1, 2, …); a receiver ignores any message
 * whose attempt is not the one it currently holds for that request.
 *
 * Heartbeats are connection-scoped observations, versioned by
 * `(epoch, sequence)`: `epoch` bumps each time the worker process starts,
 * `sequence` each time it sends. They are never catalog facts.
 */

// ---------------------------------------------------------------- field schemas

function guard<T>(make: (u: never) => T): (u: unknown) => u is T {
  return (u: unknown): u is T => {
    try {
      make(u as never);
      return true;
    } catch (err) {
      if (err instanceof InvalidIdError) return false;
      throw err;
    }
  };
}

const WorkerIdField = Schema.declare(guard(WorkerId), { expected: "a worker id (1-128 printable ASCII)" });
const RequestIdField = Schema.declare(guard(RequestId), {
  expected: "a request id (1-128 printable ASCII)",
});
const NodeIdField = Schema.declare(guard(NodeId), { expected: "a node id (64 lowercase hex digits)" });
const FingerprintField = Schema.declare(guard<ModelFingerprint>(makeFingerprint), {
  expected: "a model fingerprint (64 lowercase hex digits)",
});
const isCount = (u: unknown): boolean => typeof u === "number" && Number.isSafeInteger(u) && u >= 0;
const TokenCountField = Schema.declare((u: unknown): u is TokenCount => isCount(u), {
  expected: "a token count (non-negative integer)",
});
const PageCountField = Schema.declare((u: unknown): u is PageCount => isCount(u), {
  expected: "a page count (non-negative integer)",
});
const Count = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0));
/** Attempts start at 1; 0 never names an assignment. */
const Attempt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1));
/** A duration or cost in milliseconds (finite, non-negative). */
const Ms = Schema.Finite.check(Schema.isGreaterThanOrEqualTo(0));
const TokenId = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0), Schema.isLessThanOrEqualTo(0xffffffff));

/** Bounds on list fields, so one frame cannot carry an unbounded list. */
export const MAX_RESIDENT_PREFIXES = 4096;
export const MAX_PROMPT_TOKENS = 1 << 20;
export const MAX_TOKENS_PER_FRAME = 4096;
export const MAX_DECISION_CANDIDATES = 1024;

// ---------------------------------------------------------------- vocabulary

/** Durable tiers a worker's chunk store holds (S3 is shared by the fleet). */
export const StoreTiers = ["ram", "ssd", "s3"] as const;
export type StoreTier = (typeof StoreTiers)[number];

/** Where restored bytes come from, seen from one worker: its own RAM/SSD, another worker's (peer), or S3. */
export const RestoreTiers = ["ram", "ssd", "peer", "s3"] as const;
export type RestoreTier = (typeof RestoreTiers)[number];

/** A candidate's source of cached attention state; `recompute` caches nothing. */
export const CandidateSources = ["resident", "ram", "ssd", "peer", "s3", "recompute"] as const;
export type CandidateSource = (typeof CandidateSources)[number];

/** Why a worker refused an offer after re-running admission against its real state. */
export const DeclineReasons = [
  "wrong_model",
  "context_too_long",
  "pages_short",
  "stale_attempt",
  "draining",
] as const;
export type DeclineReason = (typeof DeclineReasons)[number];

/** Why the router dropped a candidate before ranking (hard constraints). */
export const DropReasons = [
  "offline",
  "wrong_model",
  "context_too_long",
  "pages_short",
  "stale_resident",
  "already_tried",
  "overloaded",
  "warming",
] as const;
export type DropReason = (typeof DropReasons)[number];

// ---------------------------------------------------------------- heartbeat

const ResidentPrefix = Schema.Struct({
  /** Catalog node id of the last chunk of a resident prefix (a prefix boundary). */
  nodeId: NodeIdField,
  /** Tokens from the start of the sequence through that chunk. */
  tokens: TokenCountField,
});

const RestoreMsPerMiB = Schema.Struct({ ram: Ms, ssd: Ms, peer: Ms, s3: Ms });

/**
 * Smoothed measured costs (configured values until the first sample; `samples`
 * lets policy tell a first sample from an established estimate). Accelerator
 * time is measured apart from queue delay, so queueing is counted once, from
 * `queue`.
 */
const CalibratedCosts = Schema.Struct({
  prefillPerTokenMs: Ms,
  firstTokenMs: Ms,
  /** Host → device copy of restored bytes. */
  uploadMsPerMiB: Ms,
  /** Fetch into host memory, by source tier. */
  restoreMsPerMiB: RestoreMsPerMiB,
  samples: Count,
});

/** Bound on the attempts one heartbeat reports the prefill progress of (the rest count as not started). */
export const MAX_PREFILLING_ATTEMPTS = 1024;

/** One accepted attempt whose first token is not out yet: the prompt tokens it still has to prefill. */
const PrefillProgress = Schema.Struct({
  requestId: RequestIdField,
  attempt: Attempt,
  remainingTokens: TokenCountField,
});
export type PrefillProgress = (typeof PrefillProgress)["Type"];

const QueueState = Schema.Struct({
  /** Prompt tokens admitted but not yet prefilled. */
  queuedTokens: TokenCountField,
  queuedRequests: Count,
  /** Requests decoding now. */
  runningRequests: Count,
  /**
   * The same tokens per attempt, so the router can join the worker's
   * progress to its own, fresher list of outstanding attempts: a heartbeat
   * sent before an attempt's first token still counts it, the controller's
   * list does not. Absent from workers built before the field.
   */
  prefilling: Schema.optional(
    Schema.Array(PrefillProgress).check(Schema.isMaxLength(MAX_PREFILLING_ATTEMPTS)),
  ),
  /**
   * How the worker batches prefill (its scheduler's budgets): each step
   * carries at most `stepTokens` rows, and a prompt's lane at most
   * `prefillTile` of them. A new prompt's rows share steps with the prompts
   * ahead of it rather than waiting for them; the router's queue term models
   * that (controller/router.ts). Absent from workers built before the field.
   */
  batching: Schema.optional(Schema.Struct({ stepTokens: TokenCountField, prefillTile: TokenCountField })),
});

const TierCounts = Schema.Struct({ ram: Count, ssd: Count, peer: Count, s3: Count });

/**
 * What a worker reports of itself for operators (`cluster status`, the
 * controller's GET /workers); routing never reads it. Counts are since the
 * worker process started.
 */
const WorkerStatus = Schema.Struct({
  totalPages: PageCountField,
  /** Pages holding attention state (running requests' and cached prefixes'): total − unallocated. */
  residentPages: PageCountField,
  /** Prompt tokens served from this worker's own resident pages (no transfer). */
  residentHitTokens: TokenCountField,
  /** Prompt tokens computed by prefill. */
  computedTokens: TokenCountField,
  /** Chunks restored into pages, by the tier they came from. */
  restoredChunks: TierCounts,
  /** Bytes restored into pages, by the tier they came from. */
  restoredBytes: TierCounts,
  /** Chunks this worker captured and published (each stored in its RAM/SSD and, with S3, uploaded). */
  publishedChunks: Count,
  /** Bytes of those chunks. */
  publishedBytes: Count,
  /** The worker's catalog replica: transactions applied, and how many the log holds beyond them. */
  catalogOffset: Count,
  catalogLag: Count,
  /**
   * Prefetch of placed chunks (worker/prefetch/): chunks pulled ahead of
   * demand, reads served from placed RAM copies, placements skipped (queue
   * or store full, no source). Absent where prefetch is off.
   */
  prefetch: Schema.optional(Schema.Struct({ chunks: Count, hits: Count, skipped: Count })),
});
export type WorkerStatus = (typeof WorkerStatus)["Type"];

const HeartbeatBody = Schema.Struct({
  workerId: WorkerIdField,
  epoch: Count,
  sequence: Count,
  modelFingerprint: FingerprintField,
  maxContext: TokenCountField,
  pageTokens: Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 1024 })),
  /** Bytes of attention state per token (all layers, K and V): converts chunk tokens to MiB. */
  kvBytesPerToken: Schema.Int.check(Schema.isGreaterThanOrEqualTo(1)),
  freePages: PageCountField,
  evictablePages: PageCountField,
  /** Every resident chunk boundary (prefix-closed: a listed boundary's ancestors are listed too). */
  residentPrefixes: Schema.Array(ResidentPrefix).check(Schema.isMaxLength(MAX_RESIDENT_PREFIXES)),
  durableTiers: Schema.Array(Schema.Literals(StoreTiers)).check(Schema.isMaxLength(StoreTiers.length)),
  queue: QueueState,
  costs: CalibratedCosts,
  /**
   * The worker is warm: model loaded, prepared catalog queries run once, store
   * tiers opened and probed, one warm-up step run through the engine, and its
   * catalog registration applied. The router offers nothing to a worker
   * that is not.
   */
  ready: Schema.Boolean,
  /** Absent from a worker that reports none (the field came later; routing never needs it). */
  status: Schema.optional(WorkerStatus),
});
export type Heartbeat = (typeof HeartbeatBody)["Type"];
export type CalibratedCosts = (typeof CalibratedCosts)["Type"];
export type QueueState = (typeof QueueState)["Type"];
export type ResidentPrefix = (typeof ResidentPrefix)["Type"];

// ---------------------------------------------------------------- assignment lifecycle

/** Bound on an offer's token-id lists (stop, allowed ids, logit bias entries); the front door's. */
export const MAX_OFFER_TOKEN_LIST = 4096;
/** Alternatives per position at most (top_logprobs); the front door's. */
export const MAX_TOP_LOGPROBS = 20;

const TokenList = Schema.Array(TokenId).check(Schema.isMaxLength(MAX_OFFER_TOKEN_LIST));

/**
 * Sampling of one choice. Fields after `stop` came with the request fields
 * of issue 17; absent means the neutral value (a controller sends them only
 * when a request sets them, so an offer without them is what older workers
 * were sent).
 */
const Sampling = Schema.Struct({
  temperature: Schema.optional(Schema.Finite.check(Schema.isGreaterThanOrEqualTo(0))),
  topP: Schema.optional(Schema.Finite.check(Schema.isBetween({ minimum: 0, maximum: 1 }))),
  topK: Schema.optional(Count),
  seed: Schema.optional(Schema.Int),
  stop: Schema.optional(Schema.Array(Schema.String).check(Schema.isMaxLength(16))),
  minP: Schema.optional(Schema.Finite.check(Schema.isBetween({ minimum: 0, maximum: 1 }))),
  repetitionPenalty: Schema.optional(Schema.Finite.check(Schema.isGreaterThan(0))),
  presencePenalty: Schema.optional(Schema.Finite),
  frequencyPenalty: Schema.optional(Schema.Finite),
  logitBias: Schema.optional(
    Schema.Array(Schema.Tuple([TokenId, Schema.Finite])).check(Schema.isMaxLength(MAX_OFFER_TOKEN_LIST)),
  ),
  minTokens: Schema.optional(Count),
  allowedTokenIds: Schema.optional(TokenList),
});

/** An output constraint as data (schema/constraint.ts); the worker compiles it for its vocabulary. */
const Constraint = Schema.Union([
  Schema.Struct({ kind: Schema.Literal("json_schema"), schema: Schema.Json }),
  Schema.Struct({ kind: Schema.Literal("json_object") }),
  Schema.Struct({ kind: Schema.Literal("regex"), pattern: Schema.String }),
  Schema.Struct({ kind: Schema.Literal("choice"), choices: Schema.Array(Schema.String) }),
]);

const TopLogprobs = Count.check(Schema.isLessThanOrEqualTo(MAX_TOP_LOGPROBS));

/** One position's log-probabilities (controller/api/service.ts TokenLogprob). */
const TokenLogprobField = Schema.Struct({
  token: TokenId,
  logprob: Schema.Finite,
  rank: Count,
  top: Schema.Array(Schema.Tuple([TokenId, Schema.Finite])).check(Schema.isMaxLength(MAX_TOP_LOGPROBS)),
});

/** What the router expected when it chose this worker; the worker plans its own restore. */
const OfferPlan = Schema.Struct({
  source: Schema.Literals(CandidateSources),
  cachedTokens: TokenCountField,
  predictedTtftMs: Ms,
});

const OfferBody = Schema.Struct({
  requestId: RequestIdField,
  attempt: Attempt,
  workerId: WorkerIdField,
  modelFingerprint: FingerprintField,
  /** Prompt token ids; the worker hashes its chain with `cacheSalt`. */
  prompt: Schema.Array(TokenId).check(Schema.isMaxLength(MAX_PROMPT_TOKENS)),
  maxTokens: TokenCountField,
  /** The tenant's cache salt (empty: unsalted chain). */
  cacheSalt: Schema.String,
  sampling: Sampling,
  plan: OfferPlan,
  /** Generation ends after any of these ids; absent: the worker's model's EOS ids. */
  stopTokenIds: Schema.optional(TokenList),
  /** Larger is served first; absent: 0. */
  priority: Schema.optional(Schema.Int),
  /** Log-probabilities of each generated token with this many alternatives; absent: none. */
  logprobs: Schema.optional(TopLogprobs),
  /** Score the prompt with this many alternatives (computes it whole); absent: no scoring. */
  promptLogprobs: Schema.optional(TopLogprobs),
  /** The grammar the output follows; absent: free. */
  constraint: Schema.optional(Constraint),
});
export type Offer = (typeof OfferBody)["Type"];
export type Sampling = (typeof Sampling)["Type"];

const AcceptBody = Schema.Struct({
  requestId: RequestIdField,
  attempt: Attempt,
  workerId: WorkerIdField,
  epoch: Count,
  reservedPages: PageCountField,
});
export type Accept = (typeof AcceptBody)["Type"];

const DeclineBody = Schema.Struct({
  requestId: RequestIdField,
  attempt: Attempt,
  workerId: WorkerIdField,
  reason: Schema.Literals(DeclineReasons),
  /** Human-readable detail (e.g. "need 40 pages, have 12 free + 8 evictable"). */
  detail: Schema.String,
});
export type Decline = (typeof DeclineBody)["Type"];

/**
 * The most prompt positions whose scores (`top` alternatives each) fit the
 * one tokens frame that carries them. An entry encodes (plain msgpack maps) in
 * at most 44 + 15 · top bytes: a 4-key map, the keys (21 bytes), id and rank
 * as uint32 (5 each), logprob as float64 (9), and per alternative a 2-array of
 * uint32 and float64 (15). 2 MiB of the message stay for the envelope and the
 * frame's generated tokens (≤ MAX_TOKENS_PER_FRAME, with their own entries).
 * The front door refuses longer prompts that ask for scores, naming the bound.
 */
export function maxScoredPromptTokens(top: number): number {
  return Math.floor((MAX_MESSAGE_BYTES - 2 * 1024 * 1024) / (44 + 15 * top));
}

/** Generated tokens of one attempt; `index` is the position of `tokens[0]` in the output stream. */
const TokensBody = Schema.Struct({
  requestId: RequestIdField,
  attempt: Attempt,
  workerId: WorkerIdField,
  index: Count,
  tokens: Schema.Array(TokenId).check(Schema.isMaxLength(MAX_TOKENS_PER_FRAME)),
  /** With an offer's `logprobs`: one entry per token of `tokens`, in order. */
  logprobs: Schema.optional(Schema.Array(TokenLogprobField).check(Schema.isMaxLength(MAX_TOKENS_PER_FRAME))),
  /**
   * With an offer's `promptLogprobs`, on the frame that starts at index 0:
   * prompt positions 1.. (the first prompt token has none).
   */
  promptLogprobs: Schema.optional(
    Schema.Array(TokenLogprobField).check(Schema.isMaxLength(MAX_PROMPT_TOKENS)),
  ),
});
export type Tokens = (typeof TokensBody)["Type"];

export const FinishReasons = ["stop", "length", "cancelled", "error"] as const;
export type FinishReason = (typeof FinishReasons)[number];

/** The end of one attempt. `tokensTotal` lets the controller detect a lost tokens frame. */
const ResultBody = Schema.Struct({
  requestId: RequestIdField,
  attempt: Attempt,
  workerId: WorkerIdField,
  outcome: Schema.Literals(["completed", "failed"]),
  finishReason: Schema.Literals(FinishReasons),
  tokensTotal: Count,
  /** Measured time to first token on the worker (from accept); null when no token was produced. */
  measuredTtftMs: Schema.NullOr(Ms),
  /**
   * That time by the router's terms, measured on the worker: queue (accept →
   * admitted), fetch (the durable restore's load), prefill (the rest, to the
   * first token). Absent when no token was produced, or from a worker that
   * does not report it.
   */
  measuredTerms: Schema.optional(Schema.Struct({ queueMs: Ms, fetchMs: Ms, prefillMs: Ms })),
  /** Empty when completed. */
  reason: Schema.String,
});
export type Result = (typeof ResultBody)["Type"];

const CancelBody = Schema.Struct({
  requestId: RequestIdField,
  attempt: Attempt,
  reason: Schema.String,
});
export type Cancel = (typeof CancelBody)["Type"];

// ---------------------------------------------------------------- decision record

const TtftTerms = Schema.Struct({
  queueMs: Ms,
  fetchMs: Ms,
  uploadMs: Ms,
  prefillMs: Ms,
  firstTokenMs: Ms,
});
export type TtftTerms = (typeof TtftTerms)["Type"];

const CandidateRecord = Schema.Struct({
  workerId: WorkerIdField,
  source: Schema.Literals(CandidateSources),
  cachedTokens: TokenCountField,
  /** The prefix boundary the cached tokens end at (absent for recompute). */
  boundary: Schema.NullOr(NodeIdField),
  terms: TtftTerms,
  /** max(queue, fetch) + upload + prefill + first token. */
  predictedTtftMs: Ms,
});
export type CandidateRecord = (typeof CandidateRecord)["Type"];

const DroppedCandidate = Schema.Struct({
  workerId: WorkerIdField,
  source: Schema.Literals(CandidateSources),
  reason: Schema.Literals(DropReasons),
  detail: Schema.String,
});
export type DroppedCandidate = (typeof DroppedCandidate)["Type"];

/**
 * One routing decision with its inputs and prediction (a decision-grade fact:
 * proposed to the catalog, batched, so the cost model can be replayed and
 * checked against `measuredTtftMs`).
 */
const DecisionBody = Schema.Struct({
  requestId: RequestIdField,
  attempt: Attempt,
  modelFingerprint: FingerprintField,
  promptTokens: TokenCountField,
  maxTokens: TokenCountField,
  /** Routing policy name (e.g. "ttft/v1"). */
  policy: Schema.String,
  /** Feasible candidates in rank order (best first). */
  ranked: Schema.Array(CandidateRecord).check(Schema.isMaxLength(MAX_DECISION_CANDIDATES)),
  dropped: Schema.Array(DroppedCandidate).check(Schema.isMaxLength(MAX_DECISION_CANDIDATES)),
  /** The candidate offered (null: nothing feasible). */
  choice: Schema.NullOr(CandidateRecord),
  measuredTtftMs: Schema.NullOr(Ms),
});
export type DecisionRecord = (typeof DecisionBody)["Type"];

// ---------------------------------------------------------------- kinds and channels

export const HeartbeatMessage = defineMessage("control.heartbeat", HeartbeatBody);
export const OfferMessage = defineMessage("control.offer", OfferBody);
export const AcceptMessage = defineMessage("control.accept", AcceptBody);
export const DeclineMessage = defineMessage("control.decline", DeclineBody);
export const TokensMessage = defineMessage("control.tokens", TokensBody);
export const ResultMessage = defineMessage("control.result", ResultBody);
export const CancelMessage = defineMessage("control.cancel", CancelBody);
export const DecisionMessage = defineMessage("control.decision", DecisionBody);

/** Everything a worker may send the controller. */
export type WorkerToController = Heartbeat | Accept | Decline | Tokens | Result;
/** Everything the controller may send a worker. */
export type ControllerToWorker = Offer | Cancel;

export const workerToController = new MessageRegistry<WorkerToController>([
  HeartbeatMessage,
  AcceptMessage,
  DeclineMessage,
  TokensMessage,
  ResultMessage,
] as MessageKind<WorkerToController>[]);

export const controllerToWorker = new MessageRegistry<ControllerToWorker>([
  OfferMessage,
  CancelMessage,
] as MessageKind<ControllerToWorker>[]);

/** Heartbeat versions order by (epoch, sequence); returns <0, 0, >0. */
export function compareVersion(
  a: { readonly epoch: number; readonly sequence: number },
  b: { readonly epoch: number; readonly sequence: number },
): number {
  return a.epoch !== b.epoch ? a.epoch - b.epoch : a.sequence - b.sequence;
}
