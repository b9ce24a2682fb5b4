import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { IncrementalDetokenizer, StopMatcher } from "../../../controller/api/text-stream.ts";

// A byte-level "tokenizer": each token is one byte; decoding is UTF-8 with
// replacement, so multi-byte characters split across tokens show U+FFFD until
// complete — the case incremental detokenization must handle.
const decodeBytes = (ids: readonly number[]) => Buffer.from(ids).toString("utf8");

describe("incremental detokenization", () => {
  it("emits exactly the full text, never a broken character", () => {
    fc.assert(
      fc.property(fc.string({ unit: "grapheme", maxLength: 40 }), (s) => {
        const ids = [...Buffer.from(s, "utf8")];
        const d = new IncrementalDetokenizer(decodeBytes);
        let out = "";
        for (const id of ids) {
          const piece = d.push(id);
          expect(piece).not.toContain("\uFFFD");
          out += piece;
        }
        out += d.flush();
        expect(out).toBe(s);
      }),
    );
  });
});

describe("stop sequences", () => {
  function run(stops: string[], pieces: string[]) {
    const m = new StopMatcher(stops);
    let out = "";
    let stopped = false;
    for (const p of pieces) {
      const r = m.push(p);
      out += r.emit;
      if (r.stopped) {
        stopped = true;
        break;
      }
    }
    if (!stopped) out += m.flush();
    return { out, stopped };
  }

  it("cuts before the stop sequence even when it spans pieces", () => {
    expect(run(["END"], ["hello E", "N", "D more"])).toEqual({ out: "hello ", stopped: true });
    expect(run(["\n\n", "###"], ["a\n", "b#", "##c"])).toEqual({ out: "a\nb", stopped: true });
  });

  it("releases held text that turned out not to be a stop sequence", () => {
    expect(run(["END"], ["hello E", "NX"])).toEqual({ out: "hello ENX", stopped: false });
    expect(run(["END"], ["trailing EN"])).toEqual({ out: "trailing EN", stopped: false });
  });

  it("whatever the split, the output is the text up to the first stop", () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 30 }), fc.array(fc.nat(30), { maxLength: 6 }), (text, cuts) => {
        const stop = "ab";
        const points = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((a, b) => a - b);
        const pieces: string[] = [];
        let prev = 0;
        for (const p of points) {
          pieces.push(text.slice(prev, p));
          prev = p;
        }
        pieces.push(text.slice(prev));
        const at = text.indexOf(stop);
        expect(run([stop], pieces)).toEqual({ out: at >= 0 ? text.slice(0, at) : text, stopped: at >= 0 });
      }),
    );
  });
});

describe("stop sequences: vLLM's include_stop_str_in_output and min_tokens", () => {
  it("includes the stop sequence when asked and names the one that matched", () => {
    const m = new StopMatcher(["END", "\n"], true);
    expect(m.push("ab E").emit).toBe("ab ");
    const r = m.push("ND c");
    expect(r).toEqual({ emit: "END", stopped: true });
    expect(m.matched).toBe("END");
  });

  it("does not match text pushed before it is armed", () => {
    const m = new StopMatcher(["ab"]);
    expect(m.push("xa", false)).toEqual({ emit: "xa", stopped: false });
    // the held "a" was released unarmed, so "b" does not complete "ab"
    expect(m.push("b", true)).toEqual({ emit: "b", stopped: false });
    expect(m.push("ab", true)).toEqual({ emit: "", stopped: true });
    expect(m.matched).toBe("ab");
  });
});
