/**
 * Sizes prefill tiles so running decodes keep their pace: a step that mixes
 * prefill rows into the decode lanes should take at most `pace` times a
 * decode-only step, so a long prompt slows each running decode's
 * inter-token latency by at most that factor.
 *
 * Cost model, per step: stepMs ≈ baseMs + prefillRows · rowMs, where baseMs
 * is a decode-only step (one pass over the weights plus the decode rows) and
 * rowMs the marginal cost of one prefill row. Both are smoothed from the
 * measured steps (exponentially, weight `alpha`): baseMs from decode-only
 * steps, rowMs = (stepMs − baseMs) / prefillRows from mixed ones. rowMs
 * follows a long prompt's growing attention cost, since every later tile
 * attends to more keys. The tile beside decodes is then
 *   clamp(⌊(pace − 1) · baseMs / rowMs⌋, minTile, maxTile);
 * with no decode running, prefill is not paced (maxTile).
 *
 * Pure arithmetic over the samples given: no clock.
 */
export class PrefillPacer {
  private baseMs: number | null = null;
  private rowMs: number | null = null;

  constructor(
    readonly pace: number,
    readonly minTile: number,
    readonly maxTile: number,
    readonly alpha = 0.3,
  ) {
    if (!(Number.isFinite(pace) && pace > 1)) throw new RangeError(`decode pace must be > 1, got ${pace}`);
    if (!Number.isSafeInteger(minTile) || minTile < 1 || !Number.isSafeInteger(maxTile) || maxTile < minTile)
      throw new RangeError(`prefill tiles must satisfy 1 ≤ min ≤ max, got ${minTile}..${maxTile}`);
    if (!(alpha > 0 && alpha <= 1)) throw new RangeError(`alpha must be in (0, 1], got ${alpha}`);
  }

  /** Prefill rows per step: paced while decodes run; the whole tile otherwise or before any estimate. */
  tile(decoding: boolean): number {
    if (!decoding) return this.maxTile;
    // Until both costs are measured, the smallest tile: the first mixed steps are the calibration.
    if (this.baseMs === null || this.rowMs === null) return this.minTile;
    const t = Math.floor(((this.pace - 1) * this.baseMs) / this.rowMs);
    return Math.min(this.maxTile, Math.max(this.minTile, t));
  }

  /** One measured step: its decode rows, prefill rows and device time. */
  observe(decodeRows: number, prefillRows: number, stepMs: number): void {
    if (!(Number.isFinite(stepMs) && stepMs >= 0)) return;
    if (prefillRows === 0) {
      if (decodeRows > 0) this.baseMs = this.smooth(this.baseMs, stepMs);
      return;
    }
    if (decodeRows === 0 || this.baseMs === null) return;
    // A marginal cost below zero is noise (the step ran faster than the decode-only average).
    const row = Math.max(0, stepMs - this.baseMs) / prefillRows;
    this.rowMs = this.smooth(this.rowMs, row);
  }

  private smooth(prev: number | null, sample: number): number {
    return prev === null ? sample : prev + this.alpha * (sample - prev);
  }
}
