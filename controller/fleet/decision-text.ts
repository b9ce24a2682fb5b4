import { Schema } from "effect";
import type { CandidateRecord, DecisionRecord, DroppedCandidate, Heartbeat } from "../../schema/control.ts";
import type { NodeId, WorkerId } from "../../schema/ids.ts";
import { type ChainBoundary, longestResident } from "../candidates.ts";
import type { Outstanding, TtftWeights } from "../router.ts";

/**
 * The text of a decision record's `decision/candidates` attribute: the
 * ranked and dropped candidates, and the inputs they were computed from, so
 * that `continuum replay` can rebuild the recorded workload and check the
 * cost model against what was measured.
 *
 *   {v: 2, ranked, dropped, omitted, promptTokens, maxTokens, policy,
 *    context: {routedAtMs, turn, weights, chain: [[node, tokens]…], published,
 *              workers: [{id, ageMs, costs, queue, freePages, evictablePages,
 *                         pageTokens, kvBytesPerToken, maxContext, durableTiers,
 *                         residentTokens, outstanding, totalPages?}…]},
 *    measured: {ttftMs, terms?: {queueMs, fetchMs, prefillMs}} | null}
 *
 * `measured.ttftMs` is the controller's (offer → first token), `terms` the
 * worker's split of its own time (accept → first token). Version 1 records
 * ({ranked, dropped, omitted} only) predate the context; replay counts and
 * skips them. The writer bounds the text to 64 KiB: `decisionText` cuts
 * dropped, then ranked candidates, then workers, then the chain, and says how
 * many it omitted.
 */

export const DECISION_TEXT_VERSION = 2;
/** The writer refuses candidates text over 64 KiB; leave room for the envelope. */
export const MAX_DECISION_TEXT_CHARS = 60_000;

export interface WorkerSnapshot {
  readonly id: WorkerId;
  readonly ageMs: number;
  readonly costs: Heartbeat["costs"];
  readonly queue: Heartbeat["queue"];
  readonly freePages: number;
  readonly evictablePages: number;
  readonly pageTokens: number;
  readonly kvBytesPerToken: number;
  readonly maxContext: number;
  readonly durableTiers: readonly string[];
  /** Tokens of this request's chain resident on the worker (0: none). */
  readonly residentTokens: number;
  readonly outstanding: Outstanding;
  readonly totalPages?: number;
}

export interface DecisionContext {
  /** Wall clock when the request was routed, ms since the epoch. */
  readonly routedAtMs: number;
  readonly turn: number;
  readonly weights: TtftWeights;
  /** The request's chain: [node id, tokens through it]. */
  readonly chain: readonly (readonly [NodeId, number])[];
  /** Nodes of the chain published when it was routed. */
  readonly published: number;
  readonly workers: readonly WorkerSnapshot[];
}

export interface MeasuredOutcome {
  readonly ttftMs: number;
  readonly terms?: { readonly queueMs: number; readonly fetchMs: number; readonly prefillMs: number };
}

/** The context of one routing decision, from the inputs the router was given. */
export function decisionContext(input: {
  readonly routedAtMs: number;
  readonly turn: number;
  readonly weights: TtftWeights;
  readonly chain: readonly ChainBoundary[];
  readonly published: number;
  readonly live: readonly { readonly heartbeat: Heartbeat; readonly ageMs: number }[];
  readonly outstanding: ReadonlyMap<WorkerId, Outstanding>;
}): DecisionContext {
  const none: Outstanding = { requests: 0, tokens: 0, running: 0 };
  return {
    routedAtMs: input.routedAtMs,
    turn: input.turn,
    weights: input.weights,
    chain: input.chain.map((b) => [b.nodeId, b.tokens] as const),
    published: input.published,
    workers: input.live.map(({ heartbeat: hb, ageMs }) => {
      const r = longestResident(hb, input.chain);
      return {
        id: hb.workerId,
        ageMs,
        costs: hb.costs,
        // The per-attempt list stays out: the outstanding count below already holds what the router read of it.
        queue: {
          queuedTokens: hb.queue.queuedTokens,
          queuedRequests: hb.queue.queuedRequests,
          runningRequests: hb.queue.runningRequests,
          ...(hb.queue.batching ? { batching: hb.queue.batching } : {}),
        },
        freePages: hb.freePages,
        evictablePages: hb.evictablePages,
        pageTokens: hb.pageTokens,
        kvBytesPerToken: hb.kvBytesPerToken,
        maxContext: hb.maxContext,
        durableTiers: hb.durableTiers,
        residentTokens: r < 0 ? 0 : input.chain[r]!.tokens,
        outstanding: input.outstanding.get(hb.workerId) ?? none,
        ...(hb.status ? { totalPages: hb.status.totalPages } : {}),
      };
    }),
  };
}

/** The attribute's text, cut to fit (see the module comment). */
export function decisionText(
  d: DecisionRecord,
  context: DecisionContext | null,
  measured: MeasuredOutcome | null,
): string {
  let ranked = d.ranked.length;
  let dropped = d.dropped.length;
  let workers = context?.workers.length ?? 0;
  let chain = context?.chain.length ?? 0;
  for (;;) {
    const omitted =
      d.ranked.length - ranked + (d.dropped.length - dropped) + ((context?.workers.length ?? 0) - workers);
    const body: Record<string, unknown> = {
      v: DECISION_TEXT_VERSION,
      ranked: d.ranked.slice(0, ranked),
      dropped: d.dropped.slice(0, dropped),
      omitted,
      promptTokens: d.promptTokens,
      maxTokens: d.maxTokens,
      policy: d.policy,
      context:
        context === null
          ? null
          : {
              ...context,
              workers: context.workers.slice(0, workers),
              chain: context.chain.slice(0, chain),
              chainOmitted: context.chain.length - chain,
            },
      measured,
    };
    const text = JSON.stringify(body);
    if (text.length <= MAX_DECISION_TEXT_CHARS) return text;
    if (dropped > 0) dropped = Math.floor(dropped / 2);
    else if (ranked > 1) ranked = Math.floor(ranked / 2);
    else if (workers > 0) workers = Math.floor(workers / 2);
    else if (chain > 0) chain = Math.floor(chain / 2);
    else return text; // a bare record is far under the bound
  }
}

// ---------------------------------------------------------------- reading it back

const Num = Schema.Number;
const Costs = Schema.Struct({
  prefillPerTokenMs: Num,
  firstTokenMs: Num,
  uploadMsPerMiB: Num,
  restoreMsPerMiB: Schema.Struct({ ram: Num, ssd: Num, peer: Num, s3: Num }),
  samples: Num,
});
const Terms = Schema.Struct({ queueMs: Num, fetchMs: Num, uploadMs: Num, prefillMs: Num, firstTokenMs: Num });
const Candidate = Schema.Struct({
  workerId: Schema.String,
  source: Schema.String,
  cachedTokens: Num,
  boundary: Schema.NullOr(Schema.String),
  terms: Terms,
  predictedTtftMs: Num,
});
const Snapshot = Schema.Struct({
  id: Schema.String,
  ageMs: Num,
  costs: Costs,
  queue: Schema.Struct({
    queuedTokens: Num,
    queuedRequests: Num,
    runningRequests: Num,
    batching: Schema.optional(Schema.Struct({ stepTokens: Num, prefillTile: Num })),
  }),
  freePages: Num,
  evictablePages: Num,
  pageTokens: Num,
  kvBytesPerToken: Num,
  maxContext: Num,
  durableTiers: Schema.Array(Schema.String),
  residentTokens: Num,
  outstanding: Schema.Struct({ requests: Num, tokens: Num, running: Num }),
  totalPages: Schema.optional(Num),
});
const Text = Schema.Struct({
  v: Schema.Literal(DECISION_TEXT_VERSION),
  ranked: Schema.Array(Candidate),
  dropped: Schema.Array(
    Schema.Struct({ workerId: Schema.String, source: Schema.String, reason: Schema.String }),
  ),
  omitted: Num,
  promptTokens: Num,
  maxTokens: Num,
  policy: Schema.String,
  context: Schema.NullOr(
    Schema.Struct({
      routedAtMs: Num,
      turn: Num,
      weights: Schema.Struct({ queue: Num, fetch: Num, upload: Num, prefill: Num, firstToken: Num }),
      chain: Schema.Array(Schema.Tuple([Schema.String, Num])),
      chainOmitted: Num,
      published: Num,
      workers: Schema.Array(Snapshot),
    }),
  ),
  measured: Schema.NullOr(
    Schema.Struct({
      ttftMs: Num,
      terms: Schema.optional(Schema.Struct({ queueMs: Num, fetchMs: Num, prefillMs: Num })),
    }),
  ),
});
const decodeText = Schema.decodeUnknownSync(Text);

export interface ParsedDecision {
  readonly ranked: readonly CandidateRecord[];
  readonly dropped: readonly Pick<DroppedCandidate, "workerId" | "source" | "reason">[];
  readonly promptTokens: number;
  readonly maxTokens: number;
  readonly policy: string;
  readonly context: (DecisionContext & { readonly chainOmitted: number }) | null;
  readonly measured: MeasuredOutcome | null;
}

/** A record's text back as values; null for text of another version (version 1 has no inputs). */
export function parseDecisionText(text: string): ParsedDecision | null {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    return null;
  }
  if (typeof raw !== "object" || raw === null || (raw as { v?: unknown }).v !== DECISION_TEXT_VERSION)
    return null;
  return decodeText(raw) as unknown as ParsedDecision;
}
