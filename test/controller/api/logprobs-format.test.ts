import { describe, expect, it } from "vitest";
import { chatLogprobs, legacyLogprobs, promptLogprobsJson } from "../../../controller/api/logprobs-format.ts";
import type { TokenLogprob } from "../../../controller/api/service.ts";

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
