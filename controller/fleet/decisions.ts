import type { ProposalSink } from "../../catalog/log.ts";
import { type CatalogOp, ProposalMsg } from "../../schema/catalog.ts";
import type { DecisionRecord } from "../../schema/control.ts";
import type { Logger } from "../../schema/log.ts";
import { encodeMessage } from "../../schema/wire.ts";
import { type DecisionContext, decisionText, type MeasuredOutcome } from "./decision-text.ts";

/**
 * Routing decisions to the catalog, batched. Each attempt that was offered
 * to a worker becomes one `decision.recorded` op (its ranked and dropped
 * candidates and the router's inputs as JSON, decision-text.ts; the choice;
 * the predicted TTFT) and, when a first token arrived, one
 * `decision.measured` op with the TTFT measured on the controller from the
 * offer. `continuum replay` reads them back to check the cost model.
 *
 * Bounds: at most `maxBuffered` ops wait; beyond that the oldest are dropped
 * and counted (a decision record is an observation, not an acknowledged
 * write: losing one under overload is preferable to growing without bound).
 * A proposal carries at most `maxBatch` decisions; one proposal is in flight
 * at a time; the buffer is flushed when it holds a full batch or every
 * `flushMs`.
 */

export interface DecisionRecorderOptions {
  /** Proposal client id (the controller's); proposal ids are `<clientId>/<start>/<n>`. */
  readonly clientId: string;
  readonly maxBatch?: number;
  readonly maxBuffered?: number;
  readonly flushMs?: number;
  readonly log: Logger;
}

/**
 * The catalog ops of one offered attempt (empty when nothing was chosen:
 * nothing to record). `timeMs`: when it was routed; the candidates text
 * carries the router's inputs and the measured outcome (decision-text.ts).
 */
export function decisionOps(
  d: DecisionRecord,
  tenant: string,
  timeMs: number,
  measured: MeasuredOutcome | null,
  context: DecisionContext | null = null,
): CatalogOp[] {
  if (d.choice === null) return [];
  const ops: CatalogOp[] = [
    {
      op: "decision.recorded",
      request: d.requestId,
      attempt: d.attempt,
      tenant,
      model: d.modelFingerprint,
      time: timeMs,
      candidates: decisionText(d, context, measured),
      worker: d.choice.workerId,
      source: d.choice.source,
      cachedTokens: d.choice.cachedTokens,
      predictedTtftMs: d.choice.predictedTtftMs,
    },
  ];
  if (measured !== null) {
    ops.push({
      op: "decision.measured",
      request: d.requestId,
      attempt: d.attempt,
      measuredTtftMs: measured.ttftMs,
    });
  }
  return ops;
}

export class DecisionRecorder {
  private buffer: CatalogOp[][] = [];
  private timer: NodeJS.Timeout | null = null;
  private draining: Promise<void> | null = null;
  private proposals = 0;
  private readonly startedAt = Date.now();
  private readonly maxBatch: number;
  private readonly maxBuffered: number;
  readonly counters = { recorded: 0, proposed: 0, dropped: 0, failedProposals: 0 };

  constructor(
    private readonly sink: ProposalSink,
    private readonly opts: DecisionRecorderOptions,
  ) {
    this.maxBatch = opts.maxBatch ?? 64;
    this.maxBuffered = opts.maxBuffered ?? 4096;
    if (this.maxBatch < 1 || this.maxBuffered < this.maxBatch)
      throw new RangeError("decision recorder: need 1 ≤ maxBatch ≤ maxBuffered");
    this.timer = setInterval(() => void this.flush(), opts.flushMs ?? 1000);
  }

  /** Queues one decision's ops (a no-op for an empty list). */
  add(ops: CatalogOp[]): void {
    if (ops.length === 0) return;
    this.buffer.push(ops);
    this.counters.recorded++;
    if (this.buffer.length > this.maxBuffered) {
      const over = this.buffer.length - this.maxBuffered;
      this.buffer.splice(0, over);
      this.counters.dropped += over;
      this.opts.log.log("warn", "decisions.dropped", { count: over, buffered: this.maxBuffered });
    }
    if (this.buffer.length >= this.maxBatch) void this.flush();
  }

  /**
   * Proposes everything buffered, a batch at a time; concurrent calls share
   * one drain, so exactly one proposal is in flight at a time.
   */
  flush(): Promise<void> {
    this.draining ??= this.drain().finally(() => {
      this.draining = null;
    });
    return this.draining;
  }

  private async drain(): Promise<void> {
    while (this.buffer.length > 0) {
      const batch = this.buffer.splice(0, this.maxBatch);
      const id = `${this.opts.clientId}/${this.startedAt}/${++this.proposals}`;
      const bytes = encodeMessage(ProposalMsg, { id, clientId: this.opts.clientId, ops: batch.flat() });
      try {
        await this.sink.propose(bytes);
        this.counters.proposed += batch.length;
      } catch (err) {
        this.counters.failedProposals++;
        this.opts.log.log("warn", "decisions.propose_failed", {
          decisions: batch.length,
          message: (err as Error).message,
        });
      }
    }
  }

  /** Stops the timer and proposes what is left. */
  async close(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.flush();
  }
}
