import type { CatalogDb } from "../../catalog/db.ts";
import type { CandidateRecord } from "../../schema/control.ts";
import { type ParsedDecision, parseDecisionText } from "../fleet/decision-text.ts";

/**
 * Decision records read back from a catalog db (pure): every
 * `decision/*` entity with its parsed candidates text, and the prediction
 * error of the live router by term against what was measured.
 */

export interface RecordedDecision {
  readonly request: string;
  readonly attempt: number;
  readonly tenant: string;
  readonly model: string;
  readonly worker: string;
  readonly source: string;
  readonly cachedTokens: number;
  readonly predictedTtftMs: number;
  readonly measuredTtftMs: number | null;
  readonly text: ParsedDecision;
}

export interface ReadDecisions {
  readonly decisions: RecordedDecision[];
  /** Records whose text carries no inputs (version 1) or does not parse. */
  readonly withoutInputs: number;
}

/** Every decision of `model` (all models when absent), ordered by routing time then request and attempt. */
export function readDecisions(db: CatalogDb, model?: string): ReadDecisions {
  const decisions: RecordedDecision[] = [];
  let withoutInputs = 0;
  for (const e of db.holders("decision/key")) {
    const fp = db.get(db.get(e, "decision/model") as number, "model/fingerprint") as string;
    if (model !== undefined && fp !== model) continue;
    let text: ParsedDecision | null = null;
    try {
      text = parseDecisionText(db.get(e, "decision/candidates") as string);
    } catch {
      text = null;
    }
    if (text === null || text.context === null) {
      withoutInputs++;
      continue;
    }
    decisions.push({
      request: db.get(e, "decision/request") as string,
      attempt: db.get(e, "decision/attempt") as number,
      tenant: db.get(e, "decision/tenant") as string,
      model: fp,
      worker: db.get(db.get(e, "decision/worker") as number, "worker/id") as string,
      source: db.get(e, "decision/source") as string,
      cachedTokens: db.get(e, "decision/cached-tokens") as number,
      predictedTtftMs: db.get(e, "decision/predicted-ttft-ms") as number,
      measuredTtftMs: (db.get(e, "decision/measured-ttft-ms") as number | undefined) ?? null,
      text,
    });
  }
  decisions.sort(
    (a, b) =>
      a.text.context!.routedAtMs - b.text.context!.routedAtMs ||
      (a.request < b.request ? -1 : a.request > b.request ? 1 : 0) ||
      a.attempt - b.attempt,
  );
  return { decisions, withoutInputs };
}

/** The chosen candidate among the ranked (the record names its worker, source and cached tokens). */
export function chosen(d: RecordedDecision): CandidateRecord | undefined {
  return d.text.ranked.find(
    (c) => c.workerId === d.worker && c.source === d.source && c.cachedTokens === d.cachedTokens,
  );
}

export interface TermError {
  /** Requests with both a prediction and a measurement of the term. */
  readonly n: number;
  readonly predictedMeanMs: number;
  readonly measuredMeanMs: number;
  /** mean(measured − predicted): positive, the model predicts too little. */
  readonly biasMs: number;
  readonly meanAbsErrorMs: number;
  readonly p90AbsErrorMs: number;
  /** Σ measured / Σ predicted (null when nothing was predicted). */
  readonly measuredOverPredicted: number | null;
}

export interface PredictionError {
  /** Requests whose first token was measured. */
  readonly measured: number;
  /** |predicted − measured| / measured of the whole TTFT: its 90th percentile and the share within 25 %. */
  readonly relativeErrorP90: number | null;
  readonly withinQuarter: number | null;
  /** By term, over requests whose worker reported its split: queue, fetch, prefill (upload + prefill + first token). */
  readonly terms: { readonly queue: TermError; readonly fetch: TermError; readonly prefill: TermError };
}

/** Nearest-rank percentile of an ascending list (null when empty). */
export function percentileOf(sorted: readonly number[], p: number): number | null {
  if (sorted.length === 0) return null;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

function termError(pairs: readonly (readonly [number, number])[]): TermError {
  const n = pairs.length;
  let p = 0;
  let m = 0;
  let abs = 0;
  const errs: number[] = [];
  for (const [pred, meas] of pairs) {
    p += pred;
    m += meas;
    abs += Math.abs(meas - pred);
    errs.push(Math.abs(meas - pred));
  }
  errs.sort((a, b) => a - b);
  return {
    n,
    predictedMeanMs: n === 0 ? 0 : p / n,
    measuredMeanMs: n === 0 ? 0 : m / n,
    biasMs: n === 0 ? 0 : (m - p) / n,
    meanAbsErrorMs: n === 0 ? 0 : abs / n,
    p90AbsErrorMs: percentileOf(errs, 90) ?? 0,
    measuredOverPredicted: p > 0 ? m / p : null,
  };
}

/** The live router's prediction error, overall and by term. */
export function predictionError(decisions: readonly RecordedDecision[]): PredictionError {
  const rel: number[] = [];
  const q: [number, number][] = [];
  const f: [number, number][] = [];
  const pf: [number, number][] = [];
  for (const d of decisions) {
    const m = d.text.measured;
    if (m === null || !(m.ttftMs > 0)) continue;
    rel.push(Math.abs(d.predictedTtftMs - m.ttftMs) / m.ttftMs);
    const c = chosen(d);
    if (c === undefined || m.terms === undefined) continue;
    q.push([c.terms.queueMs, m.terms.queueMs]);
    f.push([c.terms.fetchMs, m.terms.fetchMs]);
    pf.push([c.terms.uploadMs + c.terms.prefillMs + c.terms.firstTokenMs, m.terms.prefillMs]);
  }
  rel.sort((a, b) => a - b);
  return {
    measured: rel.length,
    relativeErrorP90: percentileOf(rel, 90),
    withinQuarter: rel.length === 0 ? null : rel.filter((e) => e <= 0.25).length / rel.length,
    terms: { queue: termError(q), fetch: termError(f), prefill: termError(pf) },
  };
}
