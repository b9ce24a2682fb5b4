import { createHash } from "node:crypto";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { ContinuationId, PrefixHash, TokenCount } from "../../../schema/ids.ts";
import {
  type Calibration,
  type ConfiguredCosts,
  initialCalibration,
  observe,
} from "../../../worker/calibration/calibration.ts";
import { PageManager } from "../../../worker/pages/page-manager.ts";
import {
  applyEviction,
  ineligibility,
  planEviction,
  type ResidencyInputs,
  type RoutePolicy,
} from "../../../worker/residency/residency.ts";

const P = 4;
const h = (s: string) => PrefixHash(createHash("sha256").update(s).digest("hex"));

/** A route of `rows` committed rows, sealed with hashes unique to its name. */
function grow(pm: PageManager, id: ContinuationId, rows: number): void {
  if (rows === 0) return;
  pm.reserve(id, TokenCount(pm.route(id).tokens + rows));
  const before = pm.route(id).tokens;
  pm.beginAppend(id, TokenCount(rows));
  const n = Math.floor((before + rows) / P) - Math.floor(before / P);
  pm.commitAppend(
    id,
    Array.from({ length: n }, (_, k) => h(`${id}/${before}/${k}`)),
  );
}

const routeSpec = fc.record({
  rows: fc.integer({ min: 0, max: 12 }),
  forkOf: fc.option(fc.nat(20), { nil: null }),
  durable: fc.boolean(),
  pinned: fc.boolean(),
  leased: fc.boolean(),
  dirty: fc.boolean(),
  protect: fc.boolean(),
  value: fc.integer({ min: 0, max: 3 }),
  lastAccess: fc.integer({ min: 0, max: 5 }),
});

type RouteSpec = typeof routeSpec extends fc.Arbitrary<infer T> ? T : never;

function build(specs: readonly RouteSpec[]) {
  const pm = new PageManager({ pageTokens: P, physicalPages: 64, debugInvariants: true });
  const ids: ContinuationId[] = [];
  const policies = new Map<ContinuationId, RoutePolicy>();
  const protectedIds = new Set<ContinuationId>();
  specs.forEach((s, i) => {
    const id = ContinuationId(`c${i}`);
    if (s.forkOf !== null && ids.length > 0) pm.fork(ids[s.forkOf % ids.length]!, id);
    else pm.openRoute(id);
    grow(pm, id, s.rows);
    ids.push(id);
    policies.set(id, {
      reuseProbability: 1,
      recomputeMs: s.value,
      reloadMs: 0,
      sharingBonus: 0,
      sloBonus: 0,
    });
    pm.touch(id, s.lastAccess);
    if (s.protect) protectedIds.add(id);
  });
  // Flags last, so forks above were taken from idle routes.
  specs.forEach((s, i) => {
    const id = ids[i]!;
    if (s.durable) pm.markDurable(id);
    if (s.pinned) pm.pin(id);
    if (s.leased) pm.acquireLease([id]);
    if (s.dirty) pm.beginAppend(id, TokenCount(1));
  });
  return { pm, ids, inputs: { policies, protected: protectedIds } satisfies ResidencyInputs };
}

describe("residency", () => {
  it("never plans protected kinds, frees exactly what it claims, and orders by value then oldest", () => {
    fc.assert(
      fc.property(
        fc.array(routeSpec, { maxLength: 12 }),
        fc.integer({ min: 0, max: 80 }),
        (specs, needed) => {
          const { pm, inputs } = build(specs);
          const snap = pm.snapshot();
          const plan = planEviction(snap, needed, inputs);
          const byId = new Map(snap.routes.map((r) => [r.id, r]));
          for (const e of plan.evict) expect(ineligibility(byId.get(e.id)!, inputs)).toBeNull();
          for (let i = 1; i < plan.evict.length; i++) {
            const [a, b] = [plan.evict[i - 1]!, plan.evict[i]!];
            expect(
              a.valuePerPage < b.valuePerPage ||
                (a.valuePerPage === b.valuePerPage && a.lastAccess <= b.lastAccess),
            ).toBe(true);
          }
          const availableBefore = pm.availablePages;
          const report = applyEviction(pm, plan, inputs);
          expect(report.skipped).toEqual([]);
          expect(report.freedPages).toBe(plan.freesPages);
          expect(pm.availablePages).toBe(availableBefore + plan.freesPages);
          if (plan.admissible) expect(pm.availablePages).toBeGreaterThanOrEqual(needed);
          else expect(plan.evict).toEqual([]);
          pm.checkInvariants();
        },
      ),
      { numRuns: 200 },
    );
  });

  it("counts a shared page only once every route holding it is evicted", () => {
    const pm = new PageManager({ pageTokens: P, physicalPages: 8, debugInvariants: true });
    const a = ContinuationId("a");
    const b = ContinuationId("b");
    pm.openRoute(a);
    grow(pm, a, 8);
    pm.fork(a, b);
    grow(pm, b, 4);
    pm.markDurable(a);
    pm.markDurable(b);
    const inputs = { policies: new Map(), protected: new Set<ContinuationId>() };
    pm.touch(a, 1);
    const plan = planEviction(pm.snapshot(), pm.availablePages + 1, inputs);
    // b is older (access 0) so goes first, freeing only its own page; then a frees the two shared ones.
    expect(plan.evict.map((e) => e.id)).toEqual([b]);
    expect(plan.freesPages).toBe(1);
    const all = planEviction(pm.snapshot(), 8, inputs);
    expect(all.evict.map((e) => e.id)).toEqual([b, a]);
    expect(all.freesPages).toBe(3);
  });

  it("revalidates at apply time and skips a route leased since planning", () => {
    const pm = new PageManager({ pageTokens: P, physicalPages: 4, debugInvariants: true });
    const a = ContinuationId("a");
    pm.openRoute(a);
    grow(pm, a, 8);
    pm.markDurable(a);
    const inputs = { policies: new Map(), protected: new Set<ContinuationId>() };
    const plan = planEviction(pm.snapshot(), 4, inputs);
    expect(plan.evict.map((e) => e.id)).toEqual([a]);
    const lease = pm.acquireLease([a]);
    expect(applyEviction(pm, plan, inputs)).toMatchObject({
      evicted: [],
      skipped: [{ id: a, reason: "leased" }],
      freedPages: 0,
    });
    pm.releaseLease(lease);
    expect(applyEviction(pm, plan, { ...inputs, protected: new Set([a]) }).skipped).toEqual([
      { id: a, reason: "protected" },
    ]);
    expect(applyEviction(pm, plan, inputs).freedPages).toBe(2);
    expect(applyEviction(pm, plan, inputs).skipped).toEqual([{ id: a, reason: "gone" }]);
  });
});

const COSTS: ConfiguredCosts = {
  prefillPerTokenMs: 0.5,
  firstTokenMs: 20,
  decodeStepMs: 10,
  restorePerByteMs: { ram: 1e-6, ssd: 1e-5, peer: 2e-5, s3: 1e-4 },
};

describe("calibration", () => {
  it("reports configured values with zero samples until the first measurement replaces them", () => {
    const c0 = initialCalibration(COSTS);
    expect(c0.prefillPerTokenMs).toEqual({ value: 0.5, samples: 0 });
    const c1 = observe(c0, { kind: "prefill", tokens: 100, deviceMs: 30, queueMs: 500 });
    expect(c1.prefillPerTokenMs).toEqual({ value: 0.3, samples: 1 });
    // Queue delay is kept apart: it never leaks into the device cost.
    expect(c1.queueDelayMs).toEqual({ value: 500, samples: 1 });
    expect(c1.firstTokenMs).toEqual({ value: 20, samples: 0 });
    const c2 = observe(c1, { kind: "restore", tier: "ssd", bytes: 1000, deviceMs: 2, queueMs: 0 });
    expect(c2.restorePerByteMs.ssd).toEqual({ value: 0.002, samples: 1 });
    expect(c2.restorePerByteMs.s3.samples).toBe(0);
    expect(() => observe(c2, { kind: "prefill", tokens: 0, deviceMs: 1, queueMs: 0 })).toThrow(/positive/);
  });

  it("converges geometrically to a steady cost: |error| shrinks by (1 − α) per sample", () => {
    fc.assert(
      fc.property(
        fc.double({ min: 0.01, max: 1000, noNaN: true }),
        fc.double({ min: 0.01, max: 1000, noNaN: true }),
        fc.double({ min: 0.05, max: 1, noNaN: true }),
        fc.integer({ min: 1, max: 60 }),
        (first, steady, alpha, n) => {
          let c: Calibration = initialCalibration(COSTS, alpha);
          c = observe(c, { kind: "decode-step", deviceMs: first, queueMs: 0 });
          for (let i = 0; i < n; i++) c = observe(c, { kind: "decode-step", deviceMs: steady, queueMs: 0 });
          const expected = Math.abs(first - steady) * (1 - alpha) ** n;
          expect(Math.abs(c.decodeStepMs.value - steady)).toBeCloseTo(expected, 6);
          expect(c.decodeStepMs.samples).toBe(n + 1);
        },
      ),
      { numRuns: 200 },
    );
  });
});
