import { describe, expect, it } from "vitest";
import { ApiError } from "../../../controller/api/errors.ts";
import { parseConstraint } from "../../../controller/api/request-format.ts";

function err(f: () => unknown): ApiError {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(ApiError);
    return e as ApiError;
  }
  throw new Error("expected an ApiError");
}

describe("output constraints in every form vLLM accepts", () => {
  it("response_format, structured_outputs and guided_* become one spec", () => {
    const schema = { type: "object" };
    expect(parseConstraint({})).toBeNull();
    expect(parseConstraint({ response_format: { type: "text" } })).toBeNull();
    expect(parseConstraint({ response_format: { type: "json_object" } })).toEqual({ kind: "json_object" });
    expect(
      parseConstraint({ response_format: { type: "json_schema", json_schema: { name: "x", schema } } }),
    ).toEqual({
      kind: "json_schema",
      schema,
    });
    expect(parseConstraint({ structured_outputs: { json: JSON.stringify(schema) } })).toEqual({
      kind: "json_schema",
      schema,
    });
    expect(parseConstraint({ structured_outputs: { regex: "a+" } })).toEqual({
      kind: "regex",
      pattern: "a+",
    });
    expect(parseConstraint({ structured_outputs: { choice: ["a", "b"] } })).toEqual({
      kind: "choice",
      choices: ["a", "b"],
    });
    expect(parseConstraint({ guided_json: schema })).toEqual({ kind: "json_schema", schema });
    expect(parseConstraint({ guided_regex: "\\d" })).toEqual({ kind: "regex", pattern: "\\d" });
    expect(parseConstraint({ guided_choice: ["y"] })).toEqual({ kind: "choice", choices: ["y"] });
  });

  it("refuses two constraints, unknown kinds and what it cannot enforce, naming the field", () => {
    expect(err(() => parseConstraint({ guided_regex: "a", guided_json: {} })).param).toBe("guided_regex");
    expect(err(() => parseConstraint({ response_format: { type: "json_schema" } })).param).toBe(
      "response_format",
    );
    expect(err(() => parseConstraint({ response_format: { type: "structural_tag" } })).param).toBe(
      "response_format",
    );
    expect(err(() => parseConstraint({ response_format: { type: "yaml" } })).param).toBe("response_format");
    expect(err(() => parseConstraint({ structured_outputs: { grammar: "root ::= x" } })).param).toBe(
      "structured_outputs",
    );
    expect(err(() => parseConstraint({ structured_outputs: { regex: "a", choice: ["b"] } })).param).toBe(
      "structured_outputs",
    );
    expect(err(() => parseConstraint({ guided_choice: [] })).param).toBe("guided_choice");
    expect(err(() => parseConstraint({ guided_json: "{not json" })).param).toBe("guided_json");
  });
});
