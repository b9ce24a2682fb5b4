/**
 * What a request constrains its output to (response_format, guided_*,
 * structured_outputs, required tool calls): the spec travels as data — from
 * the front door to a worker, which compiles it against its own vocabulary.
 */
export type ConstraintSpec =
  /** A JSON Schema (the parsed object); the output is a JSON document valid against it. */
  | { readonly kind: "json_schema"; readonly schema: unknown }
  /** Any JSON object. */
  | { readonly kind: "json_object" }
  /** A regular expression the whole output matches. */
  | { readonly kind: "regex"; readonly pattern: string }
  /** Exactly one of these strings. */
  | { readonly kind: "choice"; readonly choices: readonly string[] };

/** A canonical text of a spec: equal specs, equal keys (object keys sorted). */
export function constraintKey(spec: ConstraintSpec): string {
  return JSON.stringify(spec, (_k, v) =>
    v !== null && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(
          Object.entries(v as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)),
        )
      : v,
  );
}
