import { describe, expect, it } from "vitest";
import { Prng } from "../../controller/sim/prng.ts";
import { FAULT_KINDS, planFaults } from "../../deploy/chaos/plan.ts";

const roles = ["writer-a", "writer-b", "controller", "worker-0", "worker-1"];
const opts = { durationMs: 45_000, count: 8, kinds: FAULT_KINDS, roles, ownerRole: "worker-0" };

describe("chaos plan (pure, seeded)", () => {
  it("one seed names one plan; another seed another", () => {
    expect(planFaults(new Prng(42), opts)).toEqual(planFaults(new Prng(42), opts));
    expect(planFaults(new Prng(42), opts)).not.toEqual(planFaults(new Prng(43), opts));
  });

  it("covers every kind and every role's kill, one fault per slot, healed before the next slot", () => {
    for (let seed = 1; seed <= 200; seed++) {
      const plan = planFaults(new Prng(seed), opts);
      expect(plan).toHaveLength(8);
      expect(new Set(plan.map((f) => f.kind))).toEqual(new Set(FAULT_KINDS));
      expect(new Set(plan.filter((f) => f.kind === "kill").map((f) => f.role))).toEqual(new Set(roles));
      const slot = opts.durationMs / opts.count;
      plan.forEach((f, i) => {
        expect(f.atMs).toBeGreaterThanOrEqual(i * slot);
        expect(f.atMs + f.holdMs).toBeLessThan((i + 1) * slot);
        if (f.kind === "second_owner") expect(f.role).toBe("worker-0");
      });
    }
  });

  it("refuses a plan without faults, kinds or roles", () => {
    expect(() => planFaults(new Prng(1), { ...opts, count: 0 })).toThrow(/count/);
    expect(() => planFaults(new Prng(1), { ...opts, roles: [] })).toThrow(/roles/);
  });
});
