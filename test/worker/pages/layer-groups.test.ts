import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Engine } from "../../../native/engine.ts";
import { ContinuationId, type PrefixHash, TokenCount } from "../../../schema/ids.ts";
import type { SequenceId } from "../../../worker/model/decoder.ts";
import { ContiguousDecoder } from "../../../worker/model/decoder-contiguous.ts";
import { openEngine } from "../../../worker/model/engine.ts";
import { generateModel } from "../../../worker/model/generate.ts";
import { GLOBAL_LAYER, layerGroups, slidingLayer } from "../../../worker/model/layout.ts";
import { type LoadedModel, loadModelDir } from "../../../worker/model/model-dir.ts";
import { argmax } from "../../../worker/model/sampling.ts";
import {
  buildGroupedBatch,
  GroupedRoutes,
  groupHash,
  TAGGED_CACHE,
} from "../../../worker/pages/layer-groups.ts";
import { PageHashChain } from "../../../worker/pages/page-hashes.ts";
import { PageManager } from "../../../worker/pages/page-manager.ts";
import type { ResidencyCosts } from "../../../worker/residency/residency.ts";
import { promptOf, sameBits } from "../model/model-helpers.ts";

/**
 * Gemma 3's generated tiny model (5 sliding layers of window 24, 1 global:
 * six groups of one layer) on the page manager with a route per layer group
 * over one pool, every step checked bit for bit against the contiguous
 * oracle, with the manager's invariants checked after every mutation.
 */
const P = 16;
const W = 24;
const N = 400;
const KEEP: ResidencyCosts = { recomputePageMs: 4, reloadPageMs: 1 };

let root: string;
let model: LoadedModel;
const engines: Engine[] = [];

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-layer-groups-"));
  const g = await generateModel({ preset: "tiny", out: join(root, "gemma3"), arch: "gemma3" });
  model = await loadModelDir(g.dir, { variant: "cpu-f32acc/v1" });
});
afterAll(async () => {
  for (const e of engines) e.free();
  await rm(root, { recursive: true, force: true });
});

interface Seq {
  readonly id: ContinuationId;
  readonly tokens: number[];
  readonly chain: PageHashChain;
  /** Its twin in the contiguous oracle. */
  readonly oracle: SequenceId;
}

async function setup() {
  const spec = model.config.spec;
  const groups = layerGroups(spec.layers);
  const paged = await openEngine(spec, model.weights, { threads: 2 });
  engines.push(paged);
  paged.createPool(N, P, groups.groupOf);
  const oracleEngine = await openEngine(spec, model.weights, { threads: 2 });
  engines.push(oracleEngine);
  const oracle = new ContiguousDecoder(oracleEngine, 8, 320);
  const pm = new PageManager({ pageTokens: P, physicalPages: N, debugInvariants: true });
  const gr = new GroupedRoutes(pm, groups);
  const seq = (name: string, tokens: number[] = []): Seq => ({
    id: ContinuationId(name),
    tokens: [...tokens],
    chain: new PageHashChain(P, undefined),
    oracle: oracle.open(),
  });
  /** One grouped step of several lanes; each lane's last-row logits checked against the oracle's bits. */
  const step = async (lanes: { s: Seq; tokens: number[] }[], keep: boolean): Promise<Float32Array[]> => {
    const planned = lanes.map((l) => ({ l, plans: gr.beginAppend(l.s.id, TokenCount(l.tokens.length)) }));
    for (const { plans } of planned)
      for (const p of plans) for (const c of p.copies) await paged.copyPage(c.src, c.dst);
    const logits = await paged.step(
      buildGroupedBatch(
        planned.map(({ l, plans }) => ({
          tokens: l.tokens,
          firstPosition: l.s.tokens.length,
          plans,
          wantLogits: true,
        })),
        groups.groups.length,
      ),
    );
    const vocab = spec.vocab;
    const out: Float32Array[] = [];
    for (const [i, l] of lanes.entries()) {
      const first = l.s.tokens.length;
      l.s.tokens.push(...l.tokens);
      gr.commitAppend(
        l.s.id,
        l.s.chain.extend(l.s.tokens, l.s.tokens.length).slice(Math.floor(first / P)),
        keep ? { cache: KEEP } : {},
      );
      const mine = logits.subarray(i * vocab, (i + 1) * vocab);
      const [want] = await oracle.step([{ seq: l.s.oracle, tokens: l.tokens }]);
      expect(sameBits(mine, want!)).toBe(true);
      out.push(mine);
    }
    return out;
  };
  const prefill = async (s: Seq, tokens: number[], keep: boolean) => {
    let last: Float32Array | undefined;
    for (let i = 0; i < tokens.length; i += 64)
      [last] = await step([{ s, tokens: tokens.slice(i, i + 64) }], keep);
    return last!;
  };
  const sealedOf = (tokens: number[]): readonly PrefixHash[] =>
    new PageHashChain(P, undefined).extend(tokens, tokens.length);
  return { spec, groups, pm, gr, oracle, seq, step, prefill, sealedOf };
}

describe("a route per layer group over one pool (Gemma 3 tiny)", () => {
  it("releases the sliding groups' pages, keeps the global group's, and stays the contiguous oracle's bits through sharing, copy-on-write and release", async () => {
    const { spec, groups, pm, gr, oracle, seq, step, prefill, sealedOf } = await setup();
    expect(groups.groups.map((g) => g.layers)).toEqual([[5], [0], [1], [2], [3], [4]]);
    const vocab = spec.vocab;

    // A: 8 windows of prompt, then 20 greedy tokens; released sliding pages stay cached.
    const a = seq("a");
    gr.open(a.id, { reserveTokens: TokenCount(240) });
    let logits = await prefill(a, promptOf(8 * W - 5, 1, vocab), true);
    for (let i = 0; i < 20; i++) logits = (await step([{ s: a, tokens: [argmax(logits)] }], true))[0]!;
    expect(a.tokens.length).toBe(207);
    // 13 pages: the global group holds all, each sliding group the 2 its window reaches.
    const tables = groups.groups.map((_, g) => pm.route(gr.routeOf(a.id, g)));
    expect(tables[0]!.releasedPages).toBe(0);
    for (const t of tables.slice(1)) expect([t.pages.length, t.releasedPages]).toEqual([13, 11]);
    expect(gr.heldPages(a.id)).toBe(13 + 5 * 2);
    expect(pm.windowReleases).toBe(5 * 11);
    // Against one table of every layer (6 layers' rows a page): held K/V over the all-in-one table's.
    expect((13 + 5 * 2) / (13 * 6)).toBeLessThan(0.3);

    // B shares A's first 10 pages in every group (the released ones from the cache), then continues.
    const bPrompt = [...a.tokens.slice(0, 160), ...promptOf(7, 2, vocab)];
    const bSealed = sealedOf(bPrompt);
    expect(gr.matchPrefix(bSealed)).toBe(10);
    const b = seq("b");
    gr.open(b.id, { prefix: bSealed.slice(0, 10), reserveTokens: TokenCount(200) });
    b.tokens.push(...bPrompt.slice(0, 160));
    b.chain.extend(b.tokens, 160);
    await oracle.step([{ seq: b.oracle, tokens: bPrompt.slice(0, 160) }]);
    expect(pm.route(b.id).pages.slice(0, 10)).toEqual(pm.route(a.id).pages.slice(0, 10));
    logits = (await step([{ s: b, tokens: bPrompt.slice(160) }], true))[0]!;
    for (let i = 0; i < 5; i++) logits = (await step([{ s: b, tokens: [argmax(logits)] }], true))[0]!;

    // C forks A at its partial tail; both append in one step: each group copies its tail page.
    const c = seq("c");
    gr.fork(a.id, c.id, { reserveTokens: TokenCount(240) });
    c.tokens.push(...a.tokens);
    c.chain.extend(c.tokens, c.tokens.length);
    await oracle.step([{ seq: c.oracle, tokens: a.tokens }]);
    for (let i = 0; i < 6; i++)
      await step(
        [
          { s: a, tokens: [(i * 5 + 1) % vocab] },
          { s: c, tokens: [(i * 3 + 2) % vocab] },
        ],
        true,
      );
    for (let g = 0; g < groups.groups.length; g++) {
      const ta = pm.route(gr.routeOf(a.id, g)).pages;
      const tc = pm.route(gr.routeOf(c.id, g)).pages;
      expect(ta[12]).not.toBe(tc[12]);
    }

    // D's released sliding pages are freed, not cached. E still hits all 6 of D's pages: the global
    // group holds every one, each sliding group the 2 its window reaches at row 96 (pages 4 and 5).
    const d = seq("d");
    const dPrompt = promptOf(4 * W, 3, vocab);
    gr.open(d.id, { reserveTokens: TokenCount(100) });
    await prefill(d, dPrompt, false);
    const dSealed = sealedOf(dPrompt);
    expect(pm.matchPrefix(dSealed)).toBe(6);
    expect(pm.matchPrefix(gr.groupHashes(dSealed, 1))).toBe(0);
    expect(gr.matchPrefix(dSealed)).toBe(6);
    // A shorter hit's window reaches pages D's sliding groups freed: none.
    expect(gr.matchPrefix(dSealed.slice(0, 5))).toBe(0);
    const e = seq("e");
    gr.open(e.id, { prefix: dSealed, reserveTokens: TokenCount(100) });
    for (let g = 1; g < groups.groups.length; g++) {
      const te = pm.route(gr.routeOf(e.id, g));
      expect(te.releasedPages).toBe(4);
      expect(te.pages.slice(4)).toEqual(pm.route(gr.routeOf(d.id, g)).pages.slice(4));
    }
    e.tokens.push(...dPrompt);
    e.chain.extend(e.tokens, e.tokens.length);
    await oracle.step([{ seq: e.oracle, tokens: dPrompt }]);
    // E continues past the shared pages, every step the oracle's bits.
    logits = await prefill(e, promptOf(40, 4, vocab), true);
    for (let i = 0; i < 3; i++) logits = (await step([{ s: e, tokens: [argmax(logits)] }], true))[0]!;

    // F, idle at row 0 while D ran, adopts D's 6 pages in flight: the global group all of them, each
    // sliding group only the 2 its window reaches at row 96, leaving the 4 D freed released.
    const f = seq("f");
    gr.open(f.id, { reserveTokens: TokenCount(100) });
    const reservedBefore = gr.reservedPages(f.id);
    expect(gr.adoptInFlight(f.id, dSealed, KEEP)).toBe(6);
    expect(gr.reservedPages(f.id)).toBe(reservedBefore - 6 * groups.groups.length);
    expect(pm.route(f.id).pages).toEqual(pm.route(d.id).pages);
    for (let g = 1; g < groups.groups.length; g++) {
      const tf = pm.route(gr.routeOf(f.id, g));
      expect([tf.tokens, tf.releasedPages]).toEqual([96, 4]);
      expect(tf.pages.slice(4)).toEqual(pm.route(gr.routeOf(d.id, g)).pages.slice(4));
    }
    // Nothing more is sealed: a second adoption finds nothing.
    expect(gr.adoptInFlight(f.id, dSealed, KEEP)).toBe(0);
    f.tokens.push(...dPrompt);
    f.chain.extend(f.tokens, f.tokens.length);
    await oracle.step([{ seq: f.oracle, tokens: dPrompt }]);
    logits = await prefill(f, promptOf(40, 5, vocab), true);
    for (let i = 0; i < 3; i++) logits = (await step([{ s: f, tokens: [argmax(logits)] }], true))[0]!;

    // A group's pages answer only to its own hashes.
    expect(groupHash(dSealed[0]!, 1)).not.toBe(dSealed[0]);
    expect(groupHash(dSealed[0]!, 1)).not.toBe(groupHash(dSealed[0]!, 2));

    for (const s of [a, b, c, d, e, f]) gr.release(s.id, { cache: KEEP });
    const end = pm.snapshot();
    expect(end.routes).toEqual([]);
    expect(end.freePages + end.cachedPages).toBe(N);
    expect(end.reservedPages).toBe(0);
    pm.checkInvariants();
  });

  it("opens, forks and appends in every group or in none", async () => {
    const { pm, gr, seq, sealedOf } = await setup();
    const a = seq("x");
    gr.open(a.id, { reserveTokens: TokenCount(32) });
    // A later group's route already exists: the open fails and leaves no route of the others behind.
    pm.openRoute(gr.routeOf(ContinuationId("y"), 3));
    expect(() => gr.open(ContinuationId("y"))).toThrow(/already exists/);
    for (const g of [0, 1, 2]) expect(pm.hasRoute(gr.routeOf(ContinuationId("y"), g))).toBe(false);
    expect(() => gr.fork(a.id, ContinuationId("y"))).toThrow(/already exists/);
    expect(pm.hasRoute(ContinuationId("y"))).toBe(false);
    // A later group that cannot append (its route already has an append pending) aborts the groups planned before it.
    pm.beginAppend(gr.routeOf(a.id, 4), TokenCount(3));
    expect(() => gr.beginAppend(a.id, TokenCount(3))).toThrow(/already pending/);
    for (let g = 0; g < 6; g++) expect(pm.route(gr.routeOf(a.id, g)).dirty).toBe(g === 4);
    pm.abortAppend(gr.routeOf(a.id, 4));
    expect(gr.beginAppend(a.id, TokenCount(3))).toHaveLength(6);
    gr.abortAppend(a.id);
    expect(gr.matchPrefix(sealedOf([1, 2, 3]))).toBe(0);
    expect(() => pm.openRoute(ContinuationId("w"), { window: 0 })).toThrow(
      /window must be a positive integer/,
    );
    pm.checkInvariants();
  });
});

describe("the tag cache of group hashes", () => {
  it("answers as groupHash does and holds at most TAGGED_CACHE entries, the oldest going first", () => {
    const gr = new GroupedRoutes(
      new PageManager({ pageTokens: P, physicalPages: 8 }),
      layerGroups([GLOBAL_LAYER, slidingLayer(W, 1 << 20)]),
    );
    expect(gr.windows).toEqual([null, W]);
    const chain = new PageHashChain(P, undefined).extend(
      Array.from({ length: (TAGGED_CACHE + 100) * P }, (_, i) => i % 997),
      (TAGGED_CACHE + 100) * P,
    );
    const first = chain[0]!;
    expect(gr.groupHash(first, 0)).toBe(first);
    expect(gr.groupHash(first, 1)).toBe(groupHash(first, 1));
    const tagged = gr.groupHashes(chain, 1);
    expect(tagged.length).toBe(chain.length);
    expect(tagged[TAGGED_CACHE + 50]).toBe(groupHash(chain[TAGGED_CACHE + 50]!, 1));
    expect(gr.taggedCached).toBe(TAGGED_CACHE);
    // The oldest entries went: asking again recomputes them, the same hash.
    expect(gr.groupHash(first, 1)).toBe(groupHash(first, 1));
    expect(gr.taggedCached).toBe(TAGGED_CACHE);
  });
});
