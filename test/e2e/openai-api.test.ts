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

  it("scores a continuation as lm-eval-harness does (echo, logprobs 1, max_tokens 1) and with max_tokens 0", async () => {
    const context = [11, 23, 35, 47, 59, 71, 83, 95];
    const continuation = [107, 119, 131];
    const r = await client.completions.create({
      model: "tiny",
      prompt: [[...context, ...continuation], context],
      echo: true,
      logprobs: 1,
      max_tokens: 1,
      temperature: 0,
    });
    expect(r.choices).toHaveLength(2);
    const lp = r.choices[0]!.logprobs!;
    // prompt tokens then the generated one; the first has no log-probability
    expect(lp.tokens).toHaveLength(context.length + continuation.length + 1);
    expect(lp.token_logprobs![0]).toBeNull();
    expect(lp.top_logprobs![0]).toBeNull();
    const ctxlen = context.length;
    const scored = lp.token_logprobs!.slice(ctxlen, -1) as number[];
    expect(scored).toHaveLength(continuation.length);
    expect(scored.every((x) => x < 0)).toBe(true);
    // lm-eval's is_greedy: each token's logprob against the max of its top dict (the token + the top 1)
    for (const [i, top] of (lp.top_logprobs!.slice(ctxlen, -1) as Record<string, number>[]).entries()) {
      expect(Object.keys(top).length).toBeLessThanOrEqual(2);
      expect(Math.max(...Object.values(top))).toBeGreaterThanOrEqual(scored[i]!);
    }
    // text offsets run over the token texts
    expect(lp.text_offset![1]).toBe(lp.tokens![0]!.length);
    // max_tokens 0: the prompt alone, nothing generated, the same scores
    const only = await client.completions.create({
      model: "tiny",
      prompt: [...context, ...continuation],
      echo: true,
      logprobs: 1,
      max_tokens: 0,
    });
    const o = only.choices[0]!;
    expect(o.logprobs!.token_logprobs).toEqual(lp.token_logprobs!.slice(0, -1));
    expect(only.usage?.completion_tokens).toBe(0);
    expect(o.finish_reason).toBe("length");
  });

  it("log-probabilities on completions and chat, streamed too; best_of, prompt_logprobs, token ids", async () => {
    const c = await client.completions.create({
      model: "tiny",
      prompt: "Once upon",
      max_tokens: 4,
      logprobs: 3,
      temperature: 0,
    });
    const l = c.choices[0]!.logprobs!;
    expect(l.tokens).toHaveLength(4);
    expect(l.tokens!.join("")).toBe(c.choices[0]!.text);
    for (const top of l.top_logprobs as Record<string, number>[])
      expect(Object.keys(top).length).toBeLessThanOrEqual(4);
    const stream = await client.completions.create({
      model: "tiny",
      prompt: "Once upon",
      max_tokens: 4,
      logprobs: 3,
      temperature: 0,
      stream: true,
    });
    const streamed: number[] = [];
    const offsets: number[] = [];
    for await (const chunk of stream) {
      streamed.push(...((chunk.choices[0]?.logprobs?.token_logprobs ?? []) as number[]));
      offsets.push(...(chunk.choices[0]?.logprobs?.text_offset ?? []));
    }
    expect(streamed).toEqual(l.token_logprobs);
    expect(offsets).toEqual(l.text_offset);

    const chat = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 3,
      logprobs: true,
      top_logprobs: 2,
      temperature: 0,
    });
    const content = chat.choices[0]!.logprobs!.content!;
    expect(content).toHaveLength(3);
    for (const e of content) {
      expect(e.top_logprobs).toHaveLength(2);
      // greedy: the token is the most likely
      expect(e.top_logprobs[0]!.token).toBe(e.token);
      // The token's own bytes: its text is what they decode to (U+FFFD for part of a UTF-8 sequence).
      expect(Buffer.from(e.bytes!).toString("utf8")).toBe(e.token);
    }
    const chatStream = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 3,
      logprobs: true,
      top_logprobs: 2,
      temperature: 0,
      stream: true,
      stream_options: {
        include_usage: true,
        continuous_usage_stats: true,
      } as OpenAI.ChatCompletionStreamOptions,
    });
    const chunks: { logprob: number }[] = [];
    let usages = 0;
    for await (const chunk of chatStream) {
      chunks.push(...(chunk.choices[0]?.logprobs?.content ?? []));
      if (chunk.usage) usages++;
    }
    expect(chunks.map((e) => e.logprob)).toEqual(content.map((e) => e.logprob));
    expect(usages).toBeGreaterThan(3);

    const best = await client.completions.create({
      model: "tiny",
      prompt: "Once upon",
      max_tokens: 5,
      n: 2,
      best_of: 5,
      temperature: 1,
      seed: 9,
      logprobs: 0,
    });
    expect(best.choices.map((x) => x.index)).toEqual([0, 1]);
    const sums = best.choices.map((x) => (x.logprobs!.token_logprobs as number[]).reduce((a, b) => a + b, 0));
    expect(sums[0]!).toBeGreaterThanOrEqual(sums[1]!);
    expect(best.usage?.completion_tokens).toBe(25);

    const ids = (await post("/v1/completions", {
      model: "tiny",
      prompt: [5, 6, 7, 8],
      max_tokens: 2,
      temperature: 0,
      prompt_logprobs: 1,
      return_token_ids: true,
      logprobs: 0,
      return_tokens_as_token_ids: true,
    })) as unknown as { status: number; body: { choices: Record<string, unknown>[] } };
    const choice = ids.body.choices[0]!;
    expect(choice.prompt_token_ids).toEqual([5, 6, 7, 8]);
    expect((choice.token_ids as number[]).length).toBe(2);
    const plp = choice.prompt_logprobs as (Record<string, { logprob: number; rank: number }> | null)[];
    expect(plp).toHaveLength(4);
    expect(plp[0]).toBeNull();
    expect(plp[1]!["6"]!.rank).toBeGreaterThanOrEqual(1);
    expect((choice.logprobs as { tokens: string[] }).tokens[0]).toMatch(/^token_id:\d+$/);
  });

  it("renders the model's Jinja chat template, or the request's, with vLLM's chat fields", async () => {
    const chat = (body: Record<string, unknown>) =>
      client.chat.completions.create({
        model: "tiny",
        max_tokens: 2,
        temperature: 0,
        ...body,
      } as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming) as Promise<
        OpenAI.ChatCompletion & { prompt_text?: string }
      >;
    const own = await chat({
      messages: [
        { role: "developer", content: "Be brief." },
        {
          role: "user",
          content: [
            { type: "text", text: "Hello" },
            { type: "text", text: "there" },
          ],
        },
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "c1", type: "function", function: { name: "w", arguments: '{"city":"Oslo"}' } }],
        },
        { role: "tool", tool_call_id: "c1", content: "-3" },
      ],
      return_prompt_text: true,
    });
    expect(own.prompt_text).toBe(
      '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello\nthere<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "w", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n-3\n</tool_response><|im_end|>\n<|im_start|>assistant\n',
    );
    const custom = await chat({
      messages: [{ role: "user", content: "Hi" }],
      chat_template:
        "{{ greeting }}: {% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %} =>{% endif %}",
      chat_template_kwargs: { greeting: "Q" },
      return_prompt_text: true,
    });
    expect(custom.prompt_text).toBe("Q: Hi =>");
    const noPrompt = await chat({
      messages: [{ role: "user", content: "Hi" }],
      add_generation_prompt: false,
      return_prompt_text: true,
    });
    expect(noPrompt.prompt_text).toBe("<|im_start|>user\nHi<|im_end|>\n");
    const cont = await chat({
      messages: [
        { role: "user", content: "Hi" },
        { role: "assistant", content: "Well, the" },
      ],
      continue_final_message: true,
      return_prompt_text: true,
      echo: true,
    });
    expect(cont.prompt_text).toBe("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nWell, the");
    // echo: the continued message is prepended to the answer (vLLM)
    expect(cont.choices[0]!.message.content!.startsWith("Well, the")).toBe(true);
    const broken = await post("/v1/chat/completions", {
      model: "tiny",
      messages: [{ role: "user", content: "Hi" }],
      chat_template: "{{ raise_exception('roles must alternate') }}",
    });
    expect(broken.status).toBe(400);
    expect(broken.body.error?.message).toContain("roles must alternate");
  });

  it("serves vLLM's /tokenize, /detokenize, /version and GET /v1/models/{id}", async () => {
    const tok = (await post("/tokenize", {
      model: "tiny",
      prompt: "Hello world",
      return_token_strs: true,
    })) as unknown as {
      status: number;
      body: { count: number; max_model_len: number; tokens: number[]; token_strs: string[] };
    };
    expect(tok.status).toBe(200);
    // the post-processor's BOS (add_special_tokens defaults to true)
    expect(tok.body.token_strs[0]).toBe("<|bos|>");
    expect(tok.body.count).toBe(tok.body.tokens.length);
    expect(tok.body.max_model_len).toBeGreaterThan(0);
    const bare = (await post("/tokenize", {
      prompt: "Hello world",
      add_special_tokens: false,
    })) as unknown as {
      body: { tokens: number[] };
    };
    expect(bare.body.tokens).toEqual(tok.body.tokens.slice(1));
    const chat = (await post("/tokenize", {
      model: "tiny",
      messages: [{ role: "user", content: "Hi" }],
    })) as unknown as {
      body: { tokens: number[] };
    };
    const back = (await post("/detokenize", { model: "tiny", tokens: chat.body.tokens })) as unknown as {
      body: { prompt: string };
    };
    expect(back.body.prompt).toBe("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    expect((await post("/detokenize", { tokens: [999999] })).status).toBe(400);
    expect((await post("/tokenize", { model: "nope", prompt: "x" })).status).toBe(404);
    const version = (await (await fetch(`${server.url}/version`)).json()) as { version: string };
    expect(version.version).toMatch(/^\d+\.\d+\.\d+/);
    const card = await client.models.retrieve("tiny");
    expect(card).toMatchObject({ id: "tiny", object: "model", owned_by: "continuum" });
    expect((await fetch(`${server.url}/v1/models/other`)).status).toBe(404);
  });

  it("defaults as vLLM's: a BOS on completions, 16 tokens, and cache_salt, request_id, truncate_prompt_tokens", async () => {
    const text = "A long enough prompt to fill a page or two of the cache. ".repeat(3);
    const counted = (await post("/tokenize", { prompt: text })) as unknown as { body: { count: number } };
    const r = await client.completions.create({
      model: "tiny",
      prompt: text,
      temperature: 0,
      ignore_eos: true,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(r.usage?.prompt_tokens).toBe(counted.body.count);
    expect(r.usage?.completion_tokens).toBe(16);
    const salted = (salt: string) =>
      client.completions.create({
        model: "tiny",
        prompt: text,
        max_tokens: 1,
        cache_salt: salt,
      } as OpenAI.CompletionCreateParamsNonStreaming);
    const cached = (u: unknown) =>
      (u as { prompt_tokens_details: { cached_tokens: number } }).prompt_tokens_details.cached_tokens;
    expect(cached((await salted("s1")).usage)).toBe(0);
    expect(cached((await salted("s1")).usage)).toBeGreaterThan(0);
    expect(cached((await salted("s2")).usage)).toBe(0);
    const named = await client.completions.create({
      model: "tiny",
      prompt: "x",
      max_tokens: 1,
      request_id: "my-req-1",
    } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(named.id).toBe("cmpl-my-req-1");
    const cut = await client.completions.create({
      model: "tiny",
      prompt: text,
      max_tokens: 1,
      truncate_prompt_tokens: 5,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(cut.usage?.prompt_tokens).toBe(5);
  });

  it("constrains output to a JSON schema, a JSON object, a regex or a choice (every form vLLM takes)", async () => {
    const schema = {
      type: "object",
      properties: {
        city: { type: "string", maxLength: 8 },
        temp: { type: "integer", minimum: -50, maximum: 50 },
      },
      required: ["city", "temp"],
      additionalProperties: false,
    };
    const r = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Weather?" }],
      response_format: { type: "json_schema", json_schema: { name: "weather", schema, strict: true } },
      max_tokens: 60,
      seed: 3,
    });
    const v = JSON.parse(r.choices[0]!.message.content!) as { city: string; temp: number };
    expect(typeof v.city).toBe("string");
    expect(Number.isInteger(v.temp) && v.temp >= -50 && v.temp <= 50).toBe(true);
    const obj = await client.completions.create({
      model: "tiny",
      prompt: "JSON:",
      response_format: { type: "json_object" },
      max_tokens: 60,
      seed: 4,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(JSON.parse(obj.choices[0]!.text)).toBeTypeOf("object");
    const stream = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Pick" }],
      max_tokens: 20,
      stream: true,
      structured_outputs: { choice: ["alpha", "beta", "gamma"] },
    } as unknown as OpenAI.ChatCompletionCreateParamsStreaming);
    let picked = "";
    for await (const chunk of stream) picked += chunk.choices[0]?.delta?.content ?? "";
    expect(["alpha", "beta", "gamma"]).toContain(picked);
    const re = await client.completions.create({
      model: "tiny",
      prompt: "Code:",
      max_tokens: 20,
      guided_regex: "[A-Z]{3}-\\d{2}",
    } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(re.choices[0]!.text).toMatch(/^[A-Z]{3}-\d{2}$/);
    const legacy = await client.completions.create({
      model: "tiny",
      prompt: "x",
      max_tokens: 30,
      guided_json: { type: "array", items: { type: "boolean" }, maxItems: 2 },
    } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(Array.isArray(JSON.parse(legacy.choices[0]!.text))).toBe(true);
    const base = { model: "tiny", prompt: "x", max_tokens: 30 };
    const unsupported = await post("/v1/completions", {
      ...base,
      response_format: {
        type: "json_schema",
        json_schema: { name: "n", schema: { type: "string", format: "hostname" } },
      },
    });
    expect(unsupported.status).toBe(400);
    expect(unsupported.body.error?.message).toContain("hostname");
    const two = await post("/v1/completions", { ...base, guided_regex: "a", guided_choice: ["b"] });
    expect(two.status).toBe(400);
    const tight = await post("/v1/completions", {
      ...base,
      max_tokens: 3,
      response_format: { type: "json_schema", json_schema: { name: "n", schema } },
    });
    expect(tight.status).toBe(400);
    expect(tight.body.error?.param).toBe("max_tokens");
  });

  it("tools: the template sees them; required and named choices always yield parseable calls, streamed too", async () => {
    const tools: OpenAI.ChatCompletionTool[] = [
      {
        type: "function",
        function: {
          name: "get_weather",
          description: "Weather for a city",
          parameters: {
            type: "object",
            properties: {
              city: { type: "string", maxLength: 8 },
              days: { type: "integer", minimum: 1, maximum: 7 },
            },
            required: ["city"],
            additionalProperties: false,
          },
        },
      },
      {
        type: "function",
        function: {
          name: "get_time",
          parameters: { type: "object", properties: {}, additionalProperties: false },
        },
      },
    ];
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: "Weather in Oslo?" }];
    const shown = (await post("/v1/chat/completions", {
      model: "tiny",
      messages,
      tools,
      max_tokens: 1,
      return_prompt_text: true,
    })) as unknown as {
      body: { prompt_text: string };
    };
    expect(shown.body.prompt_text).toContain(
      '<tools>\n{"type": "function", "function": {"name": "get_weather"',
    );
    const required = await client.chat.completions.create({
      model: "tiny",
      messages,
      tools,
      tool_choice: "required",
      max_tokens: 80,
      seed: 2,
    });
    const rc = required.choices[0]!;
    expect(rc.message.tool_calls!.length).toBeGreaterThan(0);
    for (const call of rc.message.tool_calls!) {
      const fn = (call as OpenAI.ChatCompletionMessageFunctionToolCall).function;
      expect(["get_weather", "get_time"]).toContain(fn.name);
      expect(JSON.parse(fn.arguments)).toBeTypeOf("object");
    }
    expect(["tool_calls", "length"]).toContain(rc.finish_reason);
    const named = await client.chat.completions.create({
      model: "tiny",
      messages,
      tools,
      tool_choice: { type: "function", function: { name: "get_weather" } },
      max_tokens: 60,
      seed: 5,
    });
    const call = named.choices[0]!.message.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(call.function.name).toBe("get_weather");
    expect(typeof (JSON.parse(call.function.arguments) as { city: string }).city).toBe("string");
    // streamed: the deltas accumulate into the same kind of call
    const stream = await client.chat.completions.create({
      model: "tiny",
      messages,
      tools,
      tool_choice: { type: "function", function: { name: "get_weather" } },
      max_tokens: 60,
      seed: 5,
      stream: true,
    });
    let args = "";
    let name = "";
    for await (const chunk of stream) {
      for (const d of chunk.choices[0]?.delta?.tool_calls ?? []) {
        name += d.function?.name ?? "";
        args += d.function?.arguments ?? "";
      }
    }
    expect(name).toBe("get_weather");
    expect(args).toBe(call.function.arguments);
    // auto: the model's text, parsed for Hermes calls (here the output is steered into one)
    const auto = await client.chat.completions.create({
      model: "tiny",
      messages,
      tools,
      max_tokens: 100,
      structured_outputs: {
        regex: 'Sure\\.<tool_call>\\n\\{"name": "get_time", "arguments": \\{\\}\\}\\n</tool_call>',
      },
    } as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming);
    expect(auto.choices[0]!.finish_reason).toBe("tool_calls");
    expect(auto.choices[0]!.message.content).toBe("Sure.");
    expect(
      (auto.choices[0]!.message.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall).function,
    ).toEqual({
      name: "get_time",
      arguments: "{}",
    });
    const plain = await client.chat.completions.create({
      model: "tiny",
      messages,
      tools,
      max_tokens: 5,
      temperature: 0,
    });
    expect(plain.choices[0]!.message.tool_calls).toBeUndefined();
    const both = await post("/v1/chat/completions", {
      model: "tiny",
      messages,
      tools,
      tool_choice: "required",
      response_format: { type: "json_object" },
    });
    expect(both.status).toBe(400);
  });

  it("serves health and Prometheus metrics", async () => {
    expect((await fetch(`${server.url}/health`)).status).toBe(200);
    const text = await (await fetch(`${server.url}/metrics`)).text();
    expect(text).toMatch(/^continuum_ttft_seconds_count [1-9]/m);
    expect(text).toMatch(/^continuum_pages_free \d+/m);
    expect(text).toMatch(/^continuum_cache_tokens\{source="resident"\} [1-9]/m);
  });
});
