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

/** stepMs ≈ c0 + c1 · rows + c2 · keys; every coefficient ≥ 0. */
export interface CostFit {
  readonly c0: number;
  readonly c1: number;
  readonly c2: number;
}

interface StepSample {
  readonly rows: number;
  readonly keys: number;
  readonly ms: number;
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

/**
 * Least absolute deviations, by iteratively reweighted least squares: each
 * pass weights a step by 1 / |its residual| under the previous fit, so a
 * step that stalled (or finished early) pulls the fit by its sign, not its
 * size: the multivariate median of the steps rather than their mean.
 */
function robustFit(samples: readonly StepSample[]): CostFit | null {
  let fit = nonNegativeFit(samples, null);
  if (fit === null || samples.length < 4) return fit;
  // Residuals below δ count as δ, so an exact fit keeps finite, equal weights.
  const delta = 1e-3 * median(samples.map((s) => s.ms)) + 1e-12;
  for (let pass = 0; pass < IRLS_PASSES; pass++) {
    const f: CostFit = fit;
    const weights = samples.map((s) => 1 / Math.max(delta, Math.abs(s.ms - predict(f, s))));
    fit = nonNegativeFit(samples, weights) ?? f;
  }
  return fit;
}

/** Reweighting passes of robustFit: enough to settle a median fit from the least-squares start. */
const IRLS_PASSES = 8;

function predict(c: CostFit, s: StepSample): number {
  return c.c0 + c.c1 * s.rows + c.c2 * s.keys;
}

/**
 * The non-negative (weighted) least-squares fit of ms on (1, rows, keys): the
 * smallest-error fit among the ordinary least-squares fits on each subset of
 * the three terms whose coefficients are all ≥ 0 (the non-negative optimum is
 * the unconstrained optimum on its own positive terms, so it is among them).
 * One pass gathers the moments; each subset solves its normal equations from
 * them. Null without samples.
 */
function nonNegativeFit(samples: readonly StepSample[], weights: readonly number[] | null): CostFit | null {
  if (samples.length === 0) return null;
  // Moments of x = (1, rows, keys / 1000) (keys in thousands keep them well scaled) and y = ms.
  const xx = [
    [0, 0, 0],
    [0, 0, 0],
    [0, 0, 0],
  ];
  const xy = [0, 0, 0];
  let yy = 0;
  for (const [n, s] of samples.entries()) {
    const w = weights === null ? 1 : weights[n]!;
    const x = [1, s.rows, s.keys / 1000];
    for (let i = 0; i < 3; i++) {
      for (let j = 0; j < 3; j++) xx[i]![j]! += w * x[i]! * x[j]!;
      xy[i]! += w * x[i]! * s.ms;
    }
    yy += w * s.ms * s.ms;
  }
  let best: { c: number[]; sse: number } | null = null;
  for (let mask = 1; mask < 8; mask++) {
    const use = [0, 1, 2].filter((j) => mask & (1 << j));
    const coef = solve(
      use.map((i) => use.map((j) => xx[i]![j]!)),
      use.map((i) => xy[i]!),
    );
    if (coef === null || coef.some((x) => x < 0)) continue;
    // SSE = yᵀy − 2 βᵀXᵀy + βᵀXᵀXβ.
    let sse = yy;
    for (const [a, i] of use.entries()) {
      sse -= 2 * coef[a]! * xy[i]!;
      for (const [b, j] of use.entries()) sse += coef[a]! * coef[b]! * xx[i]![j]!;
    }
    const full = [0, 0, 0];
    for (const [a, i] of use.entries()) full[i] = coef[a]!;
    // Ties (an exact fit by a smaller subset) go to the fuller model, found later.
    if (best === null || sse <= best.sse + 1e-9 * yy) best = { c: full, sse };
  }
  if (best === null) return null;
  return { c0: best.c[0]!, c1: best.c[1]!, c2: best.c[2]! / 1000 };
}

/** Solves a·β = b (a small symmetric system) by Gaussian elimination; null when singular. */
function solve(a0: readonly (readonly number[])[], b: readonly number[]): number[] | null {
  const k = b.length;
  const a = a0.map((row, i) => [...row, b[i]!]);
  const scale = Math.max(...a0.flat().map(Math.abs));
  if (!(scale > 0)) return null;
  for (let col = 0; col < k; col++) {
    let pivot = col;
    for (let r = col + 1; r < k; r++) if (Math.abs(a[r]![col]!) > Math.abs(a[pivot]![col]!)) pivot = r;
    if (Math.abs(a[pivot]![col]!) <= 1e-10 * scale) return null;
    [a[col], a[pivot]] = [a[pivot]!, a[col]!];
    for (let r = 0; r < k; r++) {
      if (r === col) continue;
      const f = a[r]![col]! / a[col]![col]!;
      for (let j = col; j <= k; j++) a[r]![j]! -= f * a[col]![j]!;
    }
  }
  return a.map((row, i) => row[k]! / row[i]!);
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
