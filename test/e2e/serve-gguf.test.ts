import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateModel } from "../../worker/model/generate.ts";
import { quantizeModelDir } from "../../worker/model/gguf-quantize.ts";
import { type ServeProcess, startServe } from "./serve-process.ts";

/**
 * `continuum serve` on a GGUF file (model.dir naming the .gguf): the
 * generated tiny model quantized to Q4_0, served through the HTTP API with
 * its tokenizer read from the file's metadata, greedy completions
 * deterministic, and a long shared prefix reused from cached pages.
 */
let root: string;
let serve: ServeProcess;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "continuum-serve-gguf-"));
  const hf = await generateModel({ preset: "tiny", out: join(root, "tiny"), seed: 1 });
  const file = join(root, "tiny-q4_0.gguf");
  await quantizeModelDir(hf.dir, file, "q4_0");
  serve = await startServe({ CONTINUUM_MODEL_DIR: file });
}, 180_000);
afterAll(async () => {
  await serve?.stop();
  await rm(root, { recursive: true, force: true });
});

async function complete(prompt: string, maxTokens: number) {
  const r = await fetch(`${serve.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny-q4_0", prompt, max_tokens: maxTokens, temperature: 0 }),
  });
  expect(r.status).toBe(200);
  return (await r.json()) as {
    choices: { text: string }[];
    usage: {
      prompt_tokens: number;
      completion_tokens: number;
      prompt_tokens_details?: { cached_tokens: number };
    };
  };
}

describe("continuum serve on a GGUF file", () => {
  it("lists the model by its file name and completes deterministically", async () => {
    const models = (await (await fetch(`${serve.url}/v1/models`)).json()) as { data: { id: string }[] };
    expect(models.data.map((m) => m.id)).toEqual(["tiny-q4_0"]);
    const a = await complete("Once upon a time", 12);
    const b = await complete("Once upon a time", 12);
    expect(a.usage.completion_tokens).toBe(12);
    expect(a.choices[0]!.text).toBe(b.choices[0]!.text);
    expect(serve.logs.join("")).toMatch(/"event":"model\.loaded"/);
  });

  it("reuses a long shared prefix from its cached pages", async () => {
    const p = "You are a careful assistant who answers briefly. ".repeat(12);
    await complete(`${p} What is a river?`, 2);
    const second = await complete(`${p} What is a lake?`, 2);
    expect(second.usage.prompt_tokens_details?.cached_tokens ?? 0).toBeGreaterThan(64);
  });
});
