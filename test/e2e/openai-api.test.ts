import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ServeProcess, startServe } from "./serve-process.ts";

let server: ServeProcess;
let client: OpenAI;

beforeAll(async () => {
  server = await startServe();
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
});
afterAll(async () => {
  await server?.stop();
});

async function post(path: string, body: unknown, headers: Record<string, string> = {}) {
  const r = await fetch(`${server.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return {
    status: r.status,
    body: (await r.json()) as { error?: { message: string; param: string | null; code: string | null } },
  };
}

describe("the embedded default through the official openai client", () => {
  it("lists the model", async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual(["tiny"]);
  });

  it("completes a prompt, deterministically with greedy sampling", async () => {
    const a = await client.completions.create({
      model: "tiny",
      prompt: "The river ran",
      max_tokens: 8,
      temperature: 0,
    });
    const b = await client.completions.create({
      model: "tiny",
      prompt: "The river ran",
      max_tokens: 8,
      temperature: 0,
    });
    expect(a.choices).toHaveLength(1);
    expect(a.choices[0]!.finish_reason).toBe("length");
    expect(a.usage?.completion_tokens).toBe(8);
    expect(b.choices[0]!.text).toBe(a.choices[0]!.text);
  });

  it("chats, streamed and not, with the same greedy text", async () => {
    const messages = [{ role: "user" as const, content: "Tell me about the sea." }];
    const whole = await client.chat.completions.create({
      model: "tiny",
      messages,
      max_tokens: 10,
      temperature: 0,
    });
    const stream = await client.chat.completions.create({
      model: "tiny",
      messages,
      max_tokens: 10,
      temperature: 0,
      stream: true,
    });
    let text = "";
    let finish: string | null = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(finish).toBe("length");
    expect(text).toBe(whole.choices[0]!.message.content);
  });

  it("n > 1 with seeds gives n choices sharing one prompt", async () => {
    const r = await client.completions.create({
      model: "tiny",
      prompt: "Once",
      max_tokens: 6,
      n: 3,
      seed: 5,
      temperature: 1,
    });
    expect(r.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    expect(r.usage?.prompt_tokens).toBeGreaterThan(0);
    const again = await client.completions.create({
      model: "tiny",
      prompt: "Once",
      max_tokens: 6,
      n: 3,
      seed: 5,
      temperature: 1,
    });
    expect(again.choices.map((c) => c.text)).toEqual(r.choices.map((c) => c.text));
  });

  it("a second request with the same long prefix reuses cached tokens", async () => {
    const prefix = "You are a careful assistant that answers in short sentences. ".repeat(8);
    const first = await client.completions.create({
      model: "tiny",
      prompt: `${prefix}Q1`,
      max_tokens: 2,
      temperature: 0,
    });
    const second = await client.completions.create({
      model: "tiny",
      prompt: `${prefix}Q2`,
      max_tokens: 2,
      temperature: 0,
    });
    const cached = (u: unknown) =>
      (u as { prompt_tokens_details?: { cached_tokens?: number } }).prompt_tokens_details?.cached_tokens;
    expect(cached(first.usage)).toBe(0);
    expect(cached(second.usage)).toBeGreaterThanOrEqual(64);
  });

  it("answers bad input with the right 4xx and an OpenAI error body", async () => {
    expect((await post("/v1/completions", "{not json")).status).toBe(400);
    const unknown = await post("/v1/completions", { model: "gpt-9", prompt: "x" });
    expect(unknown.status).toBe(404);
    expect(unknown.body.error?.code).toBe("model_not_found");
    const wrongType = await post("/v1/completions", { model: "tiny", prompt: "x", max_tokens: "many" });
    expect(wrongType.status).toBe(400);
    expect(wrongType.body.error?.param).toBe("max_tokens");
    const tooLong = await post("/v1/completions", { model: "tiny", prompt: "x", max_tokens: 100000 });
    expect(tooLong.status).toBe(400);
    expect(tooLong.body.error?.code).toBe("context_length_exceeded");
    const badToken = await post("/v1/completions", { model: "tiny", prompt: [1, 2, 999999] });
    expect(badToken.status).toBe(400);
    expect((await fetch(`${server.url}/v1/nothing`)).status).toBe(404);
  });

  it("honours the sampling and stopping fields, with vLLM's stop_reason", async () => {
    // Byte-level BPE: id 97 is the byte "a".
    const base = { model: "tiny", prompt: "The river ran", temperature: 0, max_tokens: 5 };
    const create = (extra: Record<string, unknown>) =>
      client.completions.create({
        ...base,
        ...extra,
      } as unknown as OpenAI.CompletionCreateParamsNonStreaming);
    const biased = await create({ logit_bias: { "97": 100 } });
    expect(biased.choices[0]!.text).toBe("aaaaa");
    const cut = await create({ logit_bias: { "97": 100 }, stop: ["aaa"] });
    expect(cut.choices[0]).toMatchObject({ text: "", finish_reason: "stop", stop_reason: "aaa" });
    const kept = await create({ logit_bias: { "97": 100 }, stop: ["aaa"], include_stop_str_in_output: true });
    expect(kept.choices[0]!.text).toBe("aaa");
    const byId = await create({ logit_bias: { "97": 100 }, stop_token_ids: [97] });
    expect(byId.choices[0]).toMatchObject({ text: "", finish_reason: "stop", stop_reason: 97 });
    expect(byId.usage?.completion_tokens).toBe(1);
    const held = await create({
      logit_bias: { "97": 100 },
      stop_token_ids: [97],
      min_tokens: 3,
      max_tokens: 8,
    });
    expect(held.usage?.completion_tokens).toBe(4);
    expect(held.choices[0]).toMatchObject({ finish_reason: "stop", stop_reason: 97 });
    const allowed = await create({ allowed_token_ids: [98, 99], temperature: 1, seed: 3, max_tokens: 12 });
    expect(allowed.choices[0]!.text).toMatch(/^[bc]{12}$/);
    const refused = await post("/v1/completions", { ...base, use_beam_search: true });
    expect(refused.status).toBe(400);
    expect(refused.body.error?.param).toBe("use_beam_search");
  });

  it("serves health and Prometheus metrics", async () => {
    expect((await fetch(`${server.url}/health`)).status).toBe(200);
    const text = await (await fetch(`${server.url}/metrics`)).text();
    expect(text).toMatch(/^continuum_ttft_seconds_count [1-9]/m);
    expect(text).toMatch(/^continuum_pages_free \d+/m);
    expect(text).toMatch(/^continuum_cache_tokens\{source="resident"\} [1-9]/m);
  });
});
