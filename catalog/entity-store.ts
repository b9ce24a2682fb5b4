import { ATTRIBUTES, type Attr, type AttrType } from "../schema/catalog.ts";

/**
 * The catalog's entity store, in columns.
 *
 * Every attribute belongs to one namespace (the part before "/": model,
 * worker, chunk, replica, demand, lease, placement, decision), and so does
 * every entity: its first datom decides which. Each namespace is a table with
 * one row per entity and one column per attribute; a row's `present` bits say
 * which of its attributes hold a value.
 *
 * Why columns: a replica holds hundreds of thousands of entities for as long
 * as it runs. As one `Map` per entity (session 4) a chunk publication cost ~9
 * heap objects and ~1.35 KB, and the V8 old-generation collections that heap
 * forced every few seconds set the catalog's apply-lag tail. Here numbers,
 * booleans and 64-hex ids (sha256 values: node, prefix, content, fingerprint)
 * live in typed arrays outside the JS heap, and low-cardinality strings (tier,
 * state, layout, tenant) are interned: a chunk and its replica fact add no
 * heap object at all. Other strings (names, keys, candidates) stay JS strings.
 *
 * Entity ids are dense (the writer assigns max + 1, …), so entity → (table,
 * row) is two typed arrays indexed by id. Bound: ids ≤ MAX_EID; the arrays
 * grow by doubling to the highest id seen (5 bytes per id).
 */

export type Value = string | number | boolean;

/** DataScript's entity ids must stay below its tx0 (2^29). */
export const MAX_EID = 2 ** 29 - 1;

/** Attributes whose values are 64 lowercase hex digits (sha256 values), held as 32 bytes. */
const HEX_ATTRS: ReadonlySet<Attr> = new Set<Attr>([
  "model/fingerprint",
  "chunk/node",
  "chunk/prefix",
  "chunk/content",
  "demand/node",
]);
/** String attributes with few distinct values, held once each (see MAX_INTERNED). */
const INTERNED_ATTRS: ReadonlySet<Attr> = new Set<Attr>([
  "model/layout",
  "chunk/layout",
  "replica/tier",
  "replica/state",
  "demand/tenant",
  "lease/holder",
  "lease/state",
  "placement/tier",
  "decision/tenant",
  "decision/source",
]);
/** Distinct values an interned column keeps one copy of; later new values are stored as given. */
const MAX_INTERNED = 4096;
const INITIAL_ROWS = 64;

export type Repr = "number" | "boolean" | "hex" | "string";

/** Where and how one attribute is stored. */
export interface AttrInfo {
  readonly attr: Attr;
  readonly type: AttrType;
  readonly unique: boolean;
  /** Namespace (table) index. */
  readonly ns: number;
  /** Column index in its table; also its bit in `present`. */
  readonly slot: number;
  readonly repr: Repr;
}

const NAMESPACES: readonly string[] = [...new Set(Object.keys(ATTRIBUTES).map((a) => a.split("/")[0]!))];
const INFO = new Map<string, AttrInfo>();
/** Per namespace, its attributes in slot order. */
const NS_ATTRS: AttrInfo[][] = NAMESPACES.map(() => []);
for (const [attr, spec] of Object.entries(ATTRIBUTES) as [Attr, (typeof ATTRIBUTES)[Attr]][]) {
  const ns = NAMESPACES.indexOf(attr.split("/")[0]!);
  const repr: Repr =
    spec.type === "ref" || spec.type === "number"
      ? "number"
      : spec.type === "boolean"
        ? "boolean"
        : HEX_ATTRS.has(attr)
          ? "hex"
          : "string";
  const info: AttrInfo = {
    attr,
    type: spec.type,
    unique: "unique" in spec && spec.unique === true,
    ns,
    slot: NS_ATTRS[ns]!.length,
    repr,
  };
  NS_ATTRS[ns]!.push(info);
  INFO.set(attr, info);
}
for (const attrs of NS_ATTRS)
  if (attrs.length > 32) throw new Error("entity-store: a namespace has more than 32 attributes");

/** Storage facts of an attribute name, or undefined when the schema has no such attribute. */
export function attrInfo(a: string): AttrInfo | undefined {
  return INFO.get(a);
}

/**
 * A copy of `s` that shares no memory with the string it came from. msgpackr
 * decodes a message's strings as one string and hands out slices of it, and a
 * V8 slice keeps its whole parent alive: a proposal id kept from a decoded tx
 * held that tx's whole text, and those parents, promoted, were most of the
 * replica's old-generation growth (bench/catalog.md). Slices under 13
 * characters are copies already, so short strings are returned as they are.
 */
export function ownString(s: string): string {
  return s.length < 13 ? s : (JSON.parse(JSON.stringify(s)) as string);
}

/** 1 at the char codes of 0-9 and a-f. */
const LOWER_HEX = new Uint8Array(128);
for (const c of "0123456789abcdef") LOWER_HEX[c.charCodeAt(0)] = 1;

/**
 * True when `v` is 64 lowercase hex digits (what a hex column holds). A table
 * loop rather than /^[0-9a-f]{64}$/ (cheaper; bench/catalog.md): a
 * publication checks about ten such ids in the writer and three in each replica.
 */
export function isHex64(v: string): boolean {
  if (v.length !== 64) return false;
  for (let i = 0; i < 64; i++) {
    const c = v.charCodeAt(i);
    if (c >= 128 || LOWER_HEX[c] === 0) return false;
  }
  return true;
}

type NumericArray =
  | Float64Array<ArrayBuffer>
  | Int32Array<ArrayBuffer>
  | Uint32Array<ArrayBuffer>
  | Uint8Array<ArrayBuffer>;

/** A longer copy of a typed array: the same kind, `length` elements, zeros past the old ones. */
export function grown<T extends NumericArray>(a: T, length: number): T {
  const b = new (a.constructor as new (n: number) => T)(length);
  b.set(a);
  return b;
}

/**
 * Length for arrays indexed by entity id that must hold `id`: `current`
 * doubled until it does, at most MAX_EID + 1. Throws past MAX_EID.
 */
export function idCapacity(current: number, id: number): number {
  if (id > MAX_EID) throw new RangeError(`entity id ${id} is above ${MAX_EID}`);
  let n = current;
  while (n <= id) n *= 2;
  return Math.min(n, MAX_EID + 1);
}

interface Column {
  grow(rows: number): void;
  get(row: number): Value;
  set(row: number, v: Value): void;
  /** Drops what the row holds (a JS reference, if any). */
  clear(row: number): void;
}

class NumberColumn implements Column {
  private a = new Float64Array(INITIAL_ROWS);
  grow(rows: number): void {
    this.a = grown(this.a, rows);
  }
  get(row: number): number {
    return this.a[row]!;
  }
  set(row: number, v: Value): void {
    this.a[row] = v as number;
  }
  clear(): void {}
}

class BooleanColumn implements Column {
  private a = new Uint8Array(INITIAL_ROWS);
  grow(rows: number): void {
    this.a = grown(this.a, rows);
  }
  get(row: number): boolean {
    return this.a[row] === 1;
  }
  set(row: number, v: Value): void {
    this.a[row] = v ? 1 : 0;
  }
  clear(): void {}
}

/** 64-hex values as 32 bytes each: row r at bytes [32r, 32r + 32). */
class HexColumn implements Column {
  bytes = Buffer.alloc(INITIAL_ROWS * 32);
  grow(rows: number): void {
    const b = Buffer.alloc(rows * 32);
    this.bytes.copy(b);
    this.bytes = b;
  }
  get(row: number): string {
    return this.bytes.toString("hex", row * 32, row * 32 + 32);
  }
  /** `v` must be 64 lowercase hex digits (the caller checks). */
  set(row: number, v: Value): void {
    this.bytes.write(v as string, row * 32, 32, "hex");
  }
  clear(): void {}
  /** True when row holds the 32 bytes key[0..32). */
  equals(row: number, key: Uint8Array): boolean {
    const b = this.bytes;
    const o = row * 32;
    for (let i = 0; i < 32; i++) if (b[o + i] !== key[i]) return false;
    return true;
  }
}

class StringColumn implements Column {
  private a: (string | undefined)[] = [];
  /** Canonical copy of each value seen, when the attribute is interned (≤ MAX_INTERNED entries). */
  private readonly interned: Map<string, string> | undefined;
  constructor(intern: boolean) {
    this.interned = intern ? new Map() : undefined;
  }
  grow(): void {}
  get(row: number): string {
    return this.a[row]!;
  }
  set(row: number, v: Value): void {
    const table = this.interned;
    const held = table?.get(v as string);
    if (held !== undefined) {
      this.a[row] = held;
      return;
    }
    const s = ownString(v as string);
    if (table !== undefined && table.size < MAX_INTERNED) table.set(s, s);
    this.a[row] = s;
  }
  clear(row: number): void {
    this.a[row] = undefined;
  }
}

/** One namespace's rows. */
class Table {
  rows = 0;
  private capacity = INITIAL_ROWS;
  eids = new Int32Array(INITIAL_ROWS);
  present = new Uint32Array(INITIAL_ROWS);
  readonly columns: Column[];

  constructor(readonly attrs: readonly AttrInfo[]) {
    this.columns = attrs.map((info) =>
      info.repr === "number"
        ? new NumberColumn()
        : info.repr === "boolean"
          ? new BooleanColumn()
          : info.repr === "hex"
            ? new HexColumn()
            : new StringColumn(INTERNED_ATTRS.has(info.attr)),
    );
  }

  /** A new empty row for entity e. */
  add(e: number): number {
    if (this.rows === this.capacity) {
      this.capacity *= 2;
      this.eids = grown(this.eids, this.capacity);
      this.present = grown(this.present, this.capacity);
      for (const c of this.columns) c.grow(this.capacity);
    }
    const row = this.rows++;
    this.eids[row] = e;
    this.present[row] = 0;
    return row;
  }
}

/**
 * Entities and their values. Knows nothing of uniqueness or the catalog's
 * rules (catalog/db.ts and catalog/rules.ts keep those); it only stores, checks each value against
 * its attribute's representation, and enforces one namespace per entity.
 */
export class EntityStore {
  private readonly tables = NS_ATTRS.map((attrs) => new Table(attrs));
  /** By entity id: its namespace + 1, or 0 when the entity holds nothing. */
  private nsOf = new Uint8Array(INITIAL_ROWS);
  /** By entity id: its row in its namespace's table. */
  private rowOf = new Int32Array(INITIAL_ROWS);
  private live = 0;

  /** Entities holding at least one value. */
  get size(): number {
    return this.live;
  }

  has(e: number): boolean {
    return e < this.nsOf.length && this.nsOf[e] !== 0;
  }

  /** True when e holds a value of the attribute (reads no value). */
  holds(e: number, info: AttrInfo): boolean {
    if (e >= this.nsOf.length || this.nsOf[e] !== info.ns + 1) return false;
    return (this.tables[info.ns]!.present[this.rowOf[e]!]! & (1 << info.slot)) !== 0;
  }

  get(e: number, info: AttrInfo): Value | undefined {
    if (e >= this.nsOf.length || this.nsOf[e] !== info.ns + 1) return undefined;
    const row = this.rowOf[e]!;
    const t = this.tables[info.ns]!;
    if ((t.present[row]! & (1 << info.slot)) === 0) return undefined;
    return t.columns[info.slot]!.get(row);
  }

  /**
   * Why `v` cannot be held as a value of `info`'s attribute on entity e, or
   * undefined when it can. `set` throws this reason.
   */
  refusal(e: number, info: AttrInfo, v: Value): string | undefined {
    const want = info.type === "ref" ? "number" : info.type;
    if (typeof v !== want) return `${info.attr} takes a ${info.type}, got ${typeof v}`;
    if (info.repr === "hex" && !isHex64(v as string))
      return `${info.attr} takes 64 lowercase hex digits, got ${JSON.stringify(String(v).slice(0, 80))}`;
    const ns = e < this.nsOf.length ? this.nsOf[e]! : 0;
    if (ns !== 0 && ns !== info.ns + 1)
      return `entity ${e} is a ${NAMESPACES[ns - 1]} entity and cannot hold ${info.attr}`;
    return undefined;
  }

  /** Sets e's value of an attribute (creating the entity); returns whether it held none before. */
  set(e: number, info: AttrInfo, v: Value): boolean {
    const why = this.refusal(e, info, v);
    if (why !== undefined) throw new RangeError(why);
    return this.put(e, info, v);
  }

  /** `set` for a caller that has just found refusal(e, info, v) undefined (the db's apply): no second check. */
  put(e: number, info: AttrInfo, v: Value): boolean {
    if (e >= this.nsOf.length) this.growIds(e);
    const t = this.tables[info.ns]!;
    let row: number;
    if (this.nsOf[e] === 0) {
      row = t.add(e);
      this.nsOf[e] = info.ns + 1;
      this.rowOf[e] = row;
      this.live++;
    } else {
      row = this.rowOf[e]!;
    }
    const bit = 1 << info.slot;
    const added = (t.present[row]! & bit) === 0;
    t.present[row]! |= bit;
    t.columns[info.slot]!.set(row, v);
    return added;
  }

  /** Removes e's value of an attribute; an entity left with no value no longer exists. */
  delete(e: number, info: AttrInfo): void {
    if (e >= this.nsOf.length || this.nsOf[e] !== info.ns + 1) return;
    const row = this.rowOf[e]!;
    const t = this.tables[info.ns]!;
    const bit = 1 << info.slot;
    if ((t.present[row]! & bit) === 0) return;
    t.present[row]! &= ~bit;
    t.columns[info.slot]!.clear(row);
    if (t.present[row] === 0) {
      // The row is abandoned, not reused: rows grow only with created entities.
      this.nsOf[e] = 0;
      this.live--;
    }
  }

  /** The bytes of hex attribute `info`'s column (replaced when the table grows: read it after any set). */
  hexBytes(info: AttrInfo): Buffer {
    return (this.tables[info.ns]!.columns[info.slot] as HexColumn).bytes;
  }

  /** Where e's value of hex attribute `info` starts in hexBytes(info), or -1 when e holds none. */
  hexOffset(e: number, info: AttrInfo): number {
    return this.holds(e, info) ? this.rowOf[e]! * 32 : -1;
  }

  /** True when e holds exactly the 32 bytes `key` as its value of hex attribute `info`. */
  hexEquals(e: number, info: AttrInfo, key: Uint8Array): boolean {
    if (e >= this.nsOf.length || this.nsOf[e] !== info.ns + 1) return false;
    const row = this.rowOf[e]!;
    const t = this.tables[info.ns]!;
    if ((t.present[row]! & (1 << info.slot)) === 0) return false;
    return (t.columns[info.slot] as HexColumn).equals(row, key);
  }

  /** e's attributes and values, in schema order. */
  *attributes(e: number): IterableIterator<[Attr, Value]> {
    if (!this.has(e)) return;
    const ns = this.nsOf[e]! - 1;
    const row = this.rowOf[e]!;
    const t = this.tables[ns]!;
    const bits = t.present[row]!;
    for (const info of t.attrs)
      if ((bits & (1 << info.slot)) !== 0) yield [info.attr, t.columns[info.slot]!.get(row)];
  }

  /** Entities of an attribute's namespace that hold a value of it, in the order their rows were made. */
  *holders(info: AttrInfo): IterableIterator<number> {
    const t = this.tables[info.ns]!;
    const bit = 1 << info.slot;
    for (let row = 0; row < t.rows; row++) {
      const e = t.eids[row]!;
      if ((t.present[row]! & bit) !== 0 && this.nsOf[e] === info.ns + 1 && this.rowOf[e] === row) yield e;
    }
  }

  /** Grows the id arrays (by doubling) until they hold entity id e. */
  private growIds(e: number): void {
    const n = idCapacity(this.nsOf.length, e);
    this.nsOf = grown(this.nsOf, n);
    this.rowOf = grown(this.rowOf, n);
  }
}
