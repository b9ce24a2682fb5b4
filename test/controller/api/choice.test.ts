import { describe, expect, it } from "vitest";
import { ChoiceRun, endTokenIds } from "../../../controller/api/choice.ts";
import type { StopRules } from "../../../controller/api/request-sampling.ts";
import type { Generation, TextCodec } from "../../../controller/api/service.ts";

// One token per byte; id 200 is a special token "<eos>" (skipped unless asked for).
const EOS = 200;
const codec: TextCodec = {
  encode: (t) => [...Buffer.from(t)],
  decode: (ids, o) =>
    ids
      .filter((i) => i !== EOS || o?.skipSpecialTokens === false)
      .map((i) => (i === EOS ? "<eos>" : String.fromCharCode(i)))
      .join(""),
  renderChat: () => "",
  tokenString: (id) => String(id),
  tokenBytes: () => null,
  checkConstraint: () => 0,
  toolParser: null,
  eosTokenIds: [EOS],
  vocabSize: 256,
};

function run(stop: Partial<StopRules>, minTokens = 0, skipSpecialTokens = true) {
  let cancelled = false;
  const gen: Generation = {
    events: (async function* () {})(),
    cancel: () => {
      cancelled = true;
    },
  };
  const rules: StopRules = { strings: [], tokenIds: [], includeStopStr: false, ignoreEos: false, ...stop };
  const r = new ChoiceRun(0, [1, 2, 3], gen, codec, {
    stop: rules,
    eosTokenIds: [EOS],
    skipSpecialTokens,
    minTokens,
  });
  return { r, cancelled: () => cancelled };
}

const ids = (s: string) => [...s].map((c) => c.charCodeAt(0));

describe("a choice's text, finish reason and vLLM stop_reason", () => {
  it("a stop string cuts the text, cancels the generation and is the stop reason", () => {
    const { r, cancelled } = run({ strings: ["lo"] });
    for (const t of ids("hello there")) r.onToken(t, null);
    const end = r.onEnd("cancelled", 0);
    expect(r.text).toBe("hel");
    expect(cancelled()).toBe(true);
    expect(end.finish).toBe("stop");
    expect(end.stopReason).toBe("lo");
    // tokens after the stop are not counted
    expect(r.completionTokens).toBe(5);
  });

  it("a stop_token_id ends with its id as the stop reason and its text dropped, EOS with none", () => {
    const a = run({ tokenIds: [ids("!")[0]!] });
    for (const t of ids("hi!")) a.r.onToken(t, null);
    expect(a.r.onEnd("stop", 0)).toMatchObject({ finish: "stop", stopReason: 33 });
    expect(a.r.text).toBe("hi");
    const b = run({});
    for (const t of [...ids("hi"), EOS]) b.r.onToken(t, null);
    expect(b.r.onEnd("stop", 0)).toMatchObject({ finish: "stop", stopReason: null });
    expect(b.r.completionTokens).toBe(3);
  });

  it("include_stop_str_in_output keeps the stop string and the stop token's text", () => {
    const a = run({ strings: ["lo"], includeStopStr: true });
    for (const t of ids("hello")) a.r.onToken(t, null);
    a.r.onEnd("cancelled", 0);
    expect(a.r.text).toBe("hello");
    const b = run({ includeStopStr: true }, 0, false);
    for (const t of [...ids("hi"), EOS]) b.r.onToken(t, null);
    b.r.onEnd("stop", 0);
    expect(b.r.text).toBe("hi<eos>");
  });

  it("stop strings are matched only after min_tokens tokens", () => {
    const { r } = run({ strings: ["a"] }, 3);
    for (const t of ids("aaaab")) r.onToken(t, null);
    r.onEnd("cancelled", 0);
    // tokens 1-3 are before min_tokens; the 4th "a" stops
    expect(r.text).toBe("aaa");
    expect(r.stopReason).toBe("a");
  });

  it("ignore_eos leaves EOS out of the ids that end generation", () => {
    expect(
      endTokenIds({ strings: [], tokenIds: [5], includeStopStr: false, ignoreEos: false }, [EOS]),
    ).toEqual([5, EOS]);
    expect(
      endTokenIds({ strings: [], tokenIds: [5], includeStopStr: false, ignoreEos: true }, [EOS]),
    ).toEqual([5]);
  });
});
