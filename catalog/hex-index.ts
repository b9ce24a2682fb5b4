import { type AttrInfo, type EntityStore, isHex64 } from "./entity-store.ts";

/**
 * Entity lookup by a 64-hex value of a hex column (catalog/entity-store.ts),
 * optionally qualified by a number attribute of the same entity: the unique
 * index of `chunk/node`, or the model's prefix index (chunk/prefix qualified
 * by chunk/model).
 *
 * Open addressing with linear probing over an Int32Array of entity ids
 * (0 = empty), load ≤ 1/2, capacity a power of two. No key is copied: a probe
 * compares the query with the slot entity's current value. So a value that
 * changes or goes needs no removal: its stale slot stops matching, and the
 * table drops stale slots when it rebuilds (before it would pass load 1/2).
 * Memory: 4 bytes × capacity; a rebuild sizes it to the smallest power of two
 * ≥ 4 × (entities still indexed + 1), at least 1,024 slots, so it stays below
 * 8 × (entities indexed + 1) or 1,024.
 *
 * Hash: the value's eight little-endian words and the qualifier mixed with
 * multiplications and a murmur3 finalizer. The values are sha256 outputs, but
 * the prefix hash arrives from clients, so every byte counts and clustering
 * needs more than one chosen word.
 */
export class HexIndex {
  private slots = new Int32Array(MIN_SLOTS);
  /** Occupied slots, stale ones included. */
  private used = 0;
  private readonly key = Buffer.alloc(32);
  // The value in `key` and its hash with qualifier keyQ: a lookup of the same value again (every
  // publication's model fingerprint; the writer's rules, then its apply, on a new chunk's node id)
  // skips the hex conversion, the hash and, in find, the format check (keyValue passed it).
  private keyValue: string | undefined;
  private keyQ = 0;
  private keyHash = 0;

  constructor(
    private readonly store: EntityStore,
    private readonly hex: AttrInfo,
    private readonly qualifier?: AttrInfo,
  ) {
    if (hex.repr !== "hex") throw new Error(`HexIndex: ${hex.attr} is not a hex attribute`);
    if (qualifier !== undefined && (qualifier.repr !== "number" || qualifier.ns !== hex.ns))
      throw new Error(`HexIndex: ${qualifier.attr} cannot qualify ${hex.attr}`);
  }

  /** The entity holding `value` (with qualifier `q`), if any; undefined for a value that is not 64 lowercase hex. */
  find(value: string, q = 0): number | undefined {
    return value === this.keyValue || isHex64(value) ? this.findHex(value, q) : undefined;
  }

  /** `find` for a value the caller has checked is 64 lowercase hex. */
  findHex(value: string, q = 0): number | undefined {
    if (value !== this.keyValue) {
      this.key.write(value, 0, 32, "hex");
      this.keyValue = value;
      this.keyHash = hash(this.key, 0, q);
      this.keyQ = q;
    } else if (q !== this.keyQ) {
      this.keyHash = hash(this.key, 0, q);
      this.keyQ = q;
    }
    const mask = this.slots.length - 1;
    for (let i = this.keyHash & mask; ; i = (i + 1) & mask) {
      const e = this.slots[i]!;
      if (e === 0) return undefined;
      if (this.matches(e, this.key, q)) return e;
    }
  }

  /** Indexes e under its current value; e must hold one (and its qualifier). Adding twice is harmless. */
  add(e: number): void {
    if ((this.used + 1) * 2 > this.slots.length) this.rebuild();
    if (this.place(this.slots, e)) this.used++;
  }

  /** Puts e in `slots` under its current value unless it is there already; true when it took a slot. */
  private place(slots: Int32Array, e: number): boolean {
    const off = this.store.hexOffset(e, this.hex);
    const bytes = this.store.hexBytes(this.hex);
    if (off < 0) throw new Error(`HexIndex: entity ${e} holds no ${this.hex.attr}`);
    const q = this.qualifierOf(e);
    const mask = slots.length - 1;
    for (let i = hash(bytes, off, q) & mask; ; i = (i + 1) & mask) {
      const held = slots[i]!;
      if (held === 0) {
        slots[i] = e;
        return true;
      }
      if (held === e) return false;
    }
  }

  private qualifierOf(e: number): number {
    if (this.qualifier === undefined) return 0;
    const q = this.store.get(e, this.qualifier);
    if (q === undefined) throw new Error(`HexIndex: entity ${e} holds no ${this.qualifier.attr}`);
    return q as number;
  }

  private matches(e: number, key: Uint8Array, q: number): boolean {
    if (!this.store.hexEquals(e, this.hex, key)) return false;
    return this.qualifier === undefined || this.store.get(e, this.qualifier) === q;
  }

  /** Re-places every entity that still holds a value (stale slots go), in a table at load ≤ 1/4 after one more. */
  private rebuild(): void {
    const live: number[] = [];
    for (const e of this.slots) if (e !== 0 && this.stillIndexed(e)) live.push(e);
    let size = MIN_SLOTS;
    while (size < 4 * (live.length + 1)) size *= 2;
    const slots = new Int32Array(size);
    let used = 0;
    for (const e of live) if (this.place(slots, e)) used++;
    this.slots = slots;
    this.used = used;
  }

  private stillIndexed(e: number): boolean {
    return (
      this.store.holds(e, this.hex) && (this.qualifier === undefined || this.store.holds(e, this.qualifier))
    );
  }
}

const MIN_SLOTS = 1024;

/** 32-bit hash of bytes [off, off + 32) of b and a qualifier. */
function hash(b: Uint8Array, off: number, q: number): number {
  let h = Math.imul(q ^ 0x9e3779b9, 0x85ebca6b);
  for (let i = off; i < off + 32; i += 4) {
    const w = b[i]! | (b[i + 1]! << 8) | (b[i + 2]! << 16) | (b[i + 3]! << 24);
    h = Math.imul(h ^ Math.imul(w, 0xcc9e2d51), 0x1b873593);
    h = (h << 13) | (h >>> 19);
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}
