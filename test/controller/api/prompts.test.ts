import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { CodecThreadData } from "../../../cli/embedded/codec-thread.ts";
import { textCodec } from "../../../cli/embedded/text-codec.ts";
import { type CodecJob, INLINE_BYTES, promptIds, spread } from "../../../controller/api/prompts.ts";
import { parseChatRequest, parseCompletionRequest } from "../../../controller/api/request.ts";
import type { TextCodec } from "../../../controller/api/service.ts";
import { ThreadPool } from "../../../controller/api/thread-pool.ts";
import { tinyModel } from "../../worker/runtime/fixture.ts";

/**
 * Tokenizing on the tokenizer threads gives the ids tokenizing inline gives:
 * the threads encode as the service's codec does, from the model directory.
 * Checked on the tiny model's byte-level BPE for text prompts (several per
 * request, with the BOS completions add) and a rendered chat, each over the
 * inline threshold.
 */

let cleanup: () => Promise<void>;
let codec: TextCodec;
let threads: ThreadPool<CodecJob, number[][]>;

beforeAll(async () => {
  const t = await tinyModel();
  cleanup = t.cleanup;
  codec = textCodec(t.model);
  const data: CodecThreadData = { modelDir: t.model.dir };
  threads = new ThreadPool<CodecJob, number[][]>({
    entry: new URL("../../../cli/embedded/codec-thread.ts", import.meta.url),
    data,
    threads: 2,
    maxQueued: 4,
    name: "tokenizer",
  });
});
afterAll(async () => {
  await threads?.close();
  await cleanup?.();
});

const text = (seed: number, n: number) =>
  Array.from({ length: n }, (_, i) => `w${(seed * 7919 + i * 104729) % 100_003} ünï ${i % 13}`).join(" ");

describe("prompts tokenized off the event loop", () => {
  it("equal the inline ids for text prompts", async () => {
    const parsed = parseCompletionRequest({
      model: "tiny",
      prompt: [text(1, 900), text(2, 40), text(3, 1500)],
    });
    const bytes = parsed.prompts.reduce((a, p) => a + (p.kind === "text" ? Buffer.byteLength(p.text) : 0), 0);
    expect(bytes).toBeGreaterThan(INLINE_BYTES);
    const off = await promptIds(parsed, codec, threads, bytes);
    const inline = await promptIds(parsed, codec, undefined, bytes);
    expect(off).toEqual(inline);
    expect(off.ids.map((ids) => ids.length).every((n) => n > 0)).toBe(true);
  }, 60_000);

  it("equal the inline ids for a rendered chat", async () => {
    const parsed = parseChatRequest({
      model: "tiny",
      messages: [
        { role: "system", content: text(4, 300) },
        { role: "user", content: text(5, 800) },
        { role: "assistant", content: "ok" },
        { role: "user", content: [{ type: "text", text: text(6, 200) }] },
      ],
    });
    const off = await promptIds(parsed, codec, threads, INLINE_BYTES + 1);
    const rendered = codec.renderChat(parsed.chat.prompt);
    expect(off).toEqual({ ids: [codec.encode(rendered)], rendered });
  }, 60_000);
});

describe("spread", () => {
  it("splits texts into at most `parts` consecutive runs, in order, none empty", () => {
    const texts = Array.from({ length: 64 }, (_, i) => "x".repeat(1 + ((i * 37) % 50)));
    for (const parts of [1, 2, 3, 8, 64, 100]) {
      const runs = spread(texts, parts);
      expect(runs.length).toBeLessThanOrEqual(parts);
      expect(runs.every((r) => r.length > 0)).toBe(true);
      expect(runs.flat()).toEqual(texts);
    }
    expect(spread(["a"], 4)).toEqual([["a"]]);
  });
});
