import { type CostFit, robustFit, type StepSample } from "../calibration/step-cost-fit.ts";

/**
 * Sizes the prefill rows of a step so running decodes keep their pace: a
 * step that mixes prefill rows into the decode lanes should take at most
 * `pace` times the decode-only step it replaces, so a long prompt stretches
 * each running decode's inter-token latency by at most that factor, and
 * gets every row that fits under it.
 *
 * Cost model, per step (ms), fitted to the measured steps:
 *   stepMs ≈ c₀ + c₁ · rows + c₂ · keys,
 * where rows are all the step's rows (a pass over the weights, c₀, plus each
 * row's share of the matrix products, c₁) and keys = Σ over rows of the
 * positions it attends (a row at position p attends p + 1 keys; c₂ per key).
 * The keys term is what grows: a decode's step gets dearer as its context
 * grows, and a long prompt's later rows attend to more keys. A decode-only
 * step measured before a long prefill says nothing about the same decodes
 * 2,000 tokens later; the model predicts it from their keys now:
 *   decode-only  S  = c₀ + c₁ · D + c₂ · K_D          (D rows, K_D keys)
 *   T more rows  ΔT = c₁ · T + c₂ · (T · (p₀ + 1) + T(T − 1)/2)
 * (the prefill's next row at position p₀), and the tile is the largest T
 * with ΔT ≤ (pace − 1) · S, a quadratic in T. With no decode running,
 * prefill is not paced (maxTile). The caller caps the step's prefill rows
 * (all lanes together) at T.
 *
 * The fit must survive a noisy machine, where one step can take several
 * times its usual time or finish early:
 *   - it is a least-absolute-deviations fit (the median, not the mean, of
 *     the steps: iteratively reweighted least squares) over the last
 *     `window` steps that had decode rows, plus the last `window` / 4
 *     decode-only steps, kept longer: they pin down the decode-only end of
 *     the model while a long prefill leaves no fresh ones. The coefficients
 *     are the machine's, not the context's, so an old step is as good a
 *     sample as a new one until the machine's speed changes;
 *   - coefficients are non-negative (the best non-negative fit: among the
 *     least-squares fits on each subset of the three terms, the one with
 *     every coefficient ≥ 0 and the smallest error);
 *   - the tile grows at most by `growth` per mixed step (⌈T_last · growth⌉),
 *     so no fitting error can jump it to maxTile; it shrinks at once.
 * Until a step with both decode and prefill rows is measured the tile is
 * minTile: the first mixed steps are the calibration. Steps without decode
 * rows are not fitted: a large prefill-only batch runs its matrix products
 * faster per row than a step beside a few decodes does.
 *
 * Pure arithmetic over the samples given: no clock.
 */
export class PrefillPacer {
  /** The last `window` steps with decode rows, oldest first. */
  private readonly recent: StepSample[] = [];
  /** The last ⌈window / 4⌉ decode-only steps, oldest first. */
  private readonly decodeOnly: StepSample[] = [];
  /** Prefill rows of the last mixed step: the growth limit's reference. */
  private lastRows: number;
  private mixedSeen = false;
  private fit: CostFit | null = null;
  /** Steps were observed since the fit. */
  private stale = false;

  constructor(
    readonly pace: number,
    readonly minTile: number,
    readonly maxTile: number,
    readonly window = 128,
    readonly growth = 1.25,
  ) {
    if (!(Number.isFinite(pace) && pace > 1)) throw new RangeError(`decode pace must be > 1, got ${pace}`);
    if (!Number.isSafeInteger(minTile) || minTile < 1 || !Number.isSafeInteger(maxTile) || maxTile < minTile)
      throw new RangeError(`prefill tiles must satisfy 1 ≤ min ≤ max, got ${minTile}..${maxTile}`);
    if (!Number.isSafeInteger(window) || window < 4 || window > 1024)
      throw new RangeError(`window must be an integer in [4, 1024], got ${window}`);
    if (!(Number.isFinite(growth) && growth > 1)) throw new RangeError(`growth must be > 1, got ${growth}`);
    this.lastRows = minTile;
  }

  /**
   * Prefill rows for the next step. `decodes`: the running decode lanes
   * (rows, and keys = Σ (position + 1) of their next rows), or null when
   * none runs; `nextPosition`: the position of the furthest prefill's next
   * row (its rows are the dearest).
   */
  tile(decodes: { readonly rows: number; readonly keys: number } | null, nextPosition: number): number {
    if (decodes === null || decodes.rows === 0) return this.maxTile;
    if (!this.mixedSeen) return this.minTile;
    // Fitted on demand, not per observed step: only a step that paces needs it.
    const c = this.model();
    if (c === null) return this.minTile;
    const budget = (this.pace - 1) * (c.c0 + c.c1 * decodes.rows + c.c2 * decodes.keys);
    const fit = largestTile(c, Math.max(0, nextPosition), budget, this.maxTile);
    const ceiling = Math.ceil(this.lastRows * this.growth);
    return Math.min(this.maxTile, Math.max(this.minTile, Math.min(fit, ceiling)));
  }

  /** One measured step: its decode and prefill rows with their keys, and its device time. */
  observe(step: StepShape, stepMs: number): void {
    if (!(Number.isFinite(stepMs) && stepMs >= 0) || step.decodeRows === 0) return;
    const s: StepSample = {
      rows: step.decodeRows + step.prefillRows,
      keys: step.decodeKeys + step.prefillKeys,
      ms: stepMs,
    };
    push(this.recent, s, this.window);
    if (step.prefillRows === 0) push(this.decodeOnly, s, Math.ceil(this.window / 4));
    else {
      this.mixedSeen = true;
      this.lastRows = step.prefillRows;
    }
    this.stale = true;
  }

  /** The cost model fitted to the steps observed so far, or null before any (for reports and tests). */
  model(): CostFit | null {
    if (this.stale) {
      const inRecent = new Set(this.recent);
      this.fit = robustFit([...this.decodeOnly.filter((d) => !inRecent.has(d)), ...this.recent]);
      this.stale = false;
    }
    return this.fit;
  }
}

/** One step's rows, split by kind, with the keys each kind attends (Σ (position + 1) over its rows). */
export interface StepShape {
  readonly decodeRows: number;
  readonly decodeKeys: number;
  readonly prefillRows: number;
  readonly prefillKeys: number;
}

/** The largest T with c1·T + c2·(T·(p0 + 1) + T(T − 1)/2) ≤ budget, capped at `cap`. */
function largestTile(c: CostFit, p0: number, budget: number, cap: number): number {
  // a·T² + b·T ≤ budget with a = c2/2, b = c1 + c2·(p0 + ½).
  const a = c.c2 / 2;
  const b = c.c1 + c.c2 * (p0 + 0.5);
  if (budget <= 0) return 0;
  if (a === 0 && b === 0) return cap;
  // The positive root (−b + √(b² + 4a·budget)) / 2a, written without the
  // cancellation that loses it when a is tiny beside b.
  const t = (2 * budget) / (b + Math.sqrt(b * b + 4 * a * budget));
  // Floating point may land a hair above an exact fit: step back while over.
  let n = Math.min(cap, Math.floor(t));
  while (n > 0 && a * n * n + b * n > budget * (1 + 1e-12)) n--;
  return n;
}

/** Appends to a window of at most `max` samples, dropping the oldest. */
function push<T>(window: T[], sample: T, max: number): void {
  window.push(sample);
  if (window.length > max) window.shift();
}
