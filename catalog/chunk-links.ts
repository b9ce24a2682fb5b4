import { grown, idCapacity } from "./entity-store.ts";

/**
 * The entities that name a chunk (its replicas, or its placements), per
 * chunk, in the order they were linked: a singly linked list through entity
 * ids in typed arrays (head and tail by chunk id, next by member id), so the
 * index adds no heap object per chunk or member.
 *
 * A chunk has few members (at most workers × tiers that hold or are meant to
 * hold it), so lookups walk the list. Members are linked once and never
 * unlinked: a replica's chunk does not change (the writer creates a new
 * entity for another chunk, worker or tier). Memory: 13 bytes per id up to
 * the highest id seen, the arrays sized to the next power of two (≤ MAX_EID + 1).
 */
export class ChunkLinks {
  private head = new Int32Array(INITIAL);
  private tail = new Int32Array(INITIAL);
  private next = new Int32Array(INITIAL);
  private linked = new Uint8Array(INITIAL);

  isLinked(member: number): boolean {
    return member < this.linked.length && this.linked[member] === 1;
  }

  /** Appends member to chunk's list (once: a member already linked stays where it is). */
  link(chunk: number, member: number): void {
    if (this.isLinked(member)) return;
    this.fit(Math.max(chunk, member));
    const last = this.tail[chunk]!;
    if (last === 0) this.head[chunk] = member;
    else this.next[last] = member;
    this.tail[chunk] = member;
    this.next[member] = 0;
    this.linked[member] = 1;
  }

  /** Chunk's members, in link order. */
  members(chunk: number): number[] {
    const out: number[] = [];
    if (chunk >= this.head.length) return out;
    for (let m = this.head[chunk]!; m !== 0; m = this.next[m]!) out.push(m);
    return out;
  }

  /** The first member of chunk's list that satisfies `pred`. */
  find(chunk: number, pred: (member: number) => boolean): number | undefined {
    if (chunk >= this.head.length) return undefined;
    for (let m = this.head[chunk]!; m !== 0; m = this.next[m]!) if (pred(m)) return m;
    return undefined;
  }

  private fit(id: number): void {
    if (id < this.head.length) return;
    const n = idCapacity(this.head.length, id);
    this.head = grown(this.head, n);
    this.tail = grown(this.tail, n);
    this.next = grown(this.next, n);
    this.linked = grown(this.linked, n);
  }
}

const INITIAL = 64;
