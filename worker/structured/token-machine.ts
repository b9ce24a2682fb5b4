import { DEAD, type LazyDfa } from "./dfa.ts";

/**
 * The token mask of a byte grammar for one vocabulary: which ids may come
 * next in a DFA state, found by walking a trie of the tokens' bytes beside
 * the DFA (a subtree is pruned at the first dead byte) and cached per state
 * as a bitset, so after warm-up a step costs a lookup. Special tokens have no
 * bytes and are never allowed by the grammar; the request's stop ids are
 * allowed exactly where the grammar accepts.
 *
 * Completion within max_tokens: `choices` with the request's remaining
 * budget keeps only tokens after which the shortest completion still fits
 * (DFA minDist in bytes ≤ tokens left, exact when every byte is a token of its
 * own, as in byte-level BPE and byte-fallback vocabularies), so an output cut
 * by max_tokens still parses.
 */

/** Tokens' bytes as a trie in flat arrays (children and ending tokens of node i in CSR ranges). */
export class TokenTrie {
  private constructor(
    readonly childStart: Int32Array,
    readonly childByte: Uint8Array,
    readonly childNode: Int32Array,
    readonly tokenStart: Int32Array,
    readonly tokenIds: Int32Array,
    /** Output bytes per id (null: special, never grammar-allowed). */
    readonly bytesOf: readonly (Uint8Array | null)[],
    /** Every byte value is some token's whole output: the budget rule is exact. */
    readonly hasAllBytes: boolean,
  ) {}

  get vocabSize(): number {
    return this.bytesOf.length;
  }

  static build(bytesOf: readonly (Uint8Array | null)[]): TokenTrie {
    const children: Map<number, number>[] = [new Map()];
    const ending: number[][] = [[]];
    const single = new Set<number>();
    for (const [id, bs] of bytesOf.entries()) {
      if (!bs || bs.length === 0) continue;
      if (bs.length === 1) single.add(bs[0]!);
      let node = 0;
      for (const b of bs) {
        let next = children[node]!.get(b);
        if (next === undefined) {
          next = children.length;
          children.push(new Map());
          ending.push([]);
          children[node]!.set(b, next);
        }
        node = next;
      }
      ending[node]!.push(id);
    }
    const n = children.length;
    const childStart = new Int32Array(n + 1);
    const tokenStart = new Int32Array(n + 1);
    let edges = 0;
    let toks = 0;
    for (let i = 0; i < n; i++) {
      childStart[i] = edges;
      tokenStart[i] = toks;
      edges += children[i]!.size;
      toks += ending[i]!.length;
    }
    childStart[n] = edges;
    tokenStart[n] = toks;
    const childByte = new Uint8Array(edges);
    const childNode = new Int32Array(edges);
    const tokenIds = new Int32Array(toks);
    for (let i = 0; i < n; i++) {
      let k = childStart[i]!;
      for (const [b, c] of [...children[i]!].sort((x, y) => x[0] - y[0])) {
        childByte[k] = b;
        childNode[k++] = c;
      }
      tokenIds.set(ending[i]!, tokenStart[i]!);
    }
    return new TokenTrie(
      childStart,
      childByte,
      childNode,
      tokenStart,
      tokenIds,
      bytesOf,
      single.size === 256,
    );
  }
}

interface Mask {
  readonly bits: Uint32Array;
  readonly count: number;
  /** The largest minDist after any allowed token: below it, the budget rule must filter. */
  readonly maxAfter: number;
}

/** A state's allowed ids ascending, with the DFA minDist after each: the budget rule is one pass over numbers. */
interface StateList {
  readonly ids: Int32Array;
  readonly after: Int32Array;
}

/** Id lists kept per machine for the most recently used states (the bitsets are kept for all). */
const MAX_CACHED_LISTS = 64;

export class TokenMachine {
  private readonly masks: (Mask | undefined)[] = [];
  private readonly lists = new Map<number, StateList>();

  constructor(
    readonly dfa: LazyDfa,
    readonly trie: TokenTrie,
  ) {}

  get start(): number {
    return this.dfa.start;
  }

  /** The state after `token` (DEAD: not allowed; stop ids are not grammar tokens). */
  next(state: number, token: number): number {
    const bs = this.trie.bytesOf[token];
    if (!bs || bs.length === 0) return DEAD;
    let s = state;
    for (let i = 0; i < bs.length && s !== DEAD; i++) s = this.dfa.step(s, bs[i]!);
    return s;
  }

  /** The output is complete: accepting and nothing can follow. */
  complete(state: number): boolean {
    return this.dfa.accepting(state) && !this.dfa.hasExits(state);
  }

  /**
   * The ids allowed at `state`, ascending, for a request that may still
   * generate `budget` tokens (this one included): grammar tokens after which
   * the rest fits, and the stop ids where the grammar accepts. The array may
   * be the machine's cached list: callers must not write to it.
   */
  choices(state: number, budget: number, stopTokens: readonly number[]): Int32Array {
    const mask = this.mask(state);
    const list = this.list(state, mask);
    const accepting = this.dfa.accepting(state);
    const stops = accepting ? stopTokens.filter((t) => t >= 0 && t < this.trie.vocabSize) : [];
    let ids = list.ids;
    if (this.trie.hasAllBytes && budget - 1 < mask.maxAfter) {
      const limit = budget - 1;
      const out = new Int32Array(ids.length);
      let k = 0;
      for (let i = 0; i < ids.length; i++) if (list.after[i]! <= limit) out[k++] = ids[i]!;
      ids = out.subarray(0, k);
    }
    if (stops.length === 0) return ids;
    const merged = new Set<number>(ids);
    for (const t of stops) merged.add(t);
    return Int32Array.from([...merged].sort((a, b) => a - b));
  }

  private list(state: number, mask: Mask): StateList {
    const known = this.lists.get(state);
    if (known) {
      // Least recently used first out: a hit moves to the back.
      this.lists.delete(state);
      this.lists.set(state, known);
      return known;
    }
    const ids = new Int32Array(mask.count);
    const after = new Int32Array(mask.count);
    let k = 0;
    forEachBit(mask.bits, (id) => {
      ids[k] = id;
      after[k++] = this.dfa.minDist(this.next(state, id));
    });
    const l = { ids, after };
    if (this.lists.size >= MAX_CACHED_LISTS) this.lists.delete(this.lists.keys().next().value!);
    this.lists.set(state, l);
    return l;
  }

  private mask(state: number): Mask {
    const known = this.masks[state];
    if (known) return known;
    const t = this.trie;
    const bits = new Uint32Array((t.vocabSize + 31) >>> 5);
    let count = 0;
    let maxAfter = 0;
    const nodes: number[] = [0];
    const states: number[] = [state];
    while (nodes.length > 0) {
      const node = nodes.pop()!;
      const s = states.pop()!;
      for (let k = t.childStart[node]!; k < t.childStart[node + 1]!; k++) {
        const ns = this.dfa.step(s, t.childByte[k]!);
        if (ns === DEAD) continue;
        const child = t.childNode[k]!;
        const d = this.dfa.minDist(ns);
        for (let j = t.tokenStart[child]!; j < t.tokenStart[child + 1]!; j++) {
          const id = t.tokenIds[j]!;
          bits[id >>> 5]! |= 1 << (id & 31);
          count++;
          if (d > maxAfter) maxAfter = d;
        }
        nodes.push(child);
        states.push(ns);
      }
    }
    const m = { bits, count, maxAfter };
    this.masks[state] = m;
    return m;
  }
}

function forEachBit(bits: Uint32Array, f: (id: number) => void): void {
  for (let w = 0; w < bits.length; w++) {
    let x = bits[w]!;
    while (x !== 0) {
      const low = x & -x;
      f((w << 5) + (31 - Math.clz32(low)));
      x ^= low;
    }
  }
}
