import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { metrics, readyReplicas } from "../../bench/_serve-load.ts";
import { type ServeProcess, startServe } from "./serve-process.ts";

/**
 * Cache hits by tier on the embedded default's /metrics, against the real
 * `continuum serve` process: a prompt's first 256-token chunk is checkpointed
 * (RAM and local files), then served again from a tier — from RAM after its
 * resident pages were evicted, from SSD after a restart — and the counters of
 * exactly that tier move.
 *
 * Both the capture and the restore are cost decisions, so the margins matter
 * (tiny model: 64 KiB per chunk). Restore: 64 KiB × 1e-6 ms/B (RAM) or
 * × 1e-5 (SSD, configured: the restarted process has no sample yet) = 0.07 or
 * 0.66 ms against 256 tokens of prefill. Capture, the tighter one: with no
 * reuse seen yet (p = 1/2) it pays when 256 × prefill per token exceeds
 * 2 × 0.66 + 0.07 ms, i.e. prefill ≥ 5.4 µs/token. Measured here: a 300-token
 * request takes 26–150 ms on 2 loaded cores (≥ 80 µs/token), so ≥ 15× margin;
 * a core 15× faster with the step's fixed costs gone would be needed to flip it.
 */

/** 257 prompt tokens: one whole 256-token chunk (its 16 pages all in it) and the pending token. */
const promptA = Array.from({ length: 257 }, (_, i) => ((i * 7) % 500) + 1);
/** Two unrelated 300-token prompts: together they need every page A's cached prefix holds. */
const promptB = Array.from({ length: 300 }, (_, i) => ((i * 11 + 3) % 500) + 1);
const promptC = Array.from({ length: 300 }, (_, i) => ((i * 13 + 5) % 500) + 1);

let dataDir: string;
const servers: ServeProcess[] = [];

beforeAll(async () => {
  dataDir = await mkdtemp(join(tmpdir(), "continuum-tiers-"));
});
afterAll(async () => {
  for (const s of servers) await s.stop();
  await rm(dataDir, { recursive: true, force: true });
});

/**
 * The server on the shared data dir, with a pool of 24 pages. The pool evicts
 * cached pages one at a time, only as allocations need them: B (19 pages)
 * leaves five of A's 16 cached, and C (19 more) takes those too, A's being
 * the durable (published, cheap to reload) and oldest ones.
 */
async function serve(): Promise<ServeProcess> {
  const s = await startServe({ CONTINUUM_STORE_DATA_DIR: dataDir, CONTINUUM_PAGES_PHYSICAL_PAGES: "24" });
  servers.push(s);
  return s;
}

async function complete(s: ServeProcess, prompt: number[]): Promise<number> {
  const r = await fetch(`${s.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", prompt, max_tokens: 1, temperature: 0 }),
  });
  expect(r.status).toBe(200);
  const body = (await r.json()) as { usage: { prompt_tokens_details: { cached_tokens: number } } };
  return body.usage.prompt_tokens_details.cached_tokens;
}

/** Waits (bounded) until the catalog holds `n` ready replicas in `tier`. */
async function waitReplicas(s: ServeProcess, tier: string, n: number): Promise<void> {
  if (!(await readyReplicas(s, tier, n, 30_000)))
    throw new Error(`${tier}: fewer than ${n} ready replicas after 30 s`);
}

const tierCounters = (m: Map<string, number>, tier: string) => ({
  chunks: m.get(`continuum_cache_restored_chunks_total{tier="${tier}"}`),
  tokens: m.get(`continuum_cache_restored_tokens_total{tier="${tier}"}`),
  cacheTokens: m.get(`continuum_cache_tokens{source="${tier}"}`),
});

describe("cache hits by tier on the embedded default's /metrics", () => {
  it("counts a restore from RAM once the prefix's resident pages were evicted", async () => {
    const s = await serve();
    const before = await metrics(s);
    expect(tierCounters(before, "ram")).toEqual({ chunks: 0, tokens: 0, cacheTokens: 0 });
    expect(await complete(s, promptA)).toBe(0);
    await waitReplicas(s, "ram", 1);
    // B and then C need the pages A's cached prefix holds: A's pages are evicted.
    expect(await complete(s, promptB)).toBe(0);
    expect(await complete(s, promptC)).toBe(0);
    expect(await complete(s, promptA)).toBe(256);
    const m = await metrics(s);
    expect(tierCounters(m, "ram")).toEqual({ chunks: 1, tokens: 256, cacheTokens: 256 });
    expect(m.get('continuum_cache_restored_bytes_total{tier="ram"}')).toBeGreaterThan(0);
    expect(m.get('continuum_restores_total{outcome="completed"}')).toBe(1);
    expect(tierCounters(m, "ssd")).toEqual({ chunks: 0, tokens: 0, cacheTokens: 0 });
    expect(m.get('continuum_cache_tokens{source="resident"}')).toBe(0);
  });

  it("counts a restore from SSD after a restart (RAM is empty then)", async () => {
    await waitReplicas(servers[0]!, "ssd", 1);
    await servers.shift()!.stop();
    const s = await serve();
    expect(await complete(s, promptA)).toBe(256);
    const m = await metrics(s);
    expect(tierCounters(m, "ssd")).toEqual({ chunks: 1, tokens: 256, cacheTokens: 256 });
    expect(tierCounters(m, "ram")).toEqual({ chunks: 0, tokens: 0, cacheTokens: 0 });
    expect(m.get('continuum_cache_tokens{source="recompute"}')).toBe(promptA.length - 1 - 256);
  });
});
