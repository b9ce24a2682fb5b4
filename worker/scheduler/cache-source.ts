import type { CacheSource, RepairPolicy } from "./request.ts";
import { repairEligible } from "./request.ts";

/** One way to establish a prompt's attention state, with its predicted completion time. */
export interface SourceCandidate {
  readonly source: CacheSource;
  readonly estimatedMs: number;
}

export interface SourceChoice {
  readonly chosen: SourceCandidate;
  /** Every candidate with why it was or was not eligible, for the decision record. */
  readonly considered: readonly {
    readonly candidate: SourceCandidate;
    readonly eligible: boolean;
    readonly why: string;
  }[];
}

/** Exact sources before approximate ones when predicted times tie. */
const KIND_RANK: Record<CacheSource["kind"], number> = { resident: 0, restore: 1, recompute: 2, repair: 3 };

/**
 * Choose the fastest eligible source. Exact sources (resident, restore,
 * recompute) are always eligible; repair only with the caller's opt-in and a
 * minimum quality that the candidate meets. Ties: kind rank, then more cached
 * tokens. Throws when no candidate is eligible or an estimate is not a finite
 * non-negative number.
 */
export function chooseCacheSource(
  candidates: readonly SourceCandidate[],
  policy: RepairPolicy,
): SourceChoice {
  const considered = candidates.map((candidate) => {
    if (!Number.isFinite(candidate.estimatedMs) || candidate.estimatedMs < 0)
      throw new RangeError(
        `cache source ${candidate.source.kind}: estimate ${candidate.estimatedMs} ms is not ≥ 0`,
      );
    if (candidate.source.kind !== "repair") return { candidate, eligible: true, why: "exact" };
    const q = candidate.source.quality;
    const eligible = repairEligible(policy, q);
    const why = eligible
      ? `quality ${q} ≥ minimum ${policy.minQuality}`
      : !policy.optIn
        ? "repair not opted in"
        : policy.minQuality === null
          ? "no minimum quality given"
          : `quality ${q} < minimum ${policy.minQuality}`;
    return { candidate, eligible, why };
  });
  const cached = (s: CacheSource): number => (s.kind === "recompute" ? 0 : s.tokens);
  const eligible = considered
    .filter((c) => c.eligible)
    .map((c) => c.candidate)
    .sort(
      (a, b) =>
        a.estimatedMs - b.estimatedMs ||
        KIND_RANK[a.source.kind] - KIND_RANK[b.source.kind] ||
        cached(b.source) - cached(a.source),
    );
  const chosen = eligible[0];
  if (!chosen) throw new RangeError(`no eligible cache source among ${candidates.length} candidates`);
  return { chosen, considered };
}
