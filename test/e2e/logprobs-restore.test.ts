import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readyReplicas } from "../../bench/_serve-load.ts";
import { type ServeProcess, startServe } from "./serve-process.ts";

/**
 * Log-probabilities are the same bits whether a prompt's prefix was
 * recomputed or restored: the embedded default checkpoints the prompt's first
 * 256-token chunk to local files, a restarted process restores it from there
 * (its pages are empty), and the generated tokens' logprobs match exactly
 * (the kernels are batch-invariant and restored K/V are the recomputed bytes;
 * JSON carries doubles exactly). The capture's cost margin is argued in
 * cache-tiers.test.ts.
 */
const prompt = Array.from({ length: 300 }, (_, i) => ((i * 13) % 500) + 2);

let dataDir: string;
const servers: ServeProcess[] = [];

beforeAll(async () => {
  dataDir = await mkdtemp(join(tmpdir(), "continuum-lp-restore-"));
});
afterAll(async () => {
  for (const s of servers) await s.stop();
  await rm(dataDir, { recursive: true, force: true });
});

async function serve(): Promise<{ s: ServeProcess; client: OpenAI }> {
  const s = await startServe({ CONTINUUM_STORE_DATA_DIR: dataDir });
  servers.push(s);
  return { s, client: new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "unused", maxRetries: 0 }) };
}

async function ssdReplicas(s: ServeProcess, n: number): Promise<void> {
  if (!(await readyReplicas(s, "ssd", n, 30_000)))
    throw new Error(`fewer than ${n} ready SSD replicas after 30 s`);
}

const ask = (client: OpenAI) =>
  client.completions.create({ model: "tiny", prompt, max_tokens: 6, temperature: 0, logprobs: 5 });

describe("log-probabilities across a restored prefix", () => {
  it("are identical when the prefix is restored from disk after a restart", async () => {
    const a = await serve();
    const computed = await ask(a.client);
    const cached = (u: unknown) =>
      (u as { prompt_tokens_details: { cached_tokens: number } }).prompt_tokens_details.cached_tokens;
    expect(cached(computed.usage)).toBe(0);
    await ssdReplicas(a.s, 1);
    await servers.shift()!.stop();
    const b = await serve();
    const restored = await ask(b.client);
    expect(cached(restored.usage)).toBe(256);
    expect(restored.choices[0]!.text).toBe(computed.choices[0]!.text);
    expect(restored.choices[0]!.logprobs).toEqual(computed.choices[0]!.logprobs);
  });
});
