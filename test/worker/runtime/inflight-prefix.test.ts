import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RequestId } from "../../../schema/ids.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import type { SubmitRequest } from "../../../worker/runtime/runtime-api.ts";
import { collect, countingPrefill, prompt, startRuntime, tinyModel } from "./fixture.ts";

let model: LoadedModel;
let cleanup: () => Promise<void>;

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
});
afterAll(async () => {
  await cleanup();
});

const P = 16;

function request(id: string, prompt: number[], maxTokens: number, seed = 1): SubmitRequest {
  return {
    requestId: RequestId(id),
    salt: undefined,
    prompt,
    maxTokens,
    temperature: seed % 2 === 0 ? 0 : 0.8,
    topP: 0.95,
    topK: 40,
    seed,
    stopTokenIds: [],
  };
}

/** Each request run alone on a fresh runtime: the tokens it must produce. */
async function alone(reqs: readonly SubmitRequest[]): Promise<number[][]> {
  const f = await startRuntime(model);
  const out: number[][] = [];
  for (const r of reqs) {
    const res = await collect(
      f.runtime.submit({ ...r, requestId: RequestId(`${r.requestId}-alone`) }).events,
    );
    expect(res.end).toMatchObject({ type: "end", reason: "length" });
    out.push(res.tokens);
  }
  await f.close();
  return out;
}

function expectNoLeak(f: Awaited<ReturnType<typeof startRuntime>>) {
  const snap = f.runtime.pages.snapshot();
  expect(snap.reservedPages).toBe(0);
  expect(snap.routes.every((r) => r.id.startsWith("cache:"))).toBe(true);
  f.runtime.pages.checkInvariants();
}

describe("in-flight prefix sharing (tiny model, real engine)", () => {
  it("N concurrent requests with one long prefix compute it once and produce the tokens each produces alone", async () => {
    const N = 12;
    // 300 shared tokens: 18 full pages (288 rows) shared, the rest per request.
    const shared = prompt(11, 300);
    const reqs = Array.from({ length: N }, (_, i) =>
      request(`s${i}`, [...shared, ...prompt(200 + i, 5 + (i % 7))], 6 + (i % 3), i),
    );
    const expected = await alone(reqs);

    const { seen, wrap } = countingPrefill();
    // Tiles of 32 rows: the producer seals two pages per step while the others wait.
    const f = await startRuntime(model, { prefillTile: 32, maxBatchTokens: 256 }, wrap);
    const results = await Promise.all(reqs.map((r) => collect(f.runtime.submit(r).events)));
    for (let i = 0; i < N; i++) {
      expect(results[i]!.end).toMatchObject({ type: "end", reason: "length" });
      expect(results[i]!.tokens, `request ${i}`).toEqual(expected[i]);
    }
    // Computed once: the 18 shared full pages; then each request's own rows
    // after them (its prompt rows before the pending token).
    const sharedRows = Math.floor(shared.length / P) * P;
    const own = reqs.reduce((a, r) => a + (r.prompt.length - 1 - sharedRows), 0);
    expect(seen.prefillRows).toBe(sharedRows + own);
    expect(f.runtime.stats().sharedInFlightTokens).toBe((N - 1) * sharedRows);
    // Every request but the producer reports the shared rows as cached.
    const cached = results.map((r) => (r.end as { cachedTokens: number }).cachedTokens).sort((a, b) => a - b);
    expect(cached).toEqual([0, ...Array<number>(N - 1).fill(sharedRows)]);
    expectNoLeak(f);
    await f.close();
  });

  it("identical prompts arriving at once compute their full pages once", async () => {
    const same = prompt(12, 170);
    const reqs = Array.from({ length: 16 }, (_, i) => request(`i${i}`, same, 4, i));
    const expected = await alone(reqs);
    const { seen, wrap } = countingPrefill();
    const f = await startRuntime(model, { prefillTile: 48 }, wrap);
    const results = await Promise.all(reqs.map((r) => collect(f.runtime.submit(r).events)));
    for (let i = 0; i < reqs.length; i++) expect(results[i]!.tokens, `request ${i}`).toEqual(expected[i]);
    // 169 rows before the pending token: 160 in 10 full pages (once), 9 in each request's own tail.
    expect(seen.prefillRows).toBe(160 + 16 * 9);
    expectNoLeak(f);
    await f.close();
  });

  it("cancelling the producer mid-prefill: a waiter takes over and every waiter produces the same tokens", async () => {
    const shared = prompt(13, 400);
    const reqs = Array.from({ length: 6 }, (_, i) =>
      request(`c${i}`, [...shared, ...prompt(300 + i, 4 + i)], 5, i),
    );
    const expected = await alone(reqs.slice(1));
    let producer: { cancel(): void } | null = null;
    // The first request is the producer (oldest at the same boundary); it is
    // cancelled before the step that would take it past 128 computed rows,
    // i.e. after it sealed 8 of the 25 shared pages.
    const { seen, wrap } = countingPrefill((rows) => {
      if (rows >= 128 && producer) {
        producer.cancel();
        producer = null;
      }
    });
    const f = await startRuntime(model, { prefillTile: 32 }, wrap);
    const gens = reqs.map((r) => f.runtime.submit(r));
    producer = gens[0]!;
    const results = await Promise.all(gens.map((g) => collect(g.events)));
    expect(results[0]!.end).toMatchObject({ type: "end", reason: "cancelled" });
    expect(results[0]!.tokens).toEqual([]);
    for (let i = 1; i < reqs.length; i++) {
      expect(results[i]!.end).toMatchObject({ type: "end", reason: "length" });
      expect(results[i]!.tokens, `request ${i}`).toEqual(expected[i - 1]);
    }
    // The shared 400 rows (25 pages) were still computed once overall: the
    // producer's sealed pages were adopted, the successor computed the rest;
    // at most the producer's in-flight tile (32 rows) was thrown away.
    const sharedRows = 25 * P;
    const own = reqs.slice(1).reduce((a, r) => a + (r.prompt.length - 1 - sharedRows), 0);
    expect(seen.prefillRows).toBeGreaterThanOrEqual(sharedRows + own);
    expect(seen.prefillRows).toBeLessThanOrEqual(sharedRows + own + 32);
    expectNoLeak(f);
    await f.close();
  });
});
