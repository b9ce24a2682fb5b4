/**
 * Sizes the prefill rows of a step so running decodes keep their pace: a
 * step that mixes prefill rows into the decode lanes should take at most
 * `pace` times a decode-only step, so a long prompt stretches each running
 * decode's inter-token latency by at most that factor.
 *
 * Cost model, per step: stepMs ≈ baseMs + prefillRows · rowMs, where baseMs
 * is a decode-only step (one pass over the weights plus the decode rows) and
 * rowMs the marginal cost of one prefill row (it grows along a long prompt,
 * whose later rows attend to more keys). The prefill rows beside decodes are
 *   T = clamp(⌊(pace − 1) · baseMs / rowMs⌋, minTile, maxTile),
 * so that baseMs + T · rowMs ≤ pace · baseMs; with no decode running,
 * prefill is not paced (maxTile). The caller caps the step's prefill rows
 * (all lanes together) at T.
 *
 * The estimates must survive a noisy machine, where one step can take twice
 * its usual time or finish early:
 *   - baseMs is the median of the last `window` decode-only steps, so one
 *     slow step does not move it;
 *   - rowMs is the median over the last `window` mixed steps of
 *     (msᵢ − baseMs) / Tᵢ (Tᵢ prefill rows), so neither a stalled step (which
 *     would shrink the tile to its minimum for a whole window under a mean)
 *     nor an early one (a 2-row step 10 ms early reads as free rows) moves
 *     it;
 *   - the tile grows at most by `growth` per mixed step (⌈T_last · growth⌉),
 *     so no single early step can jump it to maxTile; it shrinks at once.
 * Until both costs are measured the tile is minTile: the first mixed steps
 * are the calibration.
 *
 * Pure arithmetic over the samples given: no clock.
 */
export class PrefillPacer {
  /** Times of the last `window` decode-only steps, oldest first. */
  private readonly decodeMs: number[] = [];
  /** Prefill rows and time of the last `window` mixed steps, oldest first. */
  private readonly mixed: { rows: number; ms: number }[] = [];
  /** Prefill rows of the last mixed step: the growth limit's reference. */
  private lastRows: number;

  constructor(
    readonly pace: number,
    readonly minTile: number,
    readonly maxTile: number,
    readonly window = 16,
    readonly growth = 1.25,
  ) {
    if (!(Number.isFinite(pace) && pace > 1)) throw new RangeError(`decode pace must be > 1, got ${pace}`);
    if (!Number.isSafeInteger(minTile) || minTile < 1 || !Number.isSafeInteger(maxTile) || maxTile < minTile)
      throw new RangeError(`prefill tiles must satisfy 1 ≤ min ≤ max, got ${minTile}..${maxTile}`);
    if (!Number.isSafeInteger(window) || window < 1 || window > 1024)
      throw new RangeError(`window must be an integer in [1, 1024], got ${window}`);
    if (!(Number.isFinite(growth) && growth > 1)) throw new RangeError(`growth must be > 1, got ${growth}`);
    this.lastRows = minTile;
  }

  /** Prefill rows per step: paced while decodes run; the whole tile otherwise. */
  tile(decoding: boolean): number {
    if (!decoding) return this.maxTile;
    const base = this.baseMs();
    const row = base === null ? null : this.rowMs(base);
    if (base === null || row === null) return this.minTile;
    const fit = row > 0 ? Math.floor(((this.pace - 1) * base) / row) : this.maxTile;
    const ceiling = Math.ceil(this.lastRows * this.growth);
    return Math.min(this.maxTile, Math.max(this.minTile, Math.min(fit, ceiling)));
  }

  /** One measured step: its decode rows, prefill rows and device time. */
  observe(decodeRows: number, prefillRows: number, stepMs: number): void {
    if (!(Number.isFinite(stepMs) && stepMs >= 0)) return;
    if (prefillRows === 0) {
      if (decodeRows > 0) push(this.decodeMs, stepMs, this.window);
      return;
    }
    if (decodeRows === 0) return;
    push(this.mixed, { rows: prefillRows, ms: stepMs }, this.window);
    this.lastRows = prefillRows;
  }

  /** Median decode-only step, or null before any. */
  baseMs(): number | null {
    return this.decodeMs.length === 0 ? null : median(this.decodeMs);
  }

  /** Median marginal ms per prefill row over the window (≥ 0), or null before any mixed step. */
  rowMs(baseMs: number): number | null {
    if (this.mixed.length === 0) return null;
    return Math.max(0, median(this.mixed.map(({ rows, ms }) => (ms - baseMs) / rows)));
  }
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 === 1 ? s[(n - 1) / 2]! : (s[n / 2 - 1]! + s[n / 2]!) / 2;
}

/** Appends to a window of at most `max` samples, dropping the oldest. */
function push<T>(window: T[], sample: T, max: number): void {
  window.push(sample);
  if (window.length > max) window.shift();
}
