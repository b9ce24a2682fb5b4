import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ConstraintSpec } from "../../../schema/constraint.ts";
import { RequestId } from "../../../schema/ids.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import type { SubmitRequest } from "../../../worker/runtime/runtime-api.ts";
import { ConstraintCompiler } from "../../../worker/structured/constraint.ts";
import { collect, prompt, type RuntimeFixture, startRuntime, tinyModel } from "./fixture.ts";

/**
 * Structured output on the real engine: the tiny model has random weights,
 * so without the mask its text is noise; with it, 200 seeded requests (four
 * schemas, a regex and a choice, sampled at temperature 1) must each end as
 * output that parses and validates — including the ones cut by max_tokens,
 * which the budget rule makes close the document in time.
 */

let model: LoadedModel;
let cleanup: () => Promise<void>;
let f: RuntimeFixture;
let compiler: ConstraintCompiler;

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
  f = await startRuntime(model);
  compiler = new ConstraintCompiler(model.tokenizer.tokenBytes());
});
afterAll(async () => {
  await f?.close();
  await cleanup();
});

const SCHEMAS: unknown[] = [
  {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 10 },
      age: { type: "integer", minimum: 0, maximum: 120 },
      tags: { type: "array", items: { type: "string", enum: ["a", "b", "c"] }, maxItems: 3 },
    },
    required: ["name", "age"],
    additionalProperties: false,
  },
  {
    type: "object",
    properties: {
      when: { type: "string", format: "date" },
      score: { type: "number" },
      ok: { type: "boolean" },
      note: { anyOf: [{ type: "string" }, { type: "null" }] },
    },
    required: ["when", "ok"],
  },
  { type: "array", items: { type: "integer", minimum: -5, maximum: 5 }, minItems: 1 },
  {
    $defs: {
      t: {
        type: "object",
        properties: { v: { type: "integer" }, kids: { type: "array", items: { $ref: "#/$defs/t" } } },
        required: ["v"],
      },
    },
    $ref: "#/$defs/t",
  },
];

const ajv = new Ajv2020({ strict: false });
addFormats(ajv);

let n = 0;
function request(
  p: number[],
  constraint: ConstraintSpec,
  seed: number,
  maxTokens: number,
  extra: Partial<SubmitRequest> = {},
): SubmitRequest {
  return {
    requestId: RequestId(`structured-${n++}`),
    salt: undefined,
    prompt: p,
    maxTokens,
    temperature: 1,
    topP: 1,
    topK: 0,
    seed,
    stopTokenIds: model.eosTokenIds,
    constraint: compiler.machine(constraint),
    ...extra,
  };
}

const text = (tokens: number[]) => model.tokenizer.decode(tokens, { skipSpecialTokens: true });

describe("constrained decoding on the runtime", () => {
  it("200 seeded requests always parse and validate (JSON schemas, a regex, a choice)", async () => {
    const specs: { spec: ConstraintSpec; check: (s: string) => void }[] = [
      ...SCHEMAS.map((schema) => {
        const validate = ajv.compile(schema as object);
        return {
          spec: { kind: "json_schema", schema } as ConstraintSpec,
          check: (s: string) =>
            expect(validate(JSON.parse(s)), `${s} ${JSON.stringify(validate.errors)}`).toBe(true),
        };
      }),
      {
        spec: { kind: "json_object" },
        check: (s: string) => expect(JSON.parse(s)).toBeTypeOf("object"),
      },
      {
        spec: { kind: "regex", pattern: "(\\d{3})-[a-z]{2,4}( ok)?" },
        check: (s: string) => expect(s).toMatch(/^\d{3}-[a-z]{2,4}( ok)?$/),
      },
      {
        spec: { kind: "choice", choices: ["positive", "negative", "neutral"] },
        check: (s: string) => expect(["positive", "negative", "neutral"]).toContain(s),
      },
    ];
    const finishes = { stop: 0, length: 0 };
    // In waves of 16 concurrent requests (batch 16), mixed specs in each wave.
    for (let wave = 0; wave < 200 / 16 + 1; wave++) {
      const jobs = [];
      for (let k = 0; k < 16 && wave * 16 + k < 200; k++) {
        const i = wave * 16 + k;
        const { spec, check } = specs[i % specs.length]!;
        // Some budgets are tight on purpose: the output must still close in time.
        const maxTokens = i % 5 === 0 ? 40 : 160;
        jobs.push(
          collect(f.runtime.submit(request(prompt(i, 12), spec, i, maxTokens)).events).then(
            ({ tokens, end }) => {
              expect(end.type).toBe("end");
              if (end.type === "end") finishes[end.reason as "stop" | "length"]++;
              check(text(tokens));
            },
          ),
        );
      }
      await Promise.all(jobs);
    }
    expect(finishes.stop + finishes.length).toBe(200);
    expect(finishes.stop).toBeGreaterThan(0);
  });

  it("greedy constrained decoding is deterministic and a tight budget is refused", async () => {
    const spec: ConstraintSpec = { kind: "json_schema", schema: SCHEMAS[0] };
    const a = await collect(
      f.runtime.submit(request(prompt(900, 9), spec, 1, 80, { temperature: 0 })).events,
    );
    const b = await collect(
      f.runtime.submit(request(prompt(900, 9), spec, 2, 80, { temperature: 0 })).events,
    );
    expect(a.tokens).toEqual(b.tokens);
    expect(() => f.runtime.submit(request(prompt(901, 9), spec, 1, 3))).toThrow(/max_tokens/);
  });
});
