import type { Prng } from "../../controller/sim/prng.ts";

/**
 * The schedule of a chaos run: pure, from a seed, so a failing seed names
 * the same faults in the same order at the same offsets again (what the
 * processes do in between still depends on timing; the schedule does not).
 *
 * The run is cut into `count` equal slots; each slot holds one fault, at a
 * random offset in its first half, held for a random part of the rest, so a
 * fault has healed before the next begins and every fault kind and every
 * role's kill appears (kinds and roles are dealt round-robin from shuffled
 * decks, so `count` ≥ kinds + roles covers each at least once).
 */

export const FAULT_KINDS = ["kill", "second_owner", "disk_full", "s3_pause"] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];

export interface Fault {
  readonly kind: FaultKind;
  /** Offset from the start of the faulty phase. */
  readonly atMs: number;
  /** How long it is held before it heals (disk freed, S3 resumed); 0 for a kill. */
  readonly holdMs: number;
  /** The role a kill or a second owner targets. */
  readonly role: string;
}

export interface PlanOptions {
  readonly durationMs: number;
  readonly count: number;
  readonly kinds: readonly FaultKind[];
  /** Roles that may be killed, in a fixed order (the seed shuffles them). */
  readonly roles: readonly string[];
  /** The role whose data dir a second owner targets. */
  readonly ownerRole: string;
}

function shuffled<T>(rng: Prng, xs: readonly T[]): T[] {
  const out = [...xs];
  for (let i = out.length - 1; i > 0; i--) {
    const j = rng.int(0, i);
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

export function planFaults(rng: Prng, o: PlanOptions): Fault[] {
  if (!Number.isSafeInteger(o.count) || o.count < 1)
    throw new RangeError(`count must be ≥ 1, got ${o.count}`);
  if (o.kinds.length === 0 || o.roles.length === 0) throw new RangeError("a plan needs kinds and roles");
  const slot = o.durationMs / o.count;
  // Kills are dealt once per role, the other kinds once each, then round-robin again.
  const deck: FaultKind[] = [];
  const kinds = o.kinds.filter((k) => k !== "kill");
  const kills = o.kinds.includes("kill") ? o.roles.length : 0;
  while (deck.length < o.count) {
    const round = shuffled(rng, [...kinds, ...Array.from({ length: kills }, () => "kill" as const)]);
    deck.push(...round);
  }
  let roles: string[] = [];
  const out: Fault[] = [];
  for (let i = 0; i < o.count; i++) {
    const kind = deck[i]!;
    if (roles.length === 0) roles = shuffled(rng, o.roles);
    const role = kind === "kill" ? roles.pop()! : o.ownerRole;
    const atMs = Math.round(i * slot + rng.float() * slot * 0.5);
    const holdMs =
      kind === "kill" || kind === "second_owner" ? 0 : Math.round(slot * (0.15 + rng.float() * 0.25));
    out.push({ kind, atMs, holdMs, role });
  }
  return out;
}
