import { GrammarError, type Nfa } from "./nfa.ts";

/**
 * A DFA over bytes built lazily from an NFA (subset construction on demand):
 * a state is the epsilon-closed set of NFA states that can still reach
 * accept, so every live state can finish. Transitions are memoised per state
 * in a 256-entry table (UNKNOWN until first asked). Bounded: at most
 * MAX_DFA_STATES states, past which a step throws.
 */

export const DEAD = -1;
const UNKNOWN = -2;
export const MAX_DFA_STATES = 65_536;

export class LazyDfa {
  private readonly sets: Int32Array[] = [];
  private readonly index = new Map<string, number>();
  private readonly table: Int32Array[] = [];
  private readonly acceptFlags: boolean[] = [];
  private readonly dist: number[] = [];
  private readonly exits: (boolean | undefined)[] = [];
  private readonly mark: Int32Array;
  private stamp = 0;
  readonly start: number;

  constructor(private readonly nfa: Nfa) {
    this.mark = new Int32Array(nfa.size);
    const s = this.intern(this.closure([nfa.start]));
    if (s === DEAD) throw new GrammarError("the grammar matches no output");
    this.start = s;
  }

  get states(): number {
    return this.sets.length;
  }

  /** The state after byte `b`, or DEAD. */
  step(state: number, b: number): number {
    const row = this.table[state]!;
    const known = row[b]!;
    if (known !== UNKNOWN) return known;
    const set = this.sets[state]!;
    const targets: number[] = [];
    const { edgeLo, edgeHi, edgeTo } = this.nfa;
    for (let i = 0; i < set.length; i++) {
      const s = set[i]!;
      const lo = edgeLo[s]!;
      const hi = edgeHi[s]!;
      const to = edgeTo[s]!;
      for (let k = 0; k < lo.length; k++) if (b >= lo[k]! && b <= hi[k]!) targets.push(to[k]!);
    }
    const next = targets.length === 0 ? DEAD : this.intern(this.closure(targets));
    row[b] = next;
    return next;
  }

  accepting(state: number): boolean {
    return this.acceptFlags[state]!;
  }

  /** Fewest bytes from `state` to an accepting state. */
  minDist(state: number): number {
    return this.dist[state]!;
  }

  /** Whether any byte continues from `state` (accepting without exits: the output is complete). */
  hasExits(state: number): boolean {
    let e = this.exits[state];
    if (e === undefined) {
      e = false;
      for (let b = 0; b < 256 && !e; b++) if (this.step(state, b) !== DEAD) e = true;
      this.exits[state] = e;
    }
    return e;
  }

  /** The epsilon closure of `seeds`, without states that cannot reach accept, sorted. */
  private closure(seeds: readonly number[]): Int32Array {
    this.stamp++;
    if (this.stamp === 0x7fffffff) {
      this.mark.fill(0);
      this.stamp = 1;
    }
    const out: number[] = [];
    const stack = [...seeds];
    const { eps, minDist } = this.nfa;
    while (stack.length > 0) {
      const s = stack.pop()!;
      if (this.mark[s] === this.stamp) continue;
      this.mark[s] = this.stamp;
      if (minDist[s] === Number.POSITIVE_INFINITY) continue;
      out.push(s);
      for (const t of eps[s]!) if (this.mark[t] !== this.stamp) stack.push(t);
    }
    out.sort((a, b) => a - b);
    return Int32Array.from(out);
  }

  private intern(set: Int32Array): number {
    if (set.length === 0) return DEAD;
    const key = set.join(",");
    const known = this.index.get(key);
    if (known !== undefined) return known;
    if (this.sets.length >= MAX_DFA_STATES)
      throw new GrammarError(`the constraint's automaton grew past ${MAX_DFA_STATES} states`);
    const id = this.sets.length;
    this.sets.push(set);
    this.index.set(key, id);
    this.table.push(new Int32Array(256).fill(UNKNOWN));
    let d = Number.POSITIVE_INFINITY;
    let acc = false;
    for (const s of set) {
      d = Math.min(d, this.nfa.minDist[s]!);
      if (s === this.nfa.accept) acc = true;
    }
    this.acceptFlags.push(acc);
    this.dist.push(d);
    this.exits.push(undefined);
    return id;
  }
}
