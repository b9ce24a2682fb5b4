import { randomUUID } from "node:crypto";
import type { Engine } from "../native/engine.ts";
import { ContinuationId, type PageId, TokenCount } from "../schema/ids.ts";
import { argmax } from "../worker/model/sampling.ts";
import { PageHashChain } from "../worker/pages/page-hashes.ts";
import { PageManager } from "../worker/pages/page-manager.ts";
import type { PageManagerOptions } from "../worker/pages/route-table.ts";
import { buildBatch } from "../worker/runtime/batch.ts";
import type { WorkerRuntime } from "../worker/runtime/runtime.ts";
import { greedyRequest } from "../worker/runtime/runtime-api.ts";

/**
 * What the exactness checks share (bench/_exact.ts, which bench gpu runs,
 * and the restore tests, test/worker/restore/harness.ts): a bare engine and
 * page manager on which a check restores a route and then runs prefill and
 * greedy decode itself, so it can read the logits; seeded prompts; bitwise
 * comparison; greedy generation through a runtime.
 */
export class GreedyDevice {
  readonly pages: PageManager;
  constructor(
    readonly engine: Engine,
    pages: PageManagerOptions,
  ) {
    this.pages = new PageManager(pages);
  }

  openRoute(name: string, totalTokens: number): ContinuationId {
    const id = ContinuationId(name);
    this.pages.openRoute(id, { reserveTokens: TokenCount(totalTokens) });
    return id;
  }

  /**
   * Feeds tokens[route rows, tokens.length) in one step (the rest of the
   * prompt, pending token last) and then `decode` greedy tokens one at a
   * time. Returns the first token's logits, the greedy tokens and the time
   * to the first logits.
   */
  async continueGreedy(
    route: ContinuationId,
    tokens: readonly number[],
    decode: number,
  ): Promise<{ logits: Float32Array; greedy: number[]; firstMs: number }> {
    const seq = [...tokens];
    const pageTokens = this.pages.pageTokens;
    const chain = new PageHashChain(pageTokens, undefined);
    let first: Float32Array | undefined;
    let firstMs = 0;
    const greedy: number[] = [];
    const t0 = performance.now();
    for (let step = 0; step <= decode; step++) {
      const have = this.pages.route(route).tokens;
      const plan = this.pages.beginAppend(route, TokenCount(seq.length - have));
      for (const c of plan.copies) await this.engine.copyPage(c.src, c.dst);
      const built = buildBatch([
        {
          tokens: seq.slice(have),
          firstPosition: have,
          slots: plan.slots,
          pageTable: plan.pageTable as PageId[],
          wantLogits: true,
        },
      ]);
      const logits = await this.engine.step(built.batch);
      this.pages.commitAppend(route, chain.extend(seq, seq.length).slice(Math.floor(have / pageTokens)));
      const vocab = this.engine.spec.vocab;
      const at = built.logitIndex[0]!;
      const row = logits.slice(at * vocab, (at + 1) * vocab);
      if (first === undefined) {
        first = row;
        firstMs = performance.now() - t0;
      }
      greedy.push(argmax(row));
      seq.push(greedy.at(-1)!);
    }
    return { logits: first!, greedy, firstMs };
  }

  close(): void {
    this.engine.free();
  }
}

/** `n` xorshift32 token ids below `below`. */
export function xorshiftTokens(n: number, seed: number, below: number): number[] {
  let x = seed >>> 0 || 1;
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out.push((x >>> 0) % below);
  }
  return out;
}

/** Bitwise equality of two float arrays (NaN-safe, −0 ≠ +0). */
export function bitEqual(a: Float32Array, b: Float32Array): boolean {
  if (a.length !== b.length) return false;
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  return true;
}

/** Greedy generation through a runtime (under a tenant's `salt`, if given): the tokens and how many prompt tokens were reused. */
export async function generateGreedy(
  runtime: WorkerRuntime,
  prompt: readonly number[],
  maxTokens: number,
  opts: { readonly requestId?: string; readonly salt?: string | undefined } = {},
): Promise<{ tokens: number[]; cachedTokens: number }> {
  const gen = runtime.submit(
    greedyRequest(opts.requestId ?? `q-${randomUUID().slice(0, 8)}`, prompt, maxTokens, { salt: opts.salt }),
  );
  const tokens: number[] = [];
  for await (const e of gen.events) {
    if (e.type === "token") tokens.push(e.token);
    else if (e.type === "error") throw new Error(e.message);
    else return { tokens, cachedTokens: e.cachedTokens };
  }
  throw new Error("the generation ended without an end event");
}
