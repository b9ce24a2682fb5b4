import { cpus, totalmem } from "node:os";

/**
 * The benchmark contract. A benchmark measures and reports; it never asserts
 * a timing. Figures carry their unit in their name (`get_mb_per_s`,
 * `lookup_p99_ms`); ratios name what they divide (`paged_over_contiguous`)
 * and are measured side by side in one run, since absolute times drift on a
 * shared machine.
 */
export interface BenchOptions {
  /** Finish in under 60 s on the 2-core development machine. */
  readonly quick: boolean;
  /** Progress lines go here (stderr under --json, so stdout stays parseable). */
  readonly log: (line: string) => void;
}

export interface BenchReport {
  readonly figures: Record<string, number | string | boolean | null>;
  readonly ratios: Record<string, number | null>;
  /** Extra facts about the run (sizes, model, tiers) merged into `env`. */
  readonly env?: Record<string, unknown>;
}

/** Each `bench/<name>.ts` default-exports one of these. */
export interface Bench {
  readonly summary: string;
  run(opts: BenchOptions): Promise<BenchReport>;
}

/** The JSON object printed as the last stdout line under --json. */
export interface BenchJson {
  readonly bench: string;
  readonly quick: boolean;
  readonly figures: BenchReport["figures"];
  readonly ratios: BenchReport["ratios"];
  readonly env: Record<string, unknown>;
}

export function benchEnv(): Record<string, unknown> {
  const cpu = cpus();
  return {
    node: process.version,
    platform: `${process.platform}-${process.arch}`,
    cpu: cpu[0]?.model ?? "unknown",
    cores: cpu.length,
    mem_gib: Math.round(totalmem() / 2 ** 30),
    date: new Date().toISOString(),
  };
}

/** Percentile (0..100) of samples by nearest rank; NaN for no samples. */
export function percentile(samples: readonly number[], p: number): number {
  if (samples.length === 0) return Number.NaN;
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank]!;
}

/** Rounds a figure for printing without losing its order of magnitude. */
export function round(x: number, digits = 3): number {
  if (!Number.isFinite(x) || x === 0) return x;
  const scale = 10 ** Math.max(0, digits - Math.ceil(Math.log10(Math.abs(x))));
  return Math.round(x * scale) / scale;
}
