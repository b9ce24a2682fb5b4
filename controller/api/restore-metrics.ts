import { CounterView, type Registry } from "../metrics.ts";

/**
 * Cache hits by tier on /metrics for a process that restores prefixes itself
 * (the embedded default): what its restorer counted where each chunk was read.
 *
 *   continuum_cache_restored_chunks_total{tier}   chunks read into pages, by the tier that served them
 *   continuum_cache_restored_bytes_total{tier}    their bytes
 *   continuum_cache_restored_tokens_total{tier}   prompt rows they filled (whole restores only)
 *   continuum_restores_total{outcome}             completed, or abandoned (recomputed instead)
 *   continuum_restore_fallbacks_total{reason}     a source that failed and the next was tried
 *
 * Tiers are the store's four (ram, ssd, peer, s3); labels are never ids.
 */

export const RESTORE_TIERS = ["ram", "ssd", "peer", "s3"] as const;
export type RestoreTierName = (typeof RESTORE_TIERS)[number];
type PerTier = Readonly<Record<RestoreTierName, number>>;

/** The restorer's counters, as worker/restore's Restorer.stats() reports them (only grow). */
export interface RestoreFigures {
  readonly completed: number;
  readonly abandoned: number;
  readonly chunks: PerTier;
  readonly bytes: PerTier;
  readonly tokens: PerTier;
  readonly fallbacks: { readonly missing: number; readonly corrupt: number; readonly unavailable: number };
}

export function registerRestoreMetrics(registry: Registry, read: () => RestoreFigures): void {
  const perTier = (pick: (f: RestoreFigures) => PerTier) => () => {
    const v = pick(read());
    return RESTORE_TIERS.map((tier) => [{ tier }, v[tier]] as const);
  };
  registry.add(
    new CounterView(
      "continuum_cache_restored_chunks_total",
      "Durable chunks restored into KV pages, by the tier that served them (ram, ssd, peer, s3).",
      perTier((f) => f.chunks),
    ),
  );
  registry.add(
    new CounterView(
      "continuum_cache_restored_bytes_total",
      "Bytes of durable chunks restored into KV pages, by tier.",
      perTier((f) => f.bytes),
    ),
  );
  registry.add(
    new CounterView(
      "continuum_cache_restored_tokens_total",
      "Prompt tokens served from durable chunks instead of prefill, by tier (completed restores).",
      perTier((f) => f.tokens),
    ),
  );
  registry.add(
    new CounterView(
      "continuum_restores_total",
      "Prefix restores: completed, or abandoned (recomputed).",
      () => {
        const f = read();
        return [
          [{ outcome: "completed" }, f.completed],
          [{ outcome: "abandoned" }, f.abandoned],
        ];
      },
    ),
  );
  registry.add(
    new CounterView(
      "continuum_restore_fallbacks_total",
      "Chunk fetches that failed over to the next source: missing, corrupt, unavailable.",
      () => {
        const f = read().fallbacks;
        return [
          [{ reason: "missing" }, f.missing],
          [{ reason: "corrupt" }, f.corrupt],
          [{ reason: "unavailable" }, f.unavailable],
        ];
      },
    ),
  );
}
