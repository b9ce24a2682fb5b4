/**
 * Checkpoint admission: a positive expected-value decision (pure).
 *
 * Capturing a chunk costs its bytes times the measured capture cost per byte
 * (download from the device, re-pack, store write). It pays off when some
 * later request restores it instead of recomputing it; the saving then is its
 * tokens' prefill time minus the restore's own cost. With p the probability
 * that the prefix is asked for again:
 *
 *   EV = p · (tokens · prefillPerTokenMs − bytes · restorePerByteMs) − bytes · capturePerByteMs
 *
 * and a chunk is captured only when EV > 0. p comes from observed reuse with
 * Laplace's rule of succession, p = (hits + 1) / (hits + 2): a prefix seen
 * once is even odds, one hit again raises it to 2/3. The capture cost is
 * charged off the decode path (a transfer thread and the store), so it is
 * weighed in milliseconds of that path, not of tokens.
 */
export interface CaptureCosts {
  readonly prefillPerTokenMs: number;
  readonly capturePerByteMs: number;
  /** Cost of bringing the chunk back later, from the tier it is written to. */
  readonly restorePerByteMs: number;
}

export interface CaptureCandidate {
  readonly tokens: number;
  readonly bytes: number;
  /** Times the prefix was reused since it was computed (cache hits). */
  readonly hits: number;
}

export interface CaptureDecision {
  readonly capture: boolean;
  readonly expectedValueMs: number;
  readonly reuseProbability: number;
}

export function captureDecision(c: CaptureCandidate, costs: CaptureCosts): CaptureDecision {
  if (!Number.isSafeInteger(c.hits) || c.hits < 0) throw new RangeError(`hits must be ≥ 0, got ${c.hits}`);
  const p = (c.hits + 1) / (c.hits + 2);
  const saved = c.tokens * costs.prefillPerTokenMs - c.bytes * costs.restorePerByteMs;
  const ev = p * saved - c.bytes * costs.capturePerByteMs;
  return { capture: ev > 0, expectedValueMs: ev, reuseProbability: p };
}
