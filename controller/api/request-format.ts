import type { ConstraintSpec } from "../../schema/constraint.ts";
import { badRequest } from "./errors.ts";
import { asObject, type Body, given } from "./request-fields.ts";

/**
 * The structured-output fields, in every form vLLM accepts, as one
 * constraint spec: response_format {type: json_object | json_schema | text},
 * structured_outputs {json | regex | choice | json_object}, and the older
 * guided_json / guided_regex / guided_choice. At most one may be given.
 * Pure; the spec's own validity (a schema keyword we cannot enforce, a bad
 * regex) is checked by compiling it.
 */

export const MAX_CHOICE_STRINGS = 1024;

function jsonArg(v: unknown, param: string): unknown {
  if (typeof v !== "string") return v;
  try {
    return JSON.parse(v);
  } catch {
    throw badRequest(`'${param}' is a string but not JSON`, param);
  }
}

function choices(v: unknown, param: string): string[] {
  if (
    !Array.isArray(v) ||
    v.length === 0 ||
    v.length > MAX_CHOICE_STRINGS ||
    v.some((c) => typeof c !== "string" || c === "")
  )
    throw badRequest(`'${param}' must be a list of 1 to ${MAX_CHOICE_STRINGS} non-empty strings`, param);
  return v as string[];
}

function regex(v: unknown, param: string): string {
  if (typeof v !== "string" || v === "")
    throw badRequest(`'${param}' must be a non-empty regular expression`, param);
  return v;
}

function fromResponseFormat(v: unknown): ConstraintSpec | null {
  const rf = asObject(v, "'response_format'", "response_format");
  switch (rf.type) {
    case "text":
      return null;
    case "json_object":
      return { kind: "json_object" };
    case "json_schema": {
      if (!given(rf, "json_schema"))
        throw badRequest(
          "when response_format type is 'json_schema', 'json_schema' must be given",
          "response_format",
        );
      const js = asObject(rf.json_schema, "'response_format.json_schema'", "response_format");
      const schema = js.schema ?? js.schema_;
      return { kind: "json_schema", schema: schema === undefined ? {} : jsonArg(schema, "response_format") };
    }
    case "structural_tag":
      throw badRequest("'response_format' type 'structural_tag' is not supported", "response_format");
    default:
      throw badRequest("'response_format.type' must be text, json_object or json_schema", "response_format");
  }
}

function fromStructuredOutputs(v: unknown): ConstraintSpec | null {
  const so = asObject(v, "'structured_outputs'", "structured_outputs");
  for (const k of ["grammar", "structural_tag", "whitespace_pattern"])
    if (given(so, k)) throw badRequest(`'structured_outputs.${k}' is not supported`, "structured_outputs");
  if (so.disable_any_whitespace === true)
    throw badRequest("'structured_outputs.disable_any_whitespace' is not supported", "structured_outputs");
  const kinds = ["json", "regex", "choice", "json_object"].filter((k) => given(so, k) && so[k] !== false);
  if (kinds.length > 1)
    throw badRequest(
      "only one of json, regex, choice or json_object may be set in 'structured_outputs'",
      "structured_outputs",
    );
  switch (kinds[0]) {
    case "json":
      return { kind: "json_schema", schema: jsonArg(so.json, "structured_outputs") };
    case "regex":
      return { kind: "regex", pattern: regex(so.regex, "structured_outputs") };
    case "choice":
      return { kind: "choice", choices: choices(so.choice, "structured_outputs") };
    case "json_object":
      return { kind: "json_object" };
    default:
      return null;
  }
}

/** The request's output constraint, or null. */
export function parseConstraint(b: Body): ConstraintSpec | null {
  const found: [string, ConstraintSpec | null][] = [];
  if (given(b, "response_format")) found.push(["response_format", fromResponseFormat(b.response_format)]);
  if (given(b, "structured_outputs"))
    found.push(["structured_outputs", fromStructuredOutputs(b.structured_outputs)]);
  if (given(b, "guided_json"))
    found.push(["guided_json", { kind: "json_schema", schema: jsonArg(b.guided_json, "guided_json") }]);
  if (given(b, "guided_regex"))
    found.push(["guided_regex", { kind: "regex", pattern: regex(b.guided_regex, "guided_regex") }]);
  if (given(b, "guided_choice"))
    found.push(["guided_choice", { kind: "choice", choices: choices(b.guided_choice, "guided_choice") }]);
  const active = found.filter(([, s]) => s !== null);
  if (active.length > 1)
    throw badRequest(
      `only one output constraint may be given, got ${active.map(([k]) => k).join(" and ")}`,
      active[1]![0],
    );
  return active[0]?.[1] ?? null;
}
