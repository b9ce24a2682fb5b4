import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { Rng, seedRng } from "../../../worker/model/prng.ts";
import { compileConstraint } from "../../../worker/structured/constraint.ts";
import { DEAD, type LazyDfa } from "../../../worker/structured/dfa.ts";
import { GrammarError } from "../../../worker/structured/nfa.ts";
import { utf8Sequences } from "../../../worker/structured/utf8.ts";

/** Whether the DFA accepts the whole string. */
function accepts(dfa: LazyDfa, s: string): boolean {
  let st = dfa.start;
  for (const b of Buffer.from(s, "utf8")) {
    st = dfa.step(st, b);
    if (st === DEAD) return false;
  }
  return dfa.accepting(st);
}

/**
 * A random complete output: random live bytes, steered to finish once long
 * (only bytes that shorten the way to accepting), stopping at random where
 * it accepts.
 */
function randomOutput(dfa: LazyDfa, seed: number): Buffer {
  const rng = new Rng(seedRng(seed, "walk"));
  const out: number[] = [];
  let st = dfa.start;
  for (let step = 0; step < 5000; step++) {
    if (dfa.accepting(st) && (!dfa.hasExits(st) || rng.nextFloat() < 0.2)) return Buffer.from(out);
    const live: number[] = [];
    for (let b = 0; b < 256; b++) {
      const n = dfa.step(st, b);
      if (n === DEAD) continue;
      if (out.length > 40 && dfa.minDist(n) >= dfa.minDist(st)) continue;
      live.push(b);
    }
    if (live.length === 0) {
      if (dfa.accepting(st)) return Buffer.from(out);
      throw new Error("stuck in a non-accepting state");
    }
    const b = live[rng.nextU32() % live.length]!;
    out.push(b);
    st = dfa.step(st, b);
  }
  throw new Error("no end");
}

const ajv = new Ajv2020({ strict: false });
addFormats(ajv);

describe("UTF-8 ranges", () => {
  it("match exactly the encodings of the code points in range", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 0x10ffff }), fc.integer({ min: 0, max: 0x3000 }), (lo, span) => {
        const hi = Math.min(0x10ffff, lo + span);
        const seqs = utf8Sequences(lo, hi);
        const inSeqs = (bs: Buffer) =>
          seqs.some((s) => s.length === bs.length && s.every(([a, b], i) => bs[i]! >= a && bs[i]! <= b));
        for (const cp of [lo, hi, Math.floor((lo + hi) / 2), lo - 1, hi + 1]) {
          if (cp < 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) continue;
          const bs = Buffer.from(String.fromCodePoint(cp), "utf8");
          expect(inSeqs(bs)).toBe(cp >= lo && cp <= hi);
        }
      }),
    );
  });
});

describe("regex grammars (full match, as JS RegExp anchored)", () => {
  const patterns = [
    "a|b|abc",
    "[a-c]+x?",
    "(ab)*c{2,3}",
    "\\d{3}-\\d{4}",
    "[^a]b",
    "(?:x|yz)+",
    "colou?r",
    "\\w+@\\w+\\.com",
    "[α-ω]{1,2}é",
    "^(\\(\\d\\))?\\s*$",
  ];
  for (const p of patterns) {
    it(p, () => {
      const dfa = compileConstraint({ kind: "regex", pattern: p });
      const re = new RegExp(`^(?:${p.replace(/^\^/, "").replace(/\$$/, "")})$`, "u");
      fc.assert(
        fc.property(fc.stringMatching(re), (s) => {
          expect(accepts(dfa, s)).toBe(true);
        }),
        { numRuns: 50 },
      );
      fc.assert(
        fc.property(
          fc.string({
            unit: fc.constantFrom("a", "b", "c", "x", "y", "z", "1", "-", "@", ".", " ", "(", ")", "é", "β"),
          }),
          (s) => {
            expect(accepts(dfa, s)).toBe(re.test(s));
          },
        ),
        { numRuns: 200 },
      );
      for (let seed = 0; seed < 30; seed++)
        expect(re.test(randomOutput(dfa, seed).toString("utf8"))).toBe(true);
    });
  }

  it("refuses what is not regular or not supported, naming it", () => {
    for (const p of ["(a)\\1", "a(?=b)", "\\bword", "a{2000}", "(", "a)"])
      expect(() => compileConstraint({ kind: "regex", pattern: p })).toThrow(GrammarError);
  });

  it("choice matches exactly one of the strings", () => {
    const dfa = compileConstraint({ kind: "choice", choices: ["yes", "no", "not sure"] });
    expect(["yes", "no", "not sure"].every((s) => accepts(dfa, s))).toBe(true);
    expect(["ye", "nope", "not", ""].some((s) => accepts(dfa, s))).toBe(false);
  });
});

const SCHEMAS: Record<string, unknown> = {
  person: {
    type: "object",
    properties: {
      name: { type: "string", minLength: 1, maxLength: 12 },
      age: { type: "integer", minimum: 0, maximum: 150 },
      id: { type: "string", format: "uuid" },
      tags: { type: "array", items: { type: "string", maxLength: 5 }, maxItems: 3 },
      married: { type: "boolean" },
    },
    required: ["name", "age"],
    additionalProperties: false,
  },
  nested: {
    $defs: {
      point: {
        type: "object",
        properties: { x: { type: "number" }, y: { type: "number" } },
        required: ["x", "y"],
      },
    },
    type: "object",
    properties: {
      kind: { enum: ["line", "polygon", 3, null] },
      points: { type: "array", items: { $ref: "#/$defs/point" }, minItems: 2, maxItems: 4 },
      label: { anyOf: [{ type: "string", pattern: "^[A-Z][a-z]{0,5}$" }, { type: "null" }] },
      when: { type: "string", format: "date-time" },
    },
    required: ["kind", "points"],
  },
  recursive: {
    $defs: {
      node: {
        type: "object",
        properties: {
          value: { type: "integer", exclusiveMinimum: -10, exclusiveMaximum: 10 },
          next: { anyOf: [{ $ref: "#/$defs/node" }, { type: "null" }] },
        },
        required: ["value", "next"],
      },
    },
    $ref: "#/$defs/node",
  },
  scalars: {
    type: "array",
    prefixItems: [
      { const: "v1" },
      { type: ["integer", "null"] },
      { type: "string", format: "date" },
      { type: "string", format: "ipv4" },
    ],
    items: false,
  },
  freeform: { type: "object", additionalProperties: { type: "integer", minimum: -5, maximum: 5 } },
  any: {},
};

describe("JSON-schema grammars: every complete output parses and validates", () => {
  for (const [name, schema] of Object.entries(SCHEMAS)) {
    it(name, () => {
      const dfa = compileConstraint({ kind: "json_schema", schema });
      const validate = ajv.compile(schema as object);
      for (let seed = 0; seed < 60; seed++) {
        const text = randomOutput(dfa, seed).toString("utf8");
        let value: unknown;
        expect(() => {
          value = JSON.parse(text);
        }, text).not.toThrow();
        expect(validate(value), `${text}\n${JSON.stringify(validate.errors)}`).toBe(true);
      }
    });
  }

  it("json_object: any JSON object", () => {
    const dfa = compileConstraint({ kind: "json_object" });
    for (let seed = 0; seed < 60; seed++) {
      const v = JSON.parse(randomOutput(dfa, seed).toString("utf8"));
      expect(typeof v === "object" && v !== null && !Array.isArray(v)).toBe(true);
    }
    expect(accepts(dfa, '{"a": [1, {"b": null}], "c": "d"}')).toBe(true);
    expect(accepts(dfa, "[1]")).toBe(false);
  });

  it("integer bounds are exact", () => {
    const dfa = compileConstraint({
      kind: "json_schema",
      schema: { type: "integer", minimum: -13, maximum: 207 },
    });
    for (let v = -40; v <= 300; v++) expect(accepts(dfa, String(v)), String(v)).toBe(v >= -13 && v <= 207);
    expect(accepts(dfa, "007")).toBe(false);
    expect(accepts(dfa, "-0")).toBe(false);
    const open = compileConstraint({ kind: "json_schema", schema: { type: "integer", minimum: 98 } });
    for (const v of ["97", "98", "99", "100", "123456789012345678901234"])
      expect(accepts(open, v)).toBe(Number(v) >= 98);
  });

  it("refuses keywords it cannot enforce, naming them", () => {
    const refused = (schema: unknown, word: string) =>
      expect(() => compileConstraint({ kind: "json_schema", schema })).toThrow(new RegExp(word));
    refused({ type: "array", uniqueItems: true }, "uniqueItems");
    refused({ type: "number", multipleOf: 2 }, "multipleOf");
    refused({ type: "object", patternProperties: {} }, "patternProperties");
    refused({ oneOf: [{ type: "object" }, { type: "object", properties: {} }] }, "oneOf");
    refused({ type: "string", format: "hostname" }, "hostname");
    refused({ type: "number", maximum: 3 }, "bounds");
    refused({ $ref: "http://example.com/s" }, "references");
    // a recursion with no way out has no finite instance
    refused(
      {
        $defs: { n: { type: "object", properties: { n: { $ref: "#/$defs/n" } }, required: ["n"] } },
        $ref: "#/$defs/n",
      },
      "no output",
    );
  });
});
