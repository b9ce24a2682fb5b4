import { describe, expect, it } from "vitest";
import {
  chatLogprobs,
  legacyLogprobs,
  promptLogprobsJson,
  tokenBytes,
  tokenText,
} from "../../../controller/api/logprobs-format.ts";
import type { TextCodec, TokenLogprob } from "../../../controller/api/service.ts";

const text = (id: number) => ["a", "bb", "c", "dd"][id] ?? `<${id}>`;
const lp = (token: number, logprob: number, top: [number, number][], rank = 1): TokenLogprob => ({
  token,
  logprob,
  rank,
  top,
});

describe("log-probability response shapes", () => {
  it("legacy completions: tokens, token_logprobs, top_logprobs (the token plus the top N), text_offset", () => {
    const got = legacyLogprobs(
      [0, 1, 2],
      [
        null,
        lp(1, -0.5, [
          [1, -0.5],
          [3, -1],
        ]),
        lp(2, -3, [[1, -0.2]], 4),
      ],
      1,
      text,
      10,
    );
    expect(got).toEqual({
      tokens: ["a", "bb", "c"],
      token_logprobs: [null, -0.5, -3],
      // N = 1: the chosen token and the most likely one (merged when they are the same)
      top_logprobs: [null, { bb: -0.5 }, { c: -3, bb: -0.2 }],
      text_offset: [10, 11, 13],
    });
  });

  it("chat: the top N in rank order, with bytes; -inf is reported as -9999", () => {
    const got = chatLogprobs(
      [
        lp(0, Number.NEGATIVE_INFINITY, [
          [1, -0.1],
          [2, -0.2],
          [0, Number.NEGATIVE_INFINITY],
        ]),
      ],
      2,
      text,
      (id) => [...Buffer.from(text(id))],
    );
    expect(got).toEqual([
      {
        token: "a",
        logprob: -9999,
        bytes: [97],
        top_logprobs: [
          { token: "bb", logprob: -0.1, bytes: [98, 98] },
          { token: "c", logprob: -0.2, bytes: [99] },
        ],
      },
    ]);
  });

  it("chat bytes are the token's own, a partial UTF-8 sequence included (not U+FFFD's)", () => {
    // id 0: the first two bytes of "€" (e2 82 ac), which decode alone to U+FFFD; id 1: a special token.
    const own = new Map<number, Uint8Array | null>([
      [0, Uint8Array.from([0xe2, 0x82])],
      [1, null],
    ]);
    const codec = {
      decode: (ids: readonly number[]) => (ids[0] === 0 ? "\ufffd" : "<eos>"),
      tokenBytes: (id: number) => own.get(id) ?? null,
    } as unknown as TextCodec;
    const t = tokenText(codec, false);
    const got = chatLogprobs([lp(0, -1, [[1, -2]])], 1, t, tokenBytes(codec, t, false));
    expect(got[0]!.token).toBe("\ufffd");
    expect(got[0]!.bytes).toEqual([0xe2, 0x82]);
    expect(got[0]!.top_logprobs[0]).toEqual({
      token: "<eos>",
      logprob: -2,
      bytes: [...Buffer.from("<eos>")],
    });
    const asIds = tokenText(codec, true);
    expect(tokenBytes(codec, asIds, true)(0)).toEqual([...Buffer.from("token_id:0")]);
  });

  it("vLLM prompt_logprobs: null first, then the prompt token and its top N with ranks", () => {
    const got = promptLogprobsJson(
      [0, 1, 2],
      [lp(1, -0.5, [[1, -0.5]], 1), lp(2, -2, [[3, -0.1]], 2)],
      1,
      text,
    );
    expect(got).toEqual([
      null,
      { "1": { logprob: -0.5, rank: 1, decoded_token: "bb" } },
      {
        "2": { logprob: -2, rank: 2, decoded_token: "c" },
        "3": { logprob: -0.1, rank: 1, decoded_token: "dd" },
      },
    ]);
  });
});
