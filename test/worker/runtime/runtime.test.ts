import { Effect } from "effect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Engine } from "../../../native/engine.ts";
import { RequestId } from "../../../schema/ids.ts";
import { silentLogger } from "../../../schema/log.ts";
import { resource } from "../../../schema/scope.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { loadEngine } from "../../../worker/runtime/engine-load.ts";
import { WorkerRuntime } from "../../../worker/runtime/runtime.ts";
import type { SubmitRequest } from "../../../worker/runtime/runtime-api.ts";
import type { RuntimeEvent } from "../../../worker/runtime/sequence.ts";
import {
  collect,
  greedyRequest,
  openRuntime,
  prompt,
  type RuntimeFixture,
  startRuntime,
  tinyModel,
} from "./fixture.ts";

let model: LoadedModel;
let cleanup: () => Promise<void>;

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
});
afterAll(async () => {
  await cleanup();
});

const request = greedyRequest;

async function run(rt: WorkerRuntime, req: SubmitRequest) {
  return collect(rt.submit(req).events);
}

/** A deterministic pseudo-random prompt over the tiny vocabulary. */

function expectNoLeak(f: RuntimeFixture) {
  const snap = f.runtime.pages.snapshot();
  expect(snap.reservedPages).toBe(0);
  expect(snap.routes.every((r) => r.id.startsWith("cache:"))).toBe(true);
  f.runtime.pages.checkInvariants();
}

describe("worker runtime (tiny model, real engine)", () => {
  it("64 concurrent requests with shared prefixes produce exactly the tokens each produces alone", async () => {
    const shared = [prompt(1, 40), prompt(2, 70), prompt(3, 23)];
    const reqs = Array.from({ length: 64 }, (_, i) => {
      const p = [...shared[i % 3]!, ...prompt(100 + i, 3 + (i % 11))];
      const sampled = i % 4 === 0;
      return request(`r${i}`, p, 4 + (i % 9), sampled ? { temperature: 0.8, topK: 40, seed: i } : {});
    });
    const alone = await startRuntime(model);
    const expected: number[][] = [];
    for (const r of reqs) {
      // A fresh id each time, so nothing about the run depends on being first.
      const out = await run(alone.runtime, { ...r, requestId: RequestId(`${r.requestId}-alone`) });
      expect(out.end).toMatchObject({ type: "end", reason: "length" });
      expected.push(out.tokens);
    }
    await alone.close();

    const together = await startRuntime(model);
    const results = await Promise.all(reqs.map((r) => run(together.runtime, r)));
    for (let i = 0; i < reqs.length; i++) {
      expect(results[i]!.end).toMatchObject({ type: "end", reason: "length" });
      expect(results[i]!.tokens, `request ${i}`).toEqual(expected[i]);
    }
    expectNoLeak(together);
    await together.close();
  });

  it("a second request reuses the first one's prefix pages and yields the same tokens", async () => {
    const f = await startRuntime(model);
    const p = prompt(9, 100);
    const a = await run(f.runtime, request("a", p, 6));
    const b = await run(f.runtime, request("b", p, 6));
    expect(a.end).toMatchObject({ type: "end", cachedTokens: 0 });
    // The prompt's processed rows are 99; six full pages of 16 are shared.
    expect(b.end).toMatchObject({ cachedTokens: 96 });
    expect(b.tokens).toEqual(a.tokens);
    const salted = await run(f.runtime, request("c", p, 6, { salt: "tenant-x" }));
    expect(salted.end).toMatchObject({ cachedTokens: 0 });
    expect(salted.tokens).toEqual(a.tokens);
    expectNoLeak(f);
    await f.close();
  });

  it("preempted and resumed requests produce the same tokens as uninterrupted ones", async () => {
    const low = Array.from({ length: 3 }, (_, i) =>
      request(`low${i}`, prompt(50 + i, 60), 40, { priority: 0 }),
    );
    const high = Array.from({ length: 3 }, (_, i) =>
      request(`high${i}`, prompt(60 + i, 60), 40, { priority: 1 }),
    );
    const big = await startRuntime(model);
    const expected = new Map<string, number[]>();
    for (const r of [...low, ...high]) expected.set(r.requestId, (await run(big.runtime, r)).tokens);
    await big.close();

    // 26 pages of 16 rows: room for three of these 100-row requests at once.
    const small = await startRuntime(model, { physicalPages: 26 });
    const lowGens = low.map((r) => small.runtime.submit(r));
    // Let every low-priority request start decoding, then bring the higher ones.
    const iters = lowGens.map((g) => g.events[Symbol.asyncIterator]());
    const firsts = await Promise.all(iters.map((it) => it.next()));
    const highResults = Promise.all(high.map((r) => run(small.runtime, r)));
    const lowResults = await Promise.all(
      iters.map(async (it, i) => {
        const rest = await collect({ [Symbol.asyncIterator]: () => it });
        return [(firsts[i]!.value as { token: number }).token, ...rest.tokens];
      }),
    );
    const highTokens = (await highResults).map((r) => r.tokens);
    expect(small.runtime.stats().preemptions).toBeGreaterThan(0);
    for (const [i, r] of low.entries()) expect(lowResults[i], r.requestId).toEqual(expected.get(r.requestId));
    for (const [i, r] of high.entries())
      expect(highTokens[i], r.requestId).toEqual(expected.get(r.requestId));
    expectNoLeak(small);
    await small.close();
  });

  it("cancel mid-prefill and mid-decode leaves no reserved page behind", async () => {
    const f = await startRuntime(model, { prefillTile: 16, maxBatchTokens: 32 });
    const long = f.runtime.submit(request("long", prompt(77, 600), 50));
    const decoding = f.runtime.submit(request("dec", prompt(78, 20), 500));
    const it = decoding.events[Symbol.asyncIterator]();
    const first = await it.next();
    expect(first.value).toMatchObject({ type: "token" });
    long.cancel();
    decoding.cancel();
    const longEnd = await collect(long.events);
    expect(longEnd.end).toMatchObject({ type: "end", reason: "cancelled" });
    expect(longEnd.tokens.length).toBeLessThan(50);
    let last = await it.next();
    let n = 0;
    while (!last.done && (last.value as RuntimeEvent).type === "token") {
      n++;
      last = await it.next();
    }
    expect(last.value).toMatchObject({ type: "end", reason: "cancelled" });
    expect(n).toBeLessThan(500);
    // A request after the cancels still runs, and nothing stays reserved.
    await run(f.runtime, request("after", prompt(79, 10), 3));
    expectNoLeak(f);
    await f.close();
  });

  it("serves a request submitted in the same tick as start (no lost wake-up)", async () => {
    const f = await openRuntime(model);
    f.runtime.start();
    // Before the loop's first iteration has even looked at the queue.
    const out = run(f.runtime, request("same-tick", prompt(5, 12), 3));
    const bound = new Promise<never>((_, reject) =>
      setTimeout(() => reject(new Error("the request was never served")), 30_000).unref(),
    );
    const result = await Promise.race([out, bound]);
    expect(result.end).toMatchObject({ type: "end", reason: "length" });
    expect(result.tokens).toHaveLength(3);
    await f.close();
  });

  it("paced prefill tiles (decodePace) change no token: a long prompt beside running decodes", async () => {
    const reqs = [
      request("pd0", prompt(31, 20), 40),
      request("pd1", prompt(32, 25), 40, { temperature: 0.9, topK: 20, seed: 4 }),
      request("plong", prompt(33, 700), 5),
    ];
    const outputs: number[][][] = [];
    for (const overrides of [{}, { decodePace: 1.5, minPrefillTokens: 1 }]) {
      const f = await startRuntime(model, { prefillTile: 64, maxBatchTokens: 80, ...overrides });
      const decodes = reqs.slice(0, 2).map((r) => f.runtime.submit(r));
      const its = decodes.map((g) => g.events[Symbol.asyncIterator]());
      const firsts = await Promise.all(its.map((it) => it.next()));
      // The long prompt arrives while both decode, so its tiles are paced beside them.
      const long = run(f.runtime, reqs[2]!);
      const rest = await Promise.all(its.map((it) => collect({ [Symbol.asyncIterator]: () => it })));
      const out = rest.map((r, i) => [(firsts[i]!.value as { token: number }).token, ...r.tokens]);
      out.push((await long).tokens);
      outputs.push(out);
      expectNoLeak(f);
      await f.close();
    }
    expect(outputs[1]).toEqual(outputs[0]);
    expect(outputs[0]!.map((o) => o.length)).toEqual([40, 40, 5]);
  });

  it("in a scope, as the roles own it: closing the scope stops the loop, ends open requests, then frees the engine", async () => {
    let engine: Engine | null = null;
    const served = await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const e = yield* resource(
            () => loadEngine(model, { physicalPages: 64, pageTokens: 16 }, { threads: 2 }),
            (x) => x.free(),
          );
          engine = e;
          const options = {
            fingerprint: model.fingerprint,
            vocab: model.config.spec.vocab,
            maxContext: model.config.spec.maxPosition,
            layers: model.config.spec.layers,
            pageTokens: 16,
            physicalPages: 64,
            maxBatchTokens: 64,
            maxBatchSeqs: 8,
            minPrefillTokens: 8,
            prefillTile: 32,
            maxQueued: 8,
            costs: {
              prefillPerTokenMs: 0.1,
              firstTokenMs: 1,
              decodeStepMs: 1,
              restorePerByteMs: { ram: 1e-6, ssd: 1e-5, peer: 1e-5, s3: 1e-4 },
            },
            logger: silentLogger,
          };
          const rt = yield* resource(
            () => {
              const r = new WorkerRuntime(e, options);
              r.start();
              return r;
            },
            (r) => r.stop(),
          );
          const done = yield* Effect.promise(() => run(rt, request("sc1", prompt(3, 20), 3)));
          // A long generation still running when the scope closes.
          const open: RuntimeEvent[] = [];
          const drained = (async () => {
            for await (const ev of rt.submit(request("sc2", prompt(4, 20), 500)).events) open.push(ev);
          })();
          yield* Effect.promise(async () => {
            while (open.length === 0) await new Promise((r) => setTimeout(r, 5));
          });
          expect(e.freed).toBe(false);
          return { done, rt, open, drained };
        }),
      ),
    );
    expect(served.done.end).toMatchObject({ type: "end", reason: "length" });
    expect(served.done.tokens).toHaveLength(3);
    // Released with the scope, after the loop stopped.
    expect((engine as Engine | null)?.freed).toBe(true);
    await served.drained;
    expect(served.open[served.open.length - 1]).toMatchObject({
      type: "error",
      message: "the worker is stopping",
    });
    expect(served.open.filter((e) => e.type === "token").length).toBeLessThan(500);
    expect(() => served.rt.submit(request("late", prompt(5, 5), 2))).toThrow(/stopping/);
    expect(served.rt.pages.snapshot().reservedPages).toBe(0);
  });

  it("refuses bad requests with a clear error and queues nothing", async () => {
    const f = await startRuntime(model, { physicalPages: 8 });
    expect(() => f.runtime.submit(request("e1", [], 4))).toThrow(/empty/);
    expect(() => f.runtime.submit(request("e2", [1, 99999], 4))).toThrow(/outside the vocabulary/);
    expect(() => f.runtime.submit(request("e3", prompt(1, 10), 4000))).toThrow(/exceeds the context|pages/);
    expect(() => f.runtime.submit(request("e4", prompt(1, 200), 4))).toThrow(
      /needs 14 pages; the pool has 8/,
    );
    expect(() => f.runtime.submit(request("e5", prompt(1, 10), 4, { temperature: -1 }))).toThrow(
      /temperature/,
    );
    expect(f.runtime.stats().waiting + f.runtime.stats().running).toBe(0);
    await f.close();
  });
});
