import { describe, expect, it } from "vitest";
import { type GgufHeader, GgufMeta, type GgufValue } from "../../../worker/model/gguf.ts";
import { tokenizerFromGguf } from "../../../worker/model/gguf-tokenizer.ts";
import { ModelTokenizer } from "../../../worker/model/tokenizer.ts";

/**
 * A llama (SentencePiece-style) GGUF vocabulary: merges derived from the
 * scores, "▁" for spaces with a prefix space, byte fallback for characters
 * outside the vocabulary, control tokens special. (The gpt2 kind is checked
 * end to end against tokenizer.json in gguf-model.test.ts.)
 */
function header(meta: Record<string, GgufValue>): GgufHeader {
  return {
    file: "spm.gguf",
    version: 3,
    metadata: new Map(Object.entries(meta)),
    tensors: new Map(),
    alignment: 32,
    fileSize: 0,
  };
}

const bytes = Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
const pieces = ["▁", "a", "b", "c", "ab", "▁a", "▁ab", "abc", "▁abc"];
const tokens = ["<unk>", "<s>", "</s>", ...bytes, ...pieces];
// Scores: longer pieces win (SentencePiece merges the best-scoring pair first).
const scores = tokens.map((t, i) => (i < 3 + 256 ? 0 : -100 + 10 * Array.from(t).length));
const types = tokens.map((_, i) => (i === 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1));

describe("a llama SentencePiece vocabulary from GGUF metadata", () => {
  const meta = {
    "tokenizer.ggml.model": "llama",
    "tokenizer.ggml.tokens": tokens,
    "tokenizer.ggml.scores": scores,
    "tokenizer.ggml.token_type": types,
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.ggml.unknown_token_id": 0,
  };
  const t = tokenizerFromGguf(new GgufMeta(header(meta)), tokens.length + 4);
  const tok = ModelTokenizer.fromJson(t.json, t.config);
  const id = (s: string) => tokens.indexOf(s);

  it("encodes words into the best-scoring pieces, with the prefix space, and decodes back", () => {
    expect(tok.encode("abc ab")).toEqual([id("▁abc"), id("▁ab")]);
    expect(tok.encode("abc ab", { addSpecialTokens: true })).toEqual([1, id("▁abc"), id("▁ab")]);
    expect(tok.decode(tok.encode("abc ab"))).toBe("abc ab");
  });

  it("falls back to bytes for characters outside the vocabulary, and keeps control tokens special", () => {
    const ids = tok.encode("aé");
    expect(ids).toEqual([id("▁a"), id("<0xC3>"), id("<0xA9>")]);
    expect(tok.decode(ids)).toBe("aé");
    expect(tok.isSpecial(2)).toBe(true);
    expect(tok.encode("a</s>")).toEqual([id("▁a"), 2]);
  });

  it("refuses a vocabulary without scores, or longer than the embedding", () => {
    const { "tokenizer.ggml.scores": _, ...noScores } = meta;
    expect(() => tokenizerFromGguf(new GgufMeta(header(noScores)), 300)).toThrow(
      /scores must give one score per token/,
    );
    expect(() => tokenizerFromGguf(new GgufMeta(header(meta)), 10)).toThrow(
      /has 268 tokens but token_embd\.weight has only 10 rows/,
    );
  });
});
