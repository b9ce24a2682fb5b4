/**
 * Checkpoint admission: a positive expected-value decision (pure).
 *
 * Capturing a chunk costs its bytes times the measured capture cost per byte
 * (download from the device, re-pack, the local tiers' writes). It pays off
 * when some later request restores it instead of recomputing it; the saving
 * then is its tokens' prefill time minus the restore's own cost. With p the
 * probability that the prefix is asked for again:
 *
 *   EV = p · (tokens · prefillPerTokenMs − bytes · restorePerByteMs) − bytes · capturePerByteMs
 *
 * and a chunk is captured only when EV > 0. p comes from observed reuse with
 * Laplace's rule of succession, p = (hits + 1) / (hits + 2): a prefix seen
 * once is even odds, one hit again raises it to 2/3. The capture cost is
 * charged off the decode path (a transfer thread and the store), so it is
 * weighed in milliseconds of that path, not of tokens.
 *
 * The wait for the remote tier (S3 write-behind) is not part of the capture
 * cost: it runs in the store's bounded write-behind queue, whose refusal when
 * full already sheds captures while S3 is slow or away. Charging it per byte
 * let one outage sample (retries and backoff: seconds) price every later
 * chunk out, and since the estimate is only re-measured by a capture, it never
 * came back.
 *
 * Re-probe: any estimate that gates its own measurement can lock itself out
 * the same way (a capture slowed once by a busy host). So after `probeEvery`
 * chunks in a row declined on value, the next one is captured anyway as a
 * probe, and its measurement moves the estimate back. Cost bound: at most one
 * chunk in probeEvery + 1 is a capture that the estimate said did not pay.
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

/** How often a declined estimate is re-measured. */
export interface ProbeState {
  /** Offers declined on value since the capture cost was last measured. */
  readonly declinedSinceSample: number;
  /** Declines in a row after which the next offer is captured as a probe (≥ 1). */
  readonly probeEvery: number;
}

export interface CaptureDecision {
  readonly capture: boolean;
  /** Captured although EV ≤ 0, to re-measure the capture cost. */
  readonly probe: boolean;
  readonly expectedValueMs: number;
  readonly reuseProbability: number;
}

export function captureDecision(
  c: CaptureCandidate,
  costs: CaptureCosts,
  probe?: ProbeState,
): CaptureDecision {
  if (!Number.isSafeInteger(c.hits) || c.hits < 0) throw new RangeError(`hits must be ≥ 0, got ${c.hits}`);
  if (probe && (!Number.isSafeInteger(probe.probeEvery) || probe.probeEvery < 1))
    throw new RangeError(`probeEvery must be a positive integer, got ${probe.probeEvery}`);
  const p = (c.hits + 1) / (c.hits + 2);
  const saved = c.tokens * costs.prefillPerTokenMs - c.bytes * costs.restorePerByteMs;
  const ev = p * saved - c.bytes * costs.capturePerByteMs;
  // A probe only where the capture cost is what declines it: a chunk whose
  // restore costs more than its recompute never pays, however cheap its capture.
  const probing =
    ev <= 0 && saved > 0 && probe !== undefined && probe.declinedSinceSample >= probe.probeEvery;
  return { capture: ev > 0 || probing, probe: probing, expectedValueMs: ev, reuseProbability: p };
}
