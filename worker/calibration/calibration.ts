import type { StepSample } from "./step-cost-fit.ts";

/** Tiers a restore can read from, cheapest-to-reach first. */
export type RestoreTier = "ram" | "ssd" | "peer" | "s3";
export const RESTORE_TIERS: readonly RestoreTier[] = ["ram", "ssd", "peer", "s3"];

/**
 * One smoothed cost. Until the first sample it is the configured value
 * (samples = 0); the first sample replaces it; later ones blend in by an
 * exponentially weighted moving average: value ← value + α (sample − value).
 */
export interface Estimate {
  readonly value: number;
  readonly samples: number;
}

/** Configured costs used before any measurement. Milliseconds. */
export interface ConfiguredCosts {
  readonly prefillPerTokenMs: number;
  readonly firstTokenMs: number;
  readonly decodeStepMs: number;
  readonly restorePerByteMs: Readonly<Record<RestoreTier, number>>;
}

/**
 * Measured costs with sample counts, as published in heartbeats.
 *
 * A prompt's prefill rows run in one or more prefill steps, and its last
 * token in the step after them (a one-row lane that wants logits). Over the
 * last PREFILL_STEP_WINDOW steps with prefill rows, prefillPerTokenMs =
 * Σ ms / Σ rows: a row with its share of each step's pass, what recomputing
 * a token costs the worker (the router, checkpoint admission, residency and
 * restore plans read it). The first-token step and the rest are smoothed one
 * sample at a time.
 */
export interface Calibration {
  /** Smoothing weight of a new sample after the first. */
  readonly alpha: number;
  readonly prefillPerTokenMs: Estimate;
  /** The step that computes a prompt's last token and samples the first. */
  readonly firstTokenMs: Estimate;
  /** The last PREFILL_STEP_WINDOW prefill steps, oldest first, with their prefill rows' keys. */
  readonly prefillSteps: readonly PrefillStep[];
  readonly decodeStepMs: Estimate;
  readonly restorePerByteMs: Readonly<Record<RestoreTier, Estimate>>;
  /** Time work waited before the device ran it; kept apart so load is not counted as hardware cost. */
  readonly queueDelayMs: Estimate;
}

/** One step with prefill rows: all its rows and keys (the fit's), and its prefill rows' share. */
export interface PrefillStep extends StepSample {
  readonly prefillRows: number;
  readonly prefillKeys: number;
}

/** Prefill steps the per-row cost looks back over: a few prompts' worth, so it follows a machine whose speed changes. */
export const PREFILL_STEP_WINDOW = 64;

/**
 * A measurement. `deviceMs` is accelerator (or transfer engine) time alone;
 * `queueMs` is how long the work waited before it started.
 */
export type Sample =
  | {
      readonly kind: "prefill-step";
      /** All the step's rows (decode and prefill) and their attended keys. */
      readonly rows: number;
      readonly keys: number;
      readonly prefillRows: number;
      readonly prefillKeys: number;
      readonly deviceMs: number;
      readonly queueMs: number;
    }
  | { readonly kind: "first-token"; readonly deviceMs: number; readonly queueMs: number }
  | { readonly kind: "decode-step"; readonly deviceMs: number; readonly queueMs: number }
  | {
      readonly kind: "restore";
      readonly tier: RestoreTier;
      readonly bytes: number;
      readonly deviceMs: number;
      readonly queueMs: number;
    };

/** Default smoothing: a sample's weight halves after ln 2 / −ln(1 − 0.2) ≈ 3.1 newer samples. */
export const DEFAULT_ALPHA = 0.2;

function nonNegative(what: string, v: number): number {
  if (!Number.isFinite(v) || v < 0) throw new RangeError(`${what} must be a finite number ≥ 0, got ${v}`);
  return v;
}

const configured = (value: number): Estimate => ({ value, samples: 0 });

export function initialCalibration(costs: ConfiguredCosts, alpha = DEFAULT_ALPHA): Calibration {
  if (!(alpha > 0 && alpha <= 1)) throw new RangeError(`calibration alpha must be in (0, 1], got ${alpha}`);
  const restore = {} as Record<RestoreTier, Estimate>;
  for (const t of RESTORE_TIERS)
    restore[t] = configured(nonNegative(`restorePerByteMs.${t}`, costs.restorePerByteMs[t]));
  return {
    alpha,
    prefillPerTokenMs: configured(nonNegative("prefillPerTokenMs", costs.prefillPerTokenMs)),
    firstTokenMs: configured(nonNegative("firstTokenMs", costs.firstTokenMs)),
    decodeStepMs: configured(nonNegative("decodeStepMs", costs.decodeStepMs)),
    prefillSteps: [],
    restorePerByteMs: restore,
    queueDelayMs: configured(0),
  };
}

/** Fold one sample into an estimate: the first replaces the configured value, later ones are smoothed. */
export function smooth(e: Estimate, sample: number, alpha: number): Estimate {
  if (e.samples === 0) return { value: sample, samples: 1 };
  return { value: e.value + alpha * (sample - e.value), samples: e.samples + 1 };
}

function positiveInteger(what: string, v: number): number {
  if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`${what} must be a positive integer, got ${v}`);
  return v;
}

/** The window's ms per row (see Calibration). */
function msPerRow(steps: readonly PrefillStep[]): number {
  let ms = 0;
  let rows = 0;
  for (const s of steps) {
    ms += s.ms;
    rows += s.rows;
  }
  return ms / rows;
}

/** A new calibration with `s` folded in. Pure; throws on a malformed sample and returns nothing changed. */
export function observe(c: Calibration, s: Sample): Calibration {
  const queueDelayMs = smooth(c.queueDelayMs, nonNegative(`${s.kind} queueMs`, s.queueMs), c.alpha);
  const device = nonNegative(`${s.kind} deviceMs`, s.deviceMs);
  switch (s.kind) {
    case "prefill-step": {
      const step: PrefillStep = {
        rows: positiveInteger("prefill step rows", s.rows),
        keys: nonNegative("prefill step keys", s.keys),
        prefillRows: positiveInteger("prefill step prefillRows", s.prefillRows),
        prefillKeys: nonNegative("prefill step prefillKeys", s.prefillKeys),
        ms: device,
      };
      if (step.prefillRows > step.rows)
        throw new RangeError(`prefill step has ${step.prefillRows} prefill rows of ${step.rows}`);
      const prefillSteps = [...c.prefillSteps.slice(-(PREFILL_STEP_WINDOW - 1)), step];
      return {
        ...c,
        queueDelayMs,
        prefillSteps,
        prefillPerTokenMs: { value: msPerRow(prefillSteps), samples: c.prefillPerTokenMs.samples + 1 },
      };
    }
    case "first-token":
      return { ...c, queueDelayMs, firstTokenMs: smooth(c.firstTokenMs, device, c.alpha) };
    case "decode-step":
      return { ...c, queueDelayMs, decodeStepMs: smooth(c.decodeStepMs, device, c.alpha) };
    case "restore": {
      if (!RESTORE_TIERS.includes(s.tier)) throw new RangeError(`unknown restore tier ${String(s.tier)}`);
      positiveInteger("restore sample bytes", s.bytes);
      const tiers = {
        ...c.restorePerByteMs,
        [s.tier]: smooth(c.restorePerByteMs[s.tier], device / s.bytes, c.alpha),
      };
      return { ...c, queueDelayMs, restorePerByteMs: tiers };
    }
  }
}

/**
 * Owns the current calibration for one worker: a small mutable holder around
 * the pure functions, so the runtime records samples and heartbeats read values.
 */
export class CostCalibrator {
  private current: Calibration;
  constructor(costs: ConfiguredCosts, alpha = DEFAULT_ALPHA) {
    this.current = initialCalibration(costs, alpha);
  }
  record(sample: Sample): void {
    this.current = observe(this.current, sample);
  }
  get value(): Calibration {
    return this.current;
  }
}
