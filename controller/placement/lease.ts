/**
 * The placement authority's lease, as the candidate sees it (pure).
 *
 * The catalog writer is the lease's only clock (catalog/db.ts): an acquire
 * holds until the writer's time + ttl; another holder's acquire is refused
 * until then; a placement is refused unless the lease is held, unexpired, at
 * the placement's epoch. So two authorities never both have placements
 * accepted at one epoch, whatever their clocks say.
 *
 * A candidate still needs its own view of "am I the holder now?" before it
 * issues anything, and it must never think so longer than the writer does.
 * Its claim starts when it SENT the acquire that the catalog later showed
 * applied: the writer accepted it no earlier, so the writer's expiry is at
 * least sentAt + ttl, and the claim ends at sentAt + ttl − margin on the
 * candidate's monotonic clock. Placements it issues after that, or that the
 * writer sees after a takeover, are refused: late placements are fenced, not
 * trusted to timing.
 */

/** The lease as the catalog holds it (writer clock). */
export interface LeaseFact {
  readonly holder: string;
  readonly epoch: number;
  /** state held (a released lease is not). */
  readonly held: boolean;
  /** Writer clock, ms since the epoch. */
  readonly expiresAt: number;
}

/** What this candidate may act on: an epoch and until when (its own monotonic clock). */
export interface LeaseClaim {
  readonly epoch: number;
  readonly validUntilMs: number;
}

export type LeaseAction =
  | { readonly kind: "acquire"; readonly epoch: number }
  | { readonly kind: "renew"; readonly epoch: number }
  | { readonly kind: "wait"; readonly reason: string };

/**
 * The next lease proposal for candidate `me`. `wallNowMs` is this process's
 * wall clock, used only to skip proposals the writer would refuse (a held,
 * unexpired lease of another); a skewed clock costs a refused proposal or a
 * later takeover, never a second holder.
 */
export function nextLeaseAction(
  fact: LeaseFact | null,
  me: string,
  claim: LeaseClaim | null,
  wallNowMs: number,
): LeaseAction {
  if (fact === null) return { kind: "acquire", epoch: 1 };
  if (fact.holder === me && fact.held && claim !== null && claim.epoch === fact.epoch)
    return { kind: "renew", epoch: fact.epoch };
  if (fact.held && fact.holder !== me && wallNowMs < fact.expiresAt)
    return {
      kind: "wait",
      reason: `held by ${fact.holder} at epoch ${fact.epoch} for ~${Math.round(fact.expiresAt - wallNowMs)} ms`,
    };
  return { kind: "acquire", epoch: fact.epoch + 1 };
}

/** The claim an applied acquire or renewal sent at `sentAtMs` (monotonic) gives. */
export function claimFrom(epoch: number, sentAtMs: number, ttlMs: number, marginMs: number): LeaseClaim {
  return { epoch, validUntilMs: sentAtMs + ttlMs - marginMs };
}

/** Whether the claim lets this candidate issue placements at `monoNowMs`. */
export function mayIssue(claim: LeaseClaim | null, monoNowMs: number): claim is LeaseClaim {
  return claim !== null && monoNowMs < claim.validUntilMs;
}
