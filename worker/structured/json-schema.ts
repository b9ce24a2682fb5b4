import {
  alt,
  byteIn,
  bytes,
  charIn,
  GrammarError,
  list,
  members,
  NOTHING,
  type Node,
  opt,
  rep,
  seq,
  star,
} from "./nfa.ts";
import { parseRegex } from "./regex.ts";
import type { ByteRange } from "./utf8.ts";

/**
 * JSON Schema → a byte grammar whose every complete output parses as JSON
 * and validates against the schema (what xgrammar and outlines do for vLLM,
 * written here over our NFA). Pure.
 *
 * Supported: type (and type lists), properties / required /
 * additionalProperties, items / prefixItems / additionalItems,
 * minItems / maxItems, enum, const, anyOf, oneOf (branches disjoint by
 * type), allOf of one schema, $ref into the document (recursion unrolled to
 * MAX_REF_DEPTH), minLength / maxLength, pattern, format (date, time,
 * date-time, uuid, ipv4), integer minimum / maximum (exclusive too), and the
 * annotations (title, description, …). Anything else that constrains values
 * is refused by name (GrammarError), never ignored.
 *
 * Choices that keep outputs valid: declared properties are emitted in
 * their order and extra properties only for objects that declare none
 * (additionalProperties as their schema); values of `{}` and json_object
 * nest at most MAX_ANY_DEPTH containers deep; whitespace between tokens is
 * JSON's ([ \t\n\r]*).
 */

export const MAX_REF_DEPTH = 4;
export const MAX_ANY_DEPTH = 6;
const MAX_UNROLL = 256;

const WS = star(byteIn([0x20, 0x20], [0x09, 0x0a], [0x0d, 0x0d]));
const DIGIT = byteIn([0x30, 0x39]);
const HEX = byteIn([0x30, 0x39], [0x41, 0x46], [0x61, 0x66]);

/** One character of a JSON string, raw (not '"', '\' or a control character) or escaped. */
const STRING_CHAR = alt(
  charIn([0x20, 0x21], [0x23, 0x5b], [0x5d, 0x10ffff]),
  seq(
    bytes("\\"),
    byteIn(
      [0x22, 0x22],
      [0x5c, 0x5c],
      [0x2f, 0x2f],
      [0x62, 0x62],
      [0x66, 0x66],
      [0x6e, 0x6e],
      [0x72, 0x72],
      [0x74, 0x74],
    ),
  ),
  // \uXXXX outside the surrogates, so every escape is one code point (minLength/maxLength count exactly).
  seq(
    bytes("\\u"),
    alt(
      seq(byteIn([0x30, 0x39], [0x41, 0x43], [0x45, 0x46], [0x61, 0x63], [0x65, 0x66]), HEX, HEX, HEX),
      seq(byteIn([0x44, 0x44], [0x64, 0x64]), byteIn([0x30, 0x37]), HEX, HEX),
    ),
  ),
);

const INTEGER = seq(opt(bytes("-")), alt(bytes("0"), seq(byteIn([0x31, 0x39]), star(DIGIT))));
const NUMBER = seq(
  INTEGER,
  opt(seq(bytes("."), rep(DIGIT, 1, Number.POSITIVE_INFINITY))),
  opt(
    seq(
      byteIn([0x45, 0x45], [0x65, 0x65]),
      opt(byteIn([0x2b, 0x2b], [0x2d, 0x2d])),
      rep(DIGIT, 1, Number.POSITIVE_INFINITY),
    ),
  ),
);
const stringOf = (body: Node): Node => seq(bytes('"'), body, bytes('"'));
const STRING = stringOf(star(STRING_CHAR));
const COMMA = seq(WS, bytes(","), WS);
const COLON = seq(WS, bytes(":"), WS);

/** Any JSON value nesting at most `depth` containers. */
export function anyJson(depth: number): Node {
  const scalars = [STRING, NUMBER, bytes("true"), bytes("false"), bytes("null")];
  if (depth === 0) return alt(...scalars);
  return alt(anyObject(depth, anyJson(depth - 1)), anyArray(anyJson(depth - 1)), ...scalars);
}

function anyObject(_depth: number, value: Node): Node {
  const member = seq(STRING, COLON, value);
  return seq(bytes("{"), WS, opt(list(member, COMMA, 1, Number.POSITIVE_INFINITY)), WS, bytes("}"));
}

function anyArray(value: Node): Node {
  return seq(bytes("["), WS, opt(list(value, COMMA, 1, Number.POSITIVE_INFINITY)), WS, bytes("]"));
}

/** json_object: any JSON object. */
export function jsonObjectGrammar(): Node {
  return seq(WS, anyObject(MAX_ANY_DEPTH, anyJson(MAX_ANY_DEPTH - 1)), WS);
}

const ANNOTATIONS = new Set([
  "title",
  "description",
  "default",
  "examples",
  "$schema",
  "$id",
  "$comment",
  "deprecated",
  "readOnly",
  "writeOnly",
  "$defs",
  "definitions",
  "strict",
]);
const HANDLED = new Set([
  "type",
  "properties",
  "required",
  "additionalProperties",
  "items",
  "prefixItems",
  "additionalItems",
  "minItems",
  "maxItems",
  "enum",
  "const",
  "anyOf",
  "oneOf",
  "allOf",
  "$ref",
  "minLength",
  "maxLength",
  "pattern",
  "format",
  "minimum",
  "maximum",
  "exclusiveMinimum",
  "exclusiveMaximum",
]);

type Schema = boolean | Record<string, unknown>;

export function jsonSchemaGrammar(schema: unknown): Node {
  return seq(WS, new SchemaCompiler(schema).value(schema, "#", new Map()), WS);
}

class SchemaCompiler {
  constructor(private readonly root: unknown) {}

  value(s: unknown, at: string, refs: Map<string, number>): Node {
    if (s === true) return anyJson(MAX_ANY_DEPTH);
    if (s === false) return NOTHING;
    if (typeof s !== "object" || s === null || Array.isArray(s))
      throw new GrammarError(`${at}: a schema must be an object or a boolean`);
    const o = s as Record<string, unknown>;
    for (const k of Object.keys(o))
      if (!ANNOTATIONS.has(k) && !HANDLED.has(k)) throw new GrammarError(`${at}: '${k}' is not supported`);
    if (o.$ref !== undefined) return this.ref(o, at, refs);
    if (o.allOf !== undefined) {
      const all = o.allOf as unknown[];
      if (
        !Array.isArray(all) ||
        all.length !== 1 ||
        Object.keys(o).some((k) => HANDLED.has(k) && k !== "allOf")
      )
        throw new GrammarError(`${at}: 'allOf' is supported with exactly one schema and nothing beside it`);
      return this.value(all[0], `${at}/allOf/0`, refs);
    }
    if (o.anyOf !== undefined || o.oneOf !== undefined) return this.union(o, at, refs);
    if (o.const !== undefined) return literalValue(o.const);
    if (o.enum !== undefined) {
      if (!Array.isArray(o.enum) || o.enum.length === 0)
        throw new GrammarError(`${at}: 'enum' must be a non-empty list`);
      return alt(...o.enum.map(literalValue));
    }
    const types = this.types(o, at);
    return alt(...types.map((t) => this.typed(t, o, at, refs)));
  }

  private types(o: Record<string, unknown>, at: string): string[] {
    const t = o.type;
    if (t === undefined) {
      if (o.properties !== undefined || o.additionalProperties !== undefined || o.required !== undefined)
        return ["object"];
      if (o.items !== undefined || o.prefixItems !== undefined) return ["array"];
      if (
        o.minLength !== undefined ||
        o.maxLength !== undefined ||
        o.pattern !== undefined ||
        o.format !== undefined
      )
        return ["string"];
      if (o.minimum !== undefined || o.maximum !== undefined) return ["number"];
      return ["object", "array", "string", "number", "boolean", "null"];
    }
    const list = typeof t === "string" ? [t] : t;
    if (!Array.isArray(list) || list.length === 0 || list.some((x) => typeof x !== "string"))
      throw new GrammarError(`${at}: 'type' must be a type name or a list of them`);
    return list as string[];
  }

  private typed(t: string, o: Record<string, unknown>, at: string, refs: Map<string, number>): Node {
    switch (t) {
      case "string":
        return this.string(o, at);
      case "integer":
        return integerRange(o, at);
      case "number":
        if (
          o.minimum !== undefined ||
          o.maximum !== undefined ||
          o.exclusiveMinimum !== undefined ||
          o.exclusiveMaximum !== undefined
        )
          throw new GrammarError(`${at}: bounds on a 'number' are not supported (use 'integer')`);
        return NUMBER;
      case "boolean":
        return alt(bytes("true"), bytes("false"));
      case "null":
        return bytes("null");
      case "object":
        return this.object(o, at, refs);
      case "array":
        return this.array(o, at, refs);
      default:
        throw new GrammarError(`${at}: unknown type '${t}'`);
    }
  }

  private string(o: Record<string, unknown>, at: string): Node {
    const min = count(o.minLength, `${at}/minLength`) ?? 0;
    const max = count(o.maxLength, `${at}/maxLength`) ?? Number.POSITIVE_INFINITY;
    if (max < min) throw new GrammarError(`${at}: maxLength is below minLength`);
    if (max !== Number.POSITIVE_INFINITY && max > MAX_UNROLL)
      throw new GrammarError(`${at}: maxLength above ${MAX_UNROLL} is not supported`);
    if (min > MAX_UNROLL) throw new GrammarError(`${at}: minLength above ${MAX_UNROLL} is not supported`);
    if (o.pattern !== undefined || o.format !== undefined) {
      if (o.minLength !== undefined || o.maxLength !== undefined)
        throw new GrammarError(`${at}: 'pattern' or 'format' with minLength/maxLength is not supported`);
      if (o.pattern !== undefined && o.format !== undefined)
        throw new GrammarError(`${at}: 'pattern' with 'format' is not supported`);
      if (typeof o.pattern === "string") return stringOf(parseRegex(anchored(o.pattern), jsonChars));
      if (o.pattern !== undefined) throw new GrammarError(`${at}: 'pattern' must be a string`);
      return stringOf(format(o.format, at));
    }
    return stringOf(rep(STRING_CHAR, min, max));
  }

  private object(o: Record<string, unknown>, at: string, refs: Map<string, number>): Node {
    const props = (o.properties ?? {}) as Record<string, unknown>;
    if (typeof props !== "object" || Array.isArray(props))
      throw new GrammarError(`${at}: 'properties' must be an object`);
    const required = (o.required ?? []) as unknown[];
    if (!Array.isArray(required) || required.some((r) => typeof r !== "string"))
      throw new GrammarError(`${at}: 'required' must be a list of names`);
    const names = Object.keys(props);
    for (const r of required as string[]) if (!names.includes(r)) names.push(r);
    if (names.length === 0) {
      const extra = o.additionalProperties;
      if (extra === false) return seq(bytes("{"), WS, bytes("}"));
      const value =
        extra === undefined || extra === true
          ? anyJson(MAX_ANY_DEPTH - 1)
          : this.value(extra, `${at}/additionalProperties`, refs);
      return anyObject(0, value);
    }
    const ms = names.map((name) => ({
      node: seq(
        bytes(JSON.stringify(name)),
        COLON,
        name in props
          ? this.value(props[name], `${at}/properties/${name}`, refs)
          : anyJson(MAX_ANY_DEPTH - 1),
      ),
      required: (required as string[]).includes(name),
    }));
    return seq(bytes("{"), WS, members(ms, COMMA), WS, bytes("}"));
  }

  private array(o: Record<string, unknown>, at: string, refs: Map<string, number>): Node {
    const min = count(o.minItems, `${at}/minItems`) ?? 0;
    const max = count(o.maxItems, `${at}/maxItems`) ?? Number.POSITIVE_INFINITY;
    if (max < min) throw new GrammarError(`${at}: maxItems is below minItems`);
    if (min > MAX_UNROLL || (max !== Number.POSITIVE_INFINITY && max > MAX_UNROLL))
      throw new GrammarError(`${at}: minItems/maxItems above ${MAX_UNROLL} are not supported`);
    const tuple = Array.isArray(o.prefixItems) ? o.prefixItems : Array.isArray(o.items) ? o.items : [];
    const restSchema = Array.isArray(o.items)
      ? (o.additionalItems ?? true)
      : Array.isArray(o.prefixItems)
        ? (o.items ?? true)
        : (o.items ?? true);
    if (tuple.length > max) throw new GrammarError(`${at}: more prefixItems than maxItems`);
    const rest = restSchema === false ? null : this.value(restSchema, `${at}/items`, refs);
    const fixed = tuple.map((t, i) => this.value(t, `${at}/prefixItems/${i}`, refs));
    const open = seq(bytes("["), WS);
    const close = seq(WS, bytes("]"));
    if (fixed.length === 0) {
      if (rest === null) return seq(open, close);
      return seq(open, min === 0 ? opt(list(rest, COMMA, 1, max)) : list(rest, COMMA, min, max), close);
    }
    const head = fixed.flatMap((f, i) => (i === 0 ? [f] : [COMMA, f]));
    const more =
      rest === null ? seq() : rep(seq(COMMA, rest), Math.max(0, min - fixed.length), max - fixed.length);
    return seq(open, ...head, more, close);
  }

  private union(o: Record<string, unknown>, at: string, refs: Map<string, number>): Node {
    const key = o.anyOf !== undefined ? "anyOf" : "oneOf";
    const given = o[key] as unknown[];
    if (!Array.isArray(given) || given.length === 0)
      throw new GrammarError(`${at}: '${key}' must be a non-empty list`);
    if (Object.keys(o).some((k) => HANDLED.has(k) && k !== key && k !== "type"))
      throw new GrammarError(`${at}: '${key}' beside constraints other than 'type' is not supported`);
    // A 'type' beside the branches applies to each branch that declares none.
    const branches = given.map((b) =>
      o.type !== undefined &&
      typeof b === "object" &&
      b !== null &&
      (b as Record<string, unknown>).type === undefined
        ? { ...(b as Record<string, unknown>), type: o.type }
        : b,
    );
    if (key === "oneOf") {
      // Exactly one must match: accepted only when the branches are disjoint by type.
      const seen = new Set<string>();
      for (const [i, b] of branches.entries()) {
        const types =
          typeof b === "object" && b !== null
            ? this.types(b as Record<string, unknown>, `${at}/oneOf/${i}`)
            : [];
        const norm = types.map((t) => (t === "integer" ? "number" : t));
        if (
          norm.length === 0 ||
          norm.some((t) => seen.has(t)) ||
          (b as Record<string, unknown>).type === undefined
        )
          throw new GrammarError(`${at}: 'oneOf' is supported only with branches of distinct declared types`);
        for (const t of norm) seen.add(t);
      }
    }
    return alt(...branches.map((b, i) => this.value(b, `${at}/${key}/${i}`, refs)));
  }

  private ref(o: Record<string, unknown>, at: string, refs: Map<string, number>): Node {
    const r = o.$ref;
    if (typeof r !== "string" || !r.startsWith("#"))
      throw new GrammarError(`${at}: only references into this schema ('#/...') are supported`);
    if (Object.keys(o).some((k) => HANDLED.has(k) && k !== "$ref"))
      throw new GrammarError(`${at}: '$ref' beside other constraints is not supported`);
    const depth = refs.get(r) ?? 0;
    // Recursion past the bound: this alternative is not taken (another must end the structure).
    if (depth >= MAX_REF_DEPTH) return NOTHING;
    const target = resolvePointer(this.root, r, at);
    const inner = new Map(refs).set(r, depth + 1);
    return this.value(target as Schema, r, inner);
  }
}

function resolvePointer(root: unknown, ref: string, at: string): unknown {
  let v: unknown = root;
  if (ref === "#") return v;
  if (!ref.startsWith("#/")) throw new GrammarError(`${at}: unsupported reference ${ref}`);
  for (const raw of ref.slice(2).split("/")) {
    const key = decodeURIComponent(raw).replace(/~1/g, "/").replace(/~0/g, "~");
    if (typeof v !== "object" || v === null || !(key in (v as Record<string, unknown>)))
      throw new GrammarError(`${at}: reference ${ref} does not resolve`);
    v = (v as Record<string, unknown>)[key];
  }
  return v;
}

function count(v: unknown, at: string): number | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0)
    throw new GrammarError(`${at} must be a non-negative integer`);
  return v;
}

/** A JSON value as its compact serialisation (equal after parsing to what a validator compares). */
function literalValue(v: unknown): Node {
  const text = JSON.stringify(v);
  if (text === undefined) throw new GrammarError(`enum/const value ${String(v)} is not JSON`);
  return bytes(text);
}

/** JSON Schema's `pattern` matches anywhere; a pattern without anchors is searched for. */
function anchored(p: string): string {
  const start = p.startsWith("^");
  const end = p.endsWith("$") && !p.endsWith("\\$");
  return `${start ? "" : "(?:.|\\n)*"}(?:${p.slice(start ? 1 : 0, end ? -1 : undefined)})${end ? "" : "(?:.|\\n)*"}`;
}

/** Code points as a JSON string holds them: raw where allowed, else escaped. */
function jsonChars(ranges: readonly ByteRange[]): Node {
  const raw: [number, number][] = [];
  const escapes: Node[] = [];
  const short: Record<number, string> = {
    8: "\\b",
    9: "\\t",
    10: "\\n",
    12: "\\f",
    13: "\\r",
    34: '\\"',
    92: "\\\\",
  };
  for (const [lo, hi] of ranges) {
    for (let c = lo; c <= Math.min(hi, 0x1f); c++)
      escapes.push(bytes(short[c] ?? `\\u00${c.toString(16).padStart(2, "0")}`));
    for (const special of [0x22, 0x5c])
      if (lo <= special && special <= hi) escapes.push(bytes(short[special]!));
    let a = Math.max(lo, 0x20);
    while (a <= hi) {
      const next = [0x22, 0x5c].find((x) => x >= a && x <= hi);
      const b = next === undefined ? hi : next - 1;
      if (a <= b) raw.push([a, b]);
      if (next === undefined) break;
      a = next + 1;
    }
  }
  return alt(...(raw.length > 0 ? [charIn(...raw)] : []), ...escapes);
}

/** Integers within minimum/maximum (exclusive bounds too), as exact decimal automata. */
function integerRange(o: Record<string, unknown>, at: string): Node {
  const bound = (k: string) => {
    const v = o[k];
    if (v === undefined) return undefined;
    if (typeof v !== "number" || !Number.isFinite(v)) throw new GrammarError(`${at}/${k} must be a number`);
    return v;
  };
  let lo = bound("minimum");
  let hi = bound("maximum");
  const xlo = bound("exclusiveMinimum");
  const xhi = bound("exclusiveMaximum");
  if (xlo !== undefined) lo = Math.max(lo ?? Number.NEGATIVE_INFINITY, Math.floor(xlo) + 1);
  if (xhi !== undefined) hi = Math.min(hi ?? Number.POSITIVE_INFINITY, Math.ceil(xhi) - 1);
  if (lo !== undefined) lo = Math.ceil(lo);
  if (hi !== undefined) hi = Math.floor(hi);
  if (lo === undefined && hi === undefined) return INTEGER;
  for (const v of [lo, hi])
    if (v !== undefined && Number.isFinite(v) && !Number.isSafeInteger(v))
      throw new GrammarError(`${at}: integer bounds must be safe integers`);
  const a = lo ?? Number.NEGATIVE_INFINITY;
  const b = hi ?? Number.POSITIVE_INFINITY;
  if (a > b) throw new GrammarError(`${at}: no integer lies within the bounds`);
  const parts: Node[] = [];
  if (b >= 0) parts.push(naturals(Math.max(0, a), b));
  // Negative numbers: "-" then magnitudes in [max(1, -b), -a].
  if (a < 0) parts.push(seq(bytes("-"), naturals(Math.max(1, -b), -a)));
  return alt(...parts);
}

/** Decimal strings (no leading zeros) of the integers in [a, b], b possibly Infinity. */
function naturals(a: number, b: number): Node {
  const out: Node[] = [];
  const la = String(a).length;
  const lb = b === Number.POSITIVE_INFINITY ? Number.POSITIVE_INFINITY : String(b).length;
  for (let len = la; len <= Math.min(lb, 16); len++) {
    const lo = Math.max(a, len === 1 ? 0 : 10 ** (len - 1));
    const hi = Math.min(b, 10 ** len - 1);
    if (lo <= hi) out.push(sameLength(String(lo), String(hi)));
  }
  if (lb === Number.POSITIVE_INFINITY)
    out.push(seq(byteIn([0x31, 0x39]), rep(DIGIT, 16, Number.POSITIVE_INFINITY)));
  return alt(...out);
}

/** Decimal strings of one length between lo and hi (digit by digit). */
function sameLength(lo: string, hi: string): Node {
  if (lo.length === 1) return byteIn([lo.charCodeAt(0), hi.charCodeAt(0)]);
  // Full tails ("0…0" to "9…9") are any digits: keeps the construction linear in the length.
  if (/^0*$/.test(lo.slice(1)) && /^9*$/.test(hi.slice(1)))
    return seq(byteIn([lo.charCodeAt(0), hi.charCodeAt(0)]), rep(DIGIT, lo.length - 1, lo.length - 1));
  if (lo[0] === hi[0]) return seq(bytes(lo[0]!), sameLength(lo.slice(1), hi.slice(1)));
  const n = lo.length - 1;
  const parts = [seq(bytes(lo[0]!), sameLength(lo.slice(1), "9".repeat(n)))];
  if (hi.charCodeAt(0) - lo.charCodeAt(0) > 1)
    parts.push(seq(byteIn([lo.charCodeAt(0) + 1, hi.charCodeAt(0) - 1]), rep(DIGIT, n, n)));
  parts.push(seq(bytes(hi[0]!), sameLength("0".repeat(n), hi.slice(1))));
  return alt(...parts);
}

const D2 = (lo: string, hi: string) => sameLength(lo, hi);

/** JSON Schema formats as the string's contents (RFC 3339 dates and times, UUIDs, IPv4). */
function format(f: unknown, at: string): Node {
  const year = rep(DIGIT, 4, 4);
  // Day ranges per month; 29 February is left out, so every date is valid in any year.
  const monthDay = alt(
    seq(
      alt(bytes("01"), bytes("03"), bytes("05"), bytes("07"), bytes("08"), bytes("10"), bytes("12")),
      bytes("-"),
      D2("01", "31"),
    ),
    seq(alt(bytes("04"), bytes("06"), bytes("09"), bytes("11")), bytes("-"), D2("01", "30")),
    seq(bytes("02-"), D2("01", "28")),
  );
  const date = seq(year, bytes("-"), monthDay);
  const time = seq(
    D2("00", "23"),
    bytes(":"),
    D2("00", "59"),
    bytes(":"),
    D2("00", "59"),
    opt(seq(bytes("."), rep(DIGIT, 1, 9))),
    alt(bytes("Z"), seq(byteIn([0x2b, 0x2b], [0x2d, 0x2d]), D2("00", "23"), bytes(":"), D2("00", "59"))),
  );
  const hex = (n: number) => rep(HEX, n, n);
  const octet = alt(D2("0", "9"), D2("10", "99"), D2("100", "199"), D2("200", "249"), D2("250", "255"));
  switch (f) {
    case "date":
      return date;
    case "time":
      return time;
    case "date-time":
      return seq(date, bytes("T"), time);
    case "uuid":
      return seq(hex(8), bytes("-"), hex(4), bytes("-"), hex(4), bytes("-"), hex(4), bytes("-"), hex(12));
    case "ipv4":
      return seq(octet, bytes("."), octet, bytes("."), octet, bytes("."), octet);
    default:
      throw new GrammarError(`${at}: format ${JSON.stringify(f)} is not supported`);
  }
}
