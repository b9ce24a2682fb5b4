/**
 * A step's device time as a linear function of its shape, fitted robustly to
 * measured steps (pure):
 *   stepMs ≈ c₀ + c₁ · rows + c₂ · keys
 * where c₀ is a pass over the weights, c₁ each row's share of the matrix
 * products and c₂ each attended key's (a row at position p attends p + 1).
 * The prefill pacer sizes tiles with it.
 */

/** stepMs ≈ c0 + c1 · rows + c2 · keys; every coefficient ≥ 0. */
export interface CostFit {
  readonly c0: number;
  readonly c1: number;
  readonly c2: number;
}

export interface StepSample {
  readonly rows: number;
  readonly keys: number;
  readonly ms: number;
}

/**
 * Least absolute deviations, by iteratively reweighted least squares: each
 * pass weights a step by 1 / |its residual| under the previous fit, so a
 * step that stalled (or finished early) pulls the fit by its sign, not its
 * size: the multivariate median of the steps rather than their mean.
 */
export function robustFit(samples: readonly StepSample[]): CostFit | null {
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
