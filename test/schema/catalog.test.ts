import { Schema } from "effect";
import { describe, expect, it } from "vitest";
import { decodeProposalFast, ProposalBody, ProposalMsg } from "../../schema/catalog.ts";
import { WireError } from "../../schema/wire.ts";
import { CatalogGen, rng } from "../catalog/gen.ts";

const checked = Schema.decodeUnknownSync(ProposalBody as never) as (u: unknown) => unknown;

function outcome(f: () => unknown): { ok: true; value: unknown } | { ok: false } {
  try {
    return { ok: true, value: f() };
  } catch {
    return { ok: false };
  }
}

const ODD_VALUES: unknown[] = [
  null,
  1,
  -1.5,
  "x",
  true,
  [],
  {},
  Number.NaN,
  "chunk.published",
  "replica.bad",
];

describe("proposal decoding: the fast guard agrees with the Effect schema", () => {
  it("on valid proposals and on 5,000 random mutations of them", () => {
    const gen = new CatalogGen(77);
    const r = rng(78);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
    const bodies: unknown[] = [gen.setup()];
    for (let i = 0; i < 500; i++) bodies.push(gen.next());
    let fastRefused = 0;
    let mutated = 0;
    for (let i = 0; i < 5_500; i++) {
      const base = structuredClone(bodies[i % bodies.length]) as Record<string, unknown>;
      if (i >= 500) {
        mutated++;
        const ops = base.ops as Record<string, unknown>[];
        const target: Record<string, unknown> = r() < 0.15 ? base : pick(ops);
        const keys = Object.keys(target);
        const k = r() < 0.15 ? `extra${Math.floor(r() * 3)}` : pick(keys);
        if (r() < 0.3) delete target[k];
        else target[k] = pick(ODD_VALUES);
      }
      const fast = outcome(() => ProposalMsg.decodeBody(base));
      const slow = outcome(() => checked(base));
      expect(fast.ok).toBe(slow.ok);
      if (fast.ok && slow.ok) expect(fast.value).toEqual(slow.value);
      if (decodeProposalFast(base) === undefined) fastRefused++;
    }
    expect(mutated).toBe(5_000);
    expect(fastRefused).toBeGreaterThan(1_000); // the mutations reached the refusing paths
  });

  it("names the bad field when the fast guard refuses", () => {
    expect(() =>
      ProposalMsg.decodeBody({
        id: "p",
        clientId: "c",
        ops: [{ op: "lease.acquire", key: "k", holder: 7, epoch: 1, ttlMs: 1 }],
      }),
    ).toThrow(WireError);
    expect(() =>
      ProposalMsg.decodeBody({
        id: "p",
        clientId: "c",
        ops: [{ op: "lease.acquire", key: "k", holder: 7, epoch: 1, ttlMs: 1 }],
      }),
    ).toThrow(/holder/);
  });
});
