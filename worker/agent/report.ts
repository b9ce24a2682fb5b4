import { type CalibratedCosts, MAX_PREFILLING_ATTEMPTS, type PrefillProgress } from "../../schema/control.ts";
import { type RequestId, TokenCount } from "../../schema/ids.ts";
import type { Calibration } from "../calibration/calibration.ts";
import type { RequestTiming } from "../runtime/runtime.ts";

/**
 * What a worker reports of its work (pure): the heartbeat's per-attempt
 * prefill progress and calibrated costs, and a request's measured TTFT split
 * by the router's terms (read back by `continuum replay`).
 */

const MIB = 1024 * 1024;

/** An accepted attempt as the heartbeat sees it. */
export interface PrefillingAttempt {
  readonly requestId: RequestId;
  readonly attempt: number;
  /** Prompt tokens the offer said were still to prefill when it was accepted. */
  readonly queuedTokens: number;
  readonly prompt: readonly unknown[];
  /** null until its first token. */
  readonly firstTokenAt: number | null;
}

/**
 * Tokens still to prefill, in all and per attempt (the list bounded by
 * MAX_PREFILLING_ATTEMPTS; the total counts every attempt). Still to
 * prefill: the accepted estimate, less what the runtime has put through the
 * forward since (`prefilled`).
 */
export function prefillProgress<A extends PrefillingAttempt>(
  attempts: Iterable<A>,
  prefilled: (a: A) => number,
): { queuedTokens: number; prefilling: PrefillProgress[] } {
  let queuedTokens = 0;
  const prefilling: PrefillProgress[] = [];
  for (const a of attempts) {
    if (a.firstTokenAt !== null) continue;
    const remaining = Math.max(0, Math.min(a.queuedTokens, a.prompt.length - prefilled(a)));
    queuedTokens += remaining;
    if (prefilling.length < MAX_PREFILLING_ATTEMPTS)
      prefilling.push({ requestId: a.requestId, attempt: a.attempt, remainingTokens: TokenCount(remaining) });
  }
  return { queuedTokens, prefilling };
}

/** The heartbeat's costs from the worker's calibration (per-byte restore costs as ms per MiB). */
export function heartbeatCosts(c: Calibration): CalibratedCosts {
  return {
    prefillPerTokenMs: c.prefillPerTokenMs.value,
    firstTokenMs: c.firstTokenMs.value,
    // The CPU engine's pages live in host memory: restored bytes need no upload.
    uploadMsPerMiB: 0,
    restoreMsPerMiB: {
      ram: c.restorePerByteMs.ram.value * MIB,
      ssd: c.restorePerByteMs.ssd.value * MIB,
      peer: c.restorePerByteMs.peer.value * MIB,
      s3: c.restorePerByteMs.s3.value * MIB,
    },
    samples: c.prefillPerTokenMs.samples + c.firstTokenMs.samples,
  };
}

/** A measured TTFT split by the router's terms; prefill is the rest (never below 0). */
export function measuredTerms(
  ttftMs: number,
  t: RequestTiming,
): { queueMs: number; fetchMs: number; prefillMs: number } {
  const queueMs = Math.max(0, Math.min(ttftMs, t.queueMs ?? 0));
  const fetchMs = Math.max(0, Math.min(ttftMs - queueMs, t.fetchMs));
  return { queueMs, fetchMs, prefillMs: Math.max(0, ttftMs - queueMs - fetchMs) };
}
