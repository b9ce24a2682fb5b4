import { type ByteRange, normalise, utf8Sequences } from "./utf8.ts";

/**
 * A byte-level grammar: an expression tree (what the regex and JSON-schema
 * compilers produce) and its Thompson NFA over bytes. Every construct is
 * regular; recursion is unrolled to a bounded depth by the compilers, so the
 * NFA is finite. Pure.
 */

export class GrammarError extends Error {
  override readonly name = "GrammarError";
}

export type Node =
  /** These bytes, in order. */
  | { readonly t: "bytes"; readonly v: Uint8Array }
  /** One byte in these ranges. */
  | { readonly t: "byte"; readonly r: readonly ByteRange[] }
  /** One code point in these ranges, UTF-8 encoded. */
  | { readonly t: "char"; readonly r: readonly ByteRange[] }
  | { readonly t: "seq"; readonly v: readonly Node[] }
  /** One of these; no alternatives matches nothing. */
  | { readonly t: "alt"; readonly v: readonly Node[] }
  /** min..max repetitions (max may be Infinity). */
  | { readonly t: "rep"; readonly v: Node; readonly min: number; readonly max: number }
  /** min..max items separated by `sep` (max may be Infinity): item (sep item)*. */
  | {
      readonly t: "list";
      readonly item: Node;
      readonly sep: Node;
      readonly min: number;
      readonly max: number;
    }
  /**
   * Members in this order, optional ones skippable, `sep` between the ones
   * present (a JSON object's properties): linear in the members, not 2^k.
   */
  | {
      readonly t: "members";
      readonly v: readonly { readonly node: Node; readonly required: boolean }[];
      readonly sep: Node;
    };

export const bytes = (s: string | Uint8Array): Node => ({
  t: "bytes",
  v: typeof s === "string" ? new Uint8Array(Buffer.from(s, "utf8")) : s,
});
export const seq = (...v: Node[]): Node => ({ t: "seq", v });
export const alt = (...v: Node[]): Node => ({ t: "alt", v });
export const rep = (v: Node, min: number, max: number): Node => ({ t: "rep", v, min, max });
export const opt = (v: Node): Node => rep(v, 0, 1);
export const star = (v: Node): Node => rep(v, 0, Number.POSITIVE_INFINITY);
export const byteIn = (...r: ByteRange[]): Node => ({ t: "byte", r });
export const charIn = (...r: ByteRange[]): Node => ({ t: "char", r: normalise(r) });
export const list = (item: Node, sep: Node, min: number, max: number): Node => ({
  t: "list",
  item,
  sep,
  min,
  max,
});
export const members = (v: { node: Node; required: boolean }[], sep: Node): Node => ({
  t: "members",
  v,
  sep,
});
/** Matches nothing (an empty alternative). */
export const NOTHING: Node = alt();

/** Bound on NFA states for one grammar (a schema that unrolls past it is refused). */
export const MAX_NFA_STATES = 400_000;

/**
 * A Thompson NFA: state s has byte edges (lo, hi, to) and epsilon edges.
 * `start` and `accept` are single states; `minDist[s]` is the fewest bytes
 * from s to accept (Infinity when accept is unreachable).
 */
export class Nfa {
  readonly edgeLo: number[][] = [];
  readonly edgeHi: number[][] = [];
  readonly edgeTo: number[][] = [];
  readonly eps: number[][] = [];
  start = 0;
  accept = 0;
  minDist: Float64Array = new Float64Array(0);

  get size(): number {
    return this.eps.length;
  }

  state(): number {
    if (this.eps.length >= MAX_NFA_STATES)
      throw new GrammarError(`the grammar is too large (over ${MAX_NFA_STATES} automaton states)`);
    this.edgeLo.push([]);
    this.edgeHi.push([]);
    this.edgeTo.push([]);
    this.eps.push([]);
    return this.eps.length - 1;
  }

  edge(from: number, lo: number, hi: number, to: number): void {
    this.edgeLo[from]!.push(lo);
    this.edgeHi[from]!.push(hi);
    this.edgeTo[from]!.push(to);
  }

  epsilon(from: number, to: number): void {
    this.eps[from]!.push(to);
  }
}

interface Frag {
  readonly start: number;
  readonly end: number;
}

/** Compiles a grammar to its NFA and the fewest bytes from each state to accepting. */
export function compileNfa(root: Node): Nfa {
  const nfa = new Nfa();
  const f = build(nfa, root, 0);
  nfa.start = f.start;
  nfa.accept = f.end;
  nfa.minDist = distances(nfa);
  if (nfa.minDist[nfa.start] === Number.POSITIVE_INFINITY)
    throw new GrammarError("the grammar matches no output (no finite instance within the bounds)");
  return nfa;
}

const MAX_DEPTH = 2000;

function build(nfa: Nfa, n: Node, depth: number): Frag {
  if (depth > MAX_DEPTH) throw new GrammarError("the grammar nests too deeply");
  switch (n.t) {
    case "bytes": {
      const start = nfa.state();
      let at = start;
      for (const b of n.v) {
        const next = nfa.state();
        nfa.edge(at, b, b, next);
        at = next;
      }
      return { start, end: at };
    }
    case "byte": {
      const start = nfa.state();
      const end = nfa.state();
      for (const [lo, hi] of n.r) nfa.edge(start, lo, hi, end);
      return { start, end };
    }
    case "char": {
      const start = nfa.state();
      const end = nfa.state();
      for (const [lo, hi] of n.r) {
        for (const s of utf8Sequences(lo, hi)) {
          let at = start;
          for (let i = 0; i < s.length; i++) {
            const to = i === s.length - 1 ? end : nfa.state();
            nfa.edge(at, s[i]![0], s[i]![1], to);
            at = to;
          }
        }
      }
      return { start, end };
    }
    case "seq": {
      if (n.v.length === 0) {
        const s = nfa.state();
        return { start: s, end: s };
      }
      const parts = n.v.map((x) => build(nfa, x, depth + 1));
      for (let i = 0; i + 1 < parts.length; i++) nfa.epsilon(parts[i]!.end, parts[i + 1]!.start);
      return { start: parts[0]!.start, end: parts[parts.length - 1]!.end };
    }
    case "alt": {
      const start = nfa.state();
      const end = nfa.state();
      for (const x of n.v) {
        const f = build(nfa, x, depth + 1);
        nfa.epsilon(start, f.start);
        nfa.epsilon(f.end, end);
      }
      return { start, end };
    }
    case "rep":
      return repeat(nfa, n.min, n.max, depth, () => build(nfa, n.v, depth + 1), null);
    case "members": {
      // a[i]: no member emitted before i; b[i]: some member emitted (the next needs `sep`).
      const k = n.v.length;
      const a = Array.from({ length: k + 1 }, () => nfa.state());
      const b = Array.from({ length: k + 1 }, () => nfa.state());
      for (const [i, m] of n.v.entries()) {
        const first = build(nfa, m.node, depth + 1);
        nfa.epsilon(a[i]!, first.start);
        nfa.epsilon(first.end, b[i + 1]!);
        const s = build(nfa, n.sep, depth + 1);
        const later = build(nfa, m.node, depth + 1);
        nfa.epsilon(b[i]!, s.start);
        nfa.epsilon(s.end, later.start);
        nfa.epsilon(later.end, b[i + 1]!);
        if (!m.required) {
          nfa.epsilon(a[i]!, a[i + 1]!);
          nfa.epsilon(b[i]!, b[i + 1]!);
        }
      }
      const end = nfa.state();
      nfa.epsilon(a[k]!, end);
      nfa.epsilon(b[k]!, end);
      return { start: a[0]!, end };
    }
    case "list": {
      if (n.max === 0) {
        const s = nfa.state();
        return { start: s, end: s };
      }
      if (n.min <= 1 && n.max === Number.POSITIVE_INFINITY) {
        // One copy of the item, looping back through the separator.
        const item = build(nfa, n.item, depth + 1);
        const sep = build(nfa, n.sep, depth + 1);
        const start = nfa.state();
        const end = nfa.state();
        nfa.epsilon(start, item.start);
        if (n.min === 0) nfa.epsilon(start, end);
        nfa.epsilon(item.end, end);
        nfa.epsilon(item.end, sep.start);
        nfa.epsilon(sep.end, item.start);
        return { start, end };
      }
      const first = build(nfa, n.item, depth + 1);
      const rest = repeat(
        nfa,
        Math.max(0, n.min - 1),
        n.max - 1,
        depth,
        () => build(nfa, n.item, depth + 1),
        n.sep,
      );
      nfa.epsilon(first.end, rest.start);
      const whole = { start: first.start, end: rest.end };
      if (n.min > 0) return whole;
      const start = nfa.state();
      nfa.epsilon(start, whole.start);
      nfa.epsilon(start, whole.end);
      return { start, end: whole.end };
    }
  }
}

/**
 * min..max copies of a fragment (each preceded by `sep` when given): min
 * copies in sequence, then either one looping copy (max = ∞) or max − min
 * optional ones.
 */
function repeat(nfa: Nfa, min: number, max: number, depth: number, one: () => Frag, sep: Node | null): Frag {
  if (!(min >= 0 && max >= min)) throw new GrammarError(`bad repetition {${min},${max}}`);
  const item = (): Frag => {
    if (sep === null) return one();
    const s = build(nfa, sep, depth + 1);
    const f = one();
    nfa.epsilon(s.end, f.start);
    return { start: s.start, end: f.end };
  };
  const start = nfa.state();
  let at = start;
  for (let i = 0; i < min; i++) {
    const f = item();
    nfa.epsilon(at, f.start);
    at = f.end;
  }
  if (max === Number.POSITIVE_INFINITY) {
    const f = item();
    const end = nfa.state();
    nfa.epsilon(at, f.start);
    nfa.epsilon(at, end);
    nfa.epsilon(f.end, f.start);
    nfa.epsilon(f.end, end);
    return { start, end };
  }
  const end = nfa.state();
  nfa.epsilon(at, end);
  for (let i = min; i < max; i++) {
    const f = item();
    nfa.epsilon(at, f.start);
    nfa.epsilon(f.end, end);
    at = f.end;
  }
  return { start, end };
}

/** Fewest bytes from each state to accept: a 0-1 BFS backwards (epsilon costs 0, a byte 1). */
function distances(nfa: Nfa): Float64Array {
  const n = nfa.size;
  const back0: number[][] = Array.from({ length: n }, () => []);
  const back1: number[][] = Array.from({ length: n }, () => []);
  for (let s = 0; s < n; s++) {
    for (const t of nfa.eps[s]!) back0[t]!.push(s);
    for (const t of nfa.edgeTo[s]!) back1[t]!.push(s);
  }
  const dist = new Float64Array(n).fill(Number.POSITIVE_INFINITY);
  dist[nfa.accept] = 0;
  // Deque as two stacks of one cost level at a time.
  let level = [nfa.accept];
  let d = 0;
  while (level.length > 0) {
    const next: number[] = [];
    // Spread over epsilon edges within the level first.
    for (let i = 0; i < level.length; i++) {
      const s = level[i]!;
      if (dist[s] !== d) continue;
      for (const p of back0[s]!) {
        if (dist[p]! > d) {
          dist[p] = d;
          level.push(p);
        }
      }
    }
    for (const s of level) {
      if (dist[s] !== d) continue;
      for (const p of back1[s]!) {
        if (dist[p]! > d + 1) {
          dist[p] = d + 1;
          next.push(p);
        }
      }
    }
    level = next;
    d++;
  }
  return dist;
}
