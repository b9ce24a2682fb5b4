import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  ModelFingerprint,
  type PageCount,
  type PrefixHash,
  RequestId,
  TokenCount,
} from "../../../schema/ids.ts";
import { planIteration } from "../../../worker/scheduler/plan-iteration.ts";
import { type Budgets, type RequestRecord, SchedulerInputError } from "../../../worker/scheduler/request.ts";

const MODEL = ModelFingerprint("a".repeat(64));

function budgets(over: Partial<Budgets> = {}): Budgets {
  return {
    model: MODEL,
    pageTokens: 16,
    maxBatchTokens: 64,
    maxBatchSeqs: 8,
    minPrefillTokens: 8,
    prefillTile: 32,
    availablePages: 1000 as PageCount,
    ...over,
  };
}

function request(
  id: string,
  over: Partial<RequestRecord> & { prompt?: number; done?: number } = {},
): RequestRecord {
  const len = over.prompt ?? 10;
  const tokens = over.tokens ?? Array.from({ length: len }, (_, i) => i + 1);
  return {
    id: RequestId(id),
    model: MODEL,
    tokens,
    processed: TokenCount(over.done ?? 0),
    pendingToken: tokens[tokens.length - 1]!,
    priority: 0,
    arrival: 0,
    state: "running",
    runnable: true,
    admitPages: 0 as PageCount,
    reservedPages: 0 as PageCount,
    releasablePages: 0 as PageCount,
    preempted: null,
    nextPageHash: null,
    ...over,
  };
}

/** Running, runnable requests: decode (prompt fully processed) or prefill with random progress. */
const arbRequests = fc
  .array(
    fc.record({
      prompt: fc.integer({ min: 1, max: 200 }),
      progress: fc.double({ min: 0, max: 1, noNaN: true }),
      decode: fc.boolean(),
      priority: fc.integer({ min: 0, max: 3 }),
      arrival: fc.integer({ min: 0, max: 50 }),
      runnable: fc.boolean(),
    }),
    { maxLength: 30 },
  )
  .map((rs) =>
    rs.map((r, i) =>
      request(`q${i}`, {
        prompt: r.prompt,
        done: r.decode ? r.prompt - 1 : Math.floor((r.prompt - 1) * r.progress),
        priority: r.priority,
        arrival: r.arrival,
        runnable: r.runnable || r.decode,
      }),
    ),
  );

const arbBudgets = fc
  .record({
    maxBatchTokens: fc.integer({ min: 1, max: 128 }),
    maxBatchSeqs: fc.integer({ min: 1, max: 16 }),
    minPrefillTokens: fc.integer({ min: 0, max: 64 }),
    prefillTile: fc.integer({ min: 1, max: 64 }),
  })
  .map((b) => budgets(b));

const isDecode = (r: RequestRecord) => r.processed === r.tokens.length - 1;

describe("planIteration", () => {
  it("respects token and sequence budgets, gives every decode lane one row, and schedules decodes first", () => {
    fc.assert(
      fc.property(arbRequests, arbBudgets, (reqs, b) => {
        const plan = planIteration(reqs, b);
        const total = plan.scheduled.reduce((s, w) => s + w.tokens, 0);
        expect(total).toBeLessThanOrEqual(b.maxBatchTokens);
        expect(plan.scheduled.length).toBeLessThanOrEqual(b.maxBatchSeqs);
        expect(plan.unusedTokens).toBe(b.maxBatchTokens - total);
        const byId = new Map(reqs.map((r) => [r.id, r]));
        const firstOther = plan.scheduled.findIndex((w) => w.phase !== "decode");
        plan.scheduled.forEach((w, i) => {
          const r = byId.get(w.id)!;
          if (w.phase === "decode") {
            expect(isDecode(r)).toBe(true);
            expect(w.tokens).toBe(1);
            if (firstOther >= 0) expect(i).toBeLessThan(firstOther);
          } else {
            expect(w.tokens).toBeGreaterThan(0);
            expect(w.tokens).toBeLessThanOrEqual(Math.min(b.prefillTile, r.tokens.length - 1 - r.processed));
          }
        });
        // Each request is either scheduled or deferred, never both, never lost.
        const ids = [...plan.scheduled.map((w) => w.id), ...plan.deferred.map((d) => d.id)];
        expect(new Set(ids).size).toBe(reqs.length);
        // Prefill beats a waiting decode only through the minimum prefill hold.
        const otherTokens = plan.scheduled
          .filter((w) => w.phase !== "decode")
          .reduce((s, w) => s + w.tokens, 0);
        const otherLanes = plan.scheduled.filter((w) => w.phase !== "decode").length;
        const deferredDecode = plan.deferred.filter((d) => isDecode(byId.get(d.id)!));
        if (deferredDecode.some((d) => d.reason === "token-budget"))
          expect(otherTokens).toBeLessThanOrEqual(Math.min(b.minPrefillTokens, b.maxBatchTokens));
        if (deferredDecode.some((d) => d.reason === "sequence-budget"))
          expect(otherLanes).toBeLessThanOrEqual(1);
        for (const d of plan.deferred) if (!byId.get(d.id)!.runnable) expect(d.reason).toBe("awaiting-pages");
      }),
      { numRuns: 300 },
    );
  });

  it("is replayable: the same requests in any order give a deep-equal plan", () => {
    fc.assert(
      fc.property(
        arbRequests.chain((rs) =>
          fc.tuple(fc.constant(rs), fc.shuffledSubarray(rs, { minLength: rs.length })),
        ),
        arbBudgets,
        ([rs, shuffled], b) => {
          const plan = planIteration(rs, b);
          expect(planIteration(structuredClone(rs), b)).toEqual(plan);
          expect(planIteration(shuffled, b)).toEqual(plan);
        },
      ),
      { numRuns: 200 },
    );
  });

  it("finishes every prompt within a bounded number of iterations under a flood of decodes", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({ prompt: fc.integer({ min: 2, max: 120 }), arrives: fc.integer({ min: 0, max: 30 }) }),
          {
            minLength: 1,
            maxLength: 8,
          },
        ),
        fc.integer({ min: 1, max: 16 }),
        fc.integer({ min: 1, max: 40 }),
        (prompts, minPrefill, tile) => {
          const b = budgets({
            maxBatchTokens: 32,
            maxBatchSeqs: 8,
            minPrefillTokens: minPrefill,
            prefillTile: tile,
          });
          // 40 decode lanes that never finish: more than the whole budget.
          const decodes = Array.from({ length: 40 }, (_, i) =>
            request(`d${i}`, { prompt: 2, done: 1, arrival: -1 }),
          );
          const state = new Map(prompts.map((p, i) => [`p${i}`, { ...p, done: 0 }]));
          const perIteration = Math.min(minPrefill, tile);
          const finished = new Map<string, number>();
          for (let it = 0; it < 2000 && finished.size < prompts.length; it++) {
            const reqs = [...decodes];
            for (const [id, p] of state)
              if (p.arrives <= it && !finished.has(id))
                reqs.push(request(id, { prompt: p.prompt, done: p.done, arrival: p.arrives }));
            const plan = planIteration(reqs, b);
            for (const w of plan.scheduled) {
              const p = state.get(w.id);
              if (!p) continue;
              p.done += w.tokens;
              if (p.done === p.prompt - 1) finished.set(w.id, it);
            }
          }
          // The oldest prompt advances ≥ min(minPrefill, tile) rows per iteration, so a prompt
          // waits at most for the prompts that arrived no later than it, one after another.
          for (const [id, p] of state) {
            const ahead = [...state.values()].filter((q) => q.arrives <= p.arrives);
            const bound = ahead.reduce((s, q) => s + Math.ceil((q.prompt - 1) / perIteration), 0);
            expect(finished.get(id), id).toBeLessThanOrEqual(p.arrives + bound);
          }
        },
      ),
      { numRuns: 100 },
    );
  });

  it("preempts the lowest-priority, latest request first, and only as many as needed", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            priority: fc.integer({ min: 0, max: 4 }),
            arrival: fc.integer({ min: 0, max: 20 }),
            pages: fc.integer({ min: 1, max: 6 }),
          }),
          { minLength: 1, maxLength: 12 },
        ),
        fc.integer({ min: 1, max: 30 }),
        (running, need) => {
          const reqs = running.map((r, i) =>
            request(`r${i}`, {
              priority: r.priority,
              arrival: r.arrival,
              releasablePages: r.pages as PageCount,
              prompt: 40,
              done: 39,
            }),
          );
          const w = request("w", {
            priority: 5,
            arrival: 100,
            state: "waiting",
            admitPages: need as PageCount,
          });
          const plan = planIteration([...reqs, w], budgets({ availablePages: 0 as PageCount }));
          const order = [...reqs].sort(
            (a, b) =>
              a.priority - b.priority || b.arrival - a.arrival || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0),
          );
          const supply = reqs.reduce((s, r) => s + r.releasablePages, 0);
          if (supply < need) {
            expect(plan.preempt).toEqual([]);
            expect(plan.admit).toEqual([]);
            return;
          }
          // Victims are a prefix of (lowest priority, latest arrival) order, minimal for the need.
          const ids = plan.preempt.map((p) => p.id);
          expect(ids).toEqual(order.slice(0, ids.length).map((r) => r.id));
          const freed = plan.preempt.reduce((s, p) => s + p.freesPages, 0);
          expect(freed).toBeGreaterThanOrEqual(need);
          expect(freed - plan.preempt.at(-1)!.freesPages).toBeLessThan(need);
          expect(plan.admit).toEqual([{ id: "w", pages: need, resumedFrom: null }]);
          for (const id of ids) expect(plan.scheduled.find((s) => s.id === id)).toBeUndefined();
        },
      ),
      { numRuns: 200 },
    );
  });

  it("keeps a victim resident when its reservation covers the need, else drops its route", () => {
    const w = request("w", { priority: 9, state: "waiting", admitPages: 3 as PageCount });
    const keep = request("k", { reservedPages: 5 as PageCount, releasablePages: 4 as PageCount, done: 9 });
    const b0 = budgets({ availablePages: 0 as PageCount });
    expect(planIteration([keep, w], b0).preempt[0]).toMatchObject({
      id: "k",
      disposition: "keep-resident",
      freesPages: 5,
    });
    const long = request("l", {
      prompt: 100,
      done: 99,
      reservedPages: 1 as PageCount,
      releasablePages: 6 as PageCount,
    });
    expect(planIteration([long, w], b0).preempt[0]).toMatchObject({ disposition: "drop", freesPages: 7 });
  });

  it("resumes a preempted request when pages are free and never preempts for an equal priority", () => {
    const p = request("p", {
      state: "waiting",
      preempted: "drop",
      admitPages: 2 as PageCount,
      runnable: false,
    });
    const plan = planIteration([p], budgets({ availablePages: 2 as PageCount }));
    expect(plan.admit).toEqual([{ id: "p", pages: 2, resumedFrom: "drop" }]);
    expect(plan.deferred).toEqual([{ id: "p", reason: "awaiting-pages" }]);
    const peer = request("x", { releasablePages: 9 as PageCount, done: 9 });
    const blocked = planIteration([peer, p], budgets({ availablePages: 0 as PageCount }));
    expect(blocked.preempt).toEqual([]);
    expect(blocked.deferred).toContainEqual({ id: "p", reason: "not-admitted" });
  });

  it("rejects bad input with a clear error: foreign model, a request twice", () => {
    expect(() =>
      planIteration([request("a", { model: ModelFingerprint("b".repeat(64)) })], budgets()),
    ).toThrow(/not this worker/);
    expect(() => planIteration([request("a", { priority: Number.NaN })], budgets())).toThrow(
      SchedulerInputError,
    );
    expect(() => planIteration([request("a"), request("a")], budgets())).toThrow(/twice/);
  });
});

describe("planIteration: in-flight prefix sharing", () => {
  const P = 4;
  /** Requests whose next pages may share hashes: `group` picks one of three shared prefixes. */
  const arbSharing = fc
    .array(
      fc.record({
        group: fc.integer({ min: 0, max: 2 }),
        pages: fc.integer({ min: 1, max: 6 }),
        page: fc.integer({ min: 0, max: 5 }),
        offset: fc.integer({ min: 0, max: P - 1 }),
        aligned: fc.boolean(),
        arrival: fc.integer({ min: 0, max: 20 }),
        priority: fc.integer({ min: 0, max: 2 }),
        runnable: fc.boolean(),
      }),
      { maxLength: 24 },
    )
    .map((rs) =>
      rs.map((r, i) => {
        const page = Math.min(r.page, r.pages - 1);
        const done = page * P + (r.aligned ? 0 : r.offset);
        return request(`w${i}`, {
          prompt: r.pages * P + 2,
          done,
          arrival: r.arrival,
          priority: r.priority,
          runnable: r.runnable,
          nextPageHash: `g${r.group}:${page}` as PrefixHash,
        });
      }),
    );

  it("defers a waiter only behind a lane of the same page that this plan schedules, and computes no page twice from its start", () => {
    fc.assert(
      fc.property(arbSharing, arbBudgets, (reqs, b0) => {
        const b = { ...b0, pageTokens: P };
        const plan = planIteration(reqs, b);
        const byId = new Map(reqs.map((r) => [r.id, r]));
        const lanes = new Map(plan.scheduled.map((w) => [w.id, w]));
        for (const d of plan.deferred) {
          if (d.reason !== "awaiting-prefix") continue;
          const waiter = byId.get(d.id)!;
          const producer = byId.get(d.producer!)!;
          // The producer computes the very page the waiter needs, in this plan: each
          // iteration a request waits, that page gains ≥ 1 row (the wait is bounded).
          expect(lanes.get(producer.id)?.phase).toBe("prefill");
          expect(producer.nextPageHash).toBe(waiter.nextPageHash);
          expect(waiter.processed % P).toBe(0);
          expect(waiter.runnable).toBe(true);
        }
        // No page is started twice: per page hash, at most one scheduled lane starts at its boundary.
        const starts = new Map<string, number>();
        for (const w of plan.scheduled) {
          const r = byId.get(w.id)!;
          if (w.phase !== "prefill" || r.processed % P !== 0) continue;
          starts.set(r.nextPageHash!, (starts.get(r.nextPageHash!) ?? 0) + 1);
        }
        for (const n of starts.values()) expect(n).toBe(1);
        // Waiting costs no budget: the totals still hold.
        expect(plan.scheduled.reduce((s, w) => s + w.tokens, 0)).toBeLessThanOrEqual(b.maxBatchTokens);
        expect(new Set([...plan.scheduled, ...plan.deferred].map((x) => x.id)).size).toBe(reqs.length);
      }),
      { numRuns: 400 },
    );
  });

  it("requests sharing a prefix, joining at random and with a producer cancelled at random, each compute only what nobody has and all finish", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 6 }),
        fc.array(fc.record({ own: fc.integer({ min: 1, max: 9 }), joins: fc.integer({ min: 0, max: 6 }) }), {
          minLength: 1,
          maxLength: 8,
        }),
        fc.record({
          maxBatchTokens: fc.integer({ min: 1, max: 24 }),
          maxBatchSeqs: fc.integer({ min: 1, max: 8 }),
          prefillTile: fc.integer({ min: 1, max: 12 }),
          minPrefillTokens: fc.integer({ min: 0, max: 8 }),
        }),
        fc.option(fc.record({ at: fc.integer({ min: 0, max: 20 }), who: fc.nat() }), { nil: null }),
        (shared, members, sizes, cancel) => {
          const b = budgets({ ...sizes, pageTokens: P });
          // Rows to prefill: `shared` identical pages, then the request's own rows.
          const reqs = members.map((m, i) => ({
            id: `m${i}`,
            rows: shared * P + m.own,
            joins: m.joins,
            done: -1,
            cancelled: false,
          }));
          const sealed = new Set<number>();
          /** Rows of each shared page computed, summed over every request. */
          const computed = new Array<number>(shared).fill(0);
          const hashOf = (r: (typeof reqs)[number], page: number) =>
            ((page + 1) * P > r.rows
              ? null
              : page < shared
                ? `s:${page}`
                : `${r.id}:${page}`) as PrefixHash | null;
          /** Shares sealed pages with a request at a page boundary (what the runtime's adoption does). */
          const adopt = (r: (typeof reqs)[number]) => {
            while (r.done % P === 0 && r.done / P < shared && sealed.has(r.done / P)) r.done += P;
          };
          const totalRows = shared * P + members.reduce((s, m) => s + m.own, 0);
          let it = 0;
          const live = () => reqs.filter((r) => !r.cancelled && r.done < r.rows);
          for (; it < 6 + 2 * totalRows && live().length > 0; it++) {
            for (const r of reqs) {
              if (r.done < 0 && r.joins <= it) r.done = 0;
              if (r.done >= 0 && !r.cancelled) adopt(r);
            }
            const active = live().filter((r) => r.done >= 0);
            if (cancel && cancel.at === it && active.length > 0) {
              active[cancel.who % active.length]!.cancelled = true;
              continue;
            }
            const records = active.map((r, i) =>
              request(r.id, {
                prompt: r.rows + 1,
                done: r.done,
                arrival: i,
                nextPageHash: hashOf(r, Math.floor(r.done / P)),
              }),
            );
            const plan = planIteration(records, b);
            for (const w of plan.scheduled) {
              const r = reqs.find((x) => x.id === w.id)!;
              expect(w.firstRow).toBe(r.done);
              for (let row = r.done; row < r.done + w.tokens; row++) {
                const page = Math.floor(row / P);
                if (page < shared) computed[page]!++;
              }
              r.done += w.tokens;
              for (let page = 0; page < shared; page++) if (r.done >= (page + 1) * P) sealed.add(page);
            }
          }
          // Everyone not cancelled finished, within a bound: each iteration computes ≥ 1
          // row of the distinct work (plus a cancelled producer's lost partial page).
          for (const r of reqs) if (!r.cancelled) expect(r.done, r.id).toBe(r.rows);
          expect(it).toBeLessThanOrEqual(6 + totalRows + P + 1);
          // Each shared page was computed once (a cancelled producer's unsealed page at most twice).
          for (const [page, rows] of computed.entries()) {
            if (cancel) expect(rows, `page ${page}`).toBeLessThanOrEqual(2 * P);
            else expect(rows, `page ${page}`).toBe(P);
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it("rejects a nextPageHash on a page that is not a full page of the prompt", () => {
    const r = request("x", { prompt: 10, done: 8, nextPageHash: "h" as PrefixHash });
    expect(() => planIteration([r], budgets({ pageTokens: 4 }))).toThrow(/not a full page/);
  });
});
