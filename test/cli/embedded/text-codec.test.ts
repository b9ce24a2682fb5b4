import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { textCodec } from "../../../cli/embedded/text-codec.ts";
import { ApiError } from "../../../controller/api/errors.ts";
import type { ChatPromptRequest } from "../../../controller/api/service.ts";
import { generateModel } from "../../../worker/model/generate.ts";
import { loadModelIdentity, type ModelIdentity } from "../../../worker/model/model-dir.ts";

let dir: string;
let model: ModelIdentity;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "continuum-codec-"));
  await generateModel({ preset: "tiny", out: join(dir, "m"), seed: 3 });
  model = await loadModelIdentity(join(dir, "m"), { variant: "cpu-f32acc/v1" });
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const req = (r: Partial<ChatPromptRequest>): ChatPromptRequest => ({
  messages: [{ role: "user", content: "Hi" }],
  tools: null,
  documents: null,
  addGenerationPrompt: true,
  continueFinalMessage: false,
  template: null,
  kwargs: {},
  ...r,
});

function apiError(f: () => unknown): ApiError {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(ApiError);
    return e as ApiError;
  }
  throw new Error("expected an ApiError");
}

describe("the text codec's chat rendering (vLLM's conversation rules)", () => {
  it("renders the model's own template; developer reads as system; tool call arguments as objects", () => {
    const codec = textCodec(model);
    expect(codec.renderChat(req({}))).toBe("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    expect(
      codec.renderChat(
        req({
          messages: [
            { role: "developer", content: "Be brief." },
            { role: "user", content: "Hi" },
          ],
        }),
      ),
    ).toBe(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    );
    const calls = codec.renderChat(
      req({
        messages: [
          { role: "user", content: "Weather?" },
          {
            role: "assistant",
            content: null,
            toolCalls: [
              { id: "c1", type: "function", function: { name: "w", arguments: '{"city": "Oslo"}' } },
            ],
          },
          { role: "tool", content: "-3", toolCallId: "c1" },
        ],
        addGenerationPrompt: false,
      }),
    );
    expect(calls).toBe(
      '<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "w", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n-3\n</tool_response><|im_end|>\n',
    );
  });

  it("the request's chat_template, then the configured one, then the model's; a template error is a 400", () => {
    expect(textCodec(model).renderChat(req({ template: "X{{ messages[0].content }}" }))).toBe("XHi");
    const configured = textCodec(model, "C{{ messages | length }}");
    expect(configured.renderChat(req({}))).toBe("C1");
    expect(configured.renderChat(req({ template: "R" }))).toBe("R");
    const e = apiError(() =>
      textCodec(model).renderChat(req({ template: "{{ raise_exception('no way') }}" })),
    );
    expect(e.status).toBe(400);
    expect(e.message).toContain("no way");
  });

  it("a model without a template refuses chat with a 400 unless one is given; 'tool_use' is chosen for tools", async () => {
    const config = JSON.parse(await readFile(join(dir, "m", "tokenizer_config.json"), "utf8"));
    delete config.chat_template;
    const noTemplateDir = join(dir, "bare");
    await generateModel({ preset: "tiny", out: noTemplateDir, seed: 3 });
    await writeFile(join(noTemplateDir, "tokenizer_config.json"), JSON.stringify(config));
    const m = await loadModelIdentity(noTemplateDir, { variant: "cpu-f32acc/v1" });
    const e = apiError(() => textCodec(m).renderChat(req({})));
    expect(e.status).toBe(400);
    expect(e.param).toBe("chat_template");
    expect(textCodec(m, "T").renderChat(req({}))).toBe("T");
    await writeFile(
      join(noTemplateDir, "tokenizer_config.json"),
      JSON.stringify({
        ...config,
        chat_template: [
          { name: "default", template: "plain" },
          { name: "tool_use", template: "tools:{{ tools | length }}" },
        ],
      }),
    );
    const named = textCodec(await loadModelIdentity(noTemplateDir, { variant: "cpu-f32acc/v1" }));
    expect(named.renderChat(req({}))).toBe("plain");
    expect(named.renderChat(req({ tools: [{ type: "function", function: { name: "f" } }] }))).toBe("tools:1");
  });
});
