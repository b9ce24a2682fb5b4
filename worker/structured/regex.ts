import { alt, bytes, charIn, GrammarError, type Node, rep, seq } from "./nfa.ts";
import { type ByteRange, complement, normalise } from "./utf8.ts";

/**
 * A regular-expression parser for guided_regex and JSON-schema `pattern`
 * (the Python/ECMAScript common subset): literals and escapes, `.`, classes
 * `[...]` with ranges and negation, \d \w \s and their negations, groups
 * (plain, non-capturing, named), alternation, the quantifiers * + ? {n}
 * {n,} {n,m} (lazy forms match the same language), and ^ / $ at the ends.
 * Backreferences, lookaround and word boundaries are not regular and are
 * refused. The match is over the whole output (full match). Pure.
 *
 * `emit` turns one code-point class into a grammar node: plain UTF-8, or
 * (inside a JSON string) the encoding JSON needs for each character.
 */

export type CharEmitter = (ranges: readonly ByteRange[]) => Node;

export const plainChars: CharEmitter = (r) => charIn(...r);

const MAX_REPEAT = 1000;

const DIGIT: ByteRange[] = [[0x30, 0x39]];
const WORD: ByteRange[] = [
  [0x30, 0x39],
  [0x41, 0x5a],
  [0x5f, 0x5f],
  [0x61, 0x7a],
];
const SPACE: ByteRange[] = [
  [0x09, 0x0d],
  [0x20, 0x20],
];
const ANY_BUT_NEWLINE: ByteRange[] = complement([[0x0a, 0x0a]]);

export function parseRegex(source: string, emit: CharEmitter = plainChars): Node {
  const cps = [...source].map((c) => c.codePointAt(0)!);
  let i = 0;
  const fail = (msg: string): never => {
    throw new GrammarError(`regex ${JSON.stringify(source)} at ${i}: ${msg}`);
  };
  const peek = () => cps[i];
  const eat = (cp: number) => {
    if (cps[i] === cp) {
      i++;
      return true;
    }
    return false;
  };

  function alternation(depth: number): Node {
    if (depth > 100) fail("groups nest too deeply");
    const branches = [sequence(depth)];
    while (eat(0x7c /* | */)) branches.push(sequence(depth));
    return branches.length === 1 ? branches[0]! : alt(...branches);
  }

  function sequence(depth: number): Node {
    const items: Node[] = [];
    while (i < cps.length && peek() !== 0x7c && peek() !== 0x29 /* ) */) {
      const c = peek()!;
      if (c === 0x5e /* ^ */) {
        if (i !== 0) fail("'^' is supported only at the start");
        i++;
        continue;
      }
      if (c === 0x24 /* $ */) {
        if (i !== cps.length - 1) fail("'$' is supported only at the end");
        i++;
        continue;
      }
      items.push(quantified(atom(depth)));
    }
    return items.length === 1 ? items[0]! : seq(...items);
  }

  function atom(depth: number): Node {
    const c = cps[i++]!;
    switch (c) {
      case 0x28 /* ( */:
        {
          if (eat(0x3f /* ? */)) {
            if (eat(0x3a /* : */)) {
              // non-capturing
            } else if (eat(0x50 /* P */) || peek() === 0x3c /* < */) {
              if (!eat(0x3c)) fail("expected '<' in a named group");
              if (peek() === 0x3d || peek() === 0x21) fail("lookbehind is not supported");
              while (i < cps.length && peek() !== 0x3e) i++;
              if (!eat(0x3e)) fail("unterminated group name");
            } else fail("lookaround and inline flags are not supported");
          }
          const inner = alternation(depth + 1);
          if (!eat(0x29)) fail("missing ')'");
          return inner;
        }
      case 0x5b /* [ */:
        return emit(charClass());
      case 0x2e /* . */:
        return emit(ANY_BUT_NEWLINE);
      case 0x5c /* \ */:
        return escaped(false) as Node;
      case 0x2a:
      case 0x2b:
      case 0x3f:
      case 0x7b:
        return fail("nothing to repeat");
      default:
        return emit([[c, c]]);
    }
  }

  /** After a backslash: a class (as ranges when inClass) or a literal node. */
  function escaped(inClass: boolean): Node | ByteRange[] {
    const c = cps[i++];
    if (c === undefined) return fail("trailing backslash");
    const cls = (r: ByteRange[]) => (inClass ? r : emit(r));
    switch (String.fromCodePoint(c)) {
      case "d":
        return cls(DIGIT);
      case "D":
        return cls(complement(DIGIT));
      case "w":
        return cls(WORD);
      case "W":
        return cls(complement(WORD));
      case "s":
        return cls(SPACE);
      case "S":
        return cls(complement(SPACE));
      case "n":
        return cls([[0x0a, 0x0a]]);
      case "t":
        return cls([[0x09, 0x09]]);
      case "r":
        return cls([[0x0d, 0x0d]]);
      case "f":
        return cls([[0x0c, 0x0c]]);
      case "v":
        return cls([[0x0b, 0x0b]]);
      case "0":
        return cls([[0, 0]]);
      case "x":
        return cls(single(hex(2)));
      case "u":
        return cls(single(hex(4)));
      case "b":
      case "B":
        return inClass && String.fromCodePoint(c) === "b"
          ? [[0x08, 0x08]]
          : fail("word boundaries are not supported");
      default:
        if (c >= 0x31 && c <= 0x39) return fail("backreferences are not supported");
        if ((c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a))
          return fail(`unknown escape \\${String.fromCodePoint(c)}`);
        return cls([[c, c]]);
    }
  }

  function single(cp: number): ByteRange[] {
    return [[cp, cp]];
  }

  function hex(n: number): number {
    let v = 0;
    for (let k = 0; k < n; k++) {
      const d = parseInt(String.fromCodePoint(cps[i] ?? 0x20), 16);
      if (Number.isNaN(d)) fail("bad hex escape");
      v = v * 16 + d;
      i++;
    }
    return v;
  }

  function charClass(): ByteRange[] {
    const negate = eat(0x5e /* ^ */);
    const ranges: ByteRange[] = [];
    let first = true;
    while (i < cps.length && (peek() !== 0x5d /* ] */ || first)) {
      first = false;
      let lo: number;
      if (peek() === 0x5c) {
        i++;
        const r = escaped(true) as ByteRange[];
        if (r.length !== 1 || r[0]![0] !== r[0]![1]) {
          ranges.push(...r);
          continue;
        }
        lo = r[0]![0];
      } else lo = cps[i++]!;
      if (peek() === 0x2d /* - */ && cps[i + 1] !== undefined && cps[i + 1] !== 0x5d) {
        i++;
        let hi: number;
        if (peek() === 0x5c) {
          i++;
          const r = escaped(true) as ByteRange[];
          if (r.length !== 1 || r[0]![0] !== r[0]![1]) return fail("a class range must end in one character");
          hi = r[0]![0];
        } else hi = cps[i++]!;
        if (hi < lo) fail("reversed class range");
        ranges.push([lo, hi]);
      } else ranges.push([lo, lo]);
    }
    if (!eat(0x5d)) fail("missing ']'");
    const r = normalise(ranges);
    return negate ? complement(r) : r;
  }

  function quantified(n: Node): Node {
    for (;;) {
      const c = peek();
      let min: number;
      let max: number;
      if (c === 0x2a) [min, max] = [0, Number.POSITIVE_INFINITY];
      else if (c === 0x2b) [min, max] = [1, Number.POSITIVE_INFINITY];
      else if (c === 0x3f) [min, max] = [0, 1];
      else if (c === 0x7b && /^\{\d+(,\d*)?\}/.test(String.fromCodePoint(...cps.slice(i, i + 16)))) {
        const m = /^\{(\d+)(,(\d*))?\}/.exec(String.fromCodePoint(...cps.slice(i, i + 16)))!;
        min = Number(m[1]);
        max = m[2] === undefined ? min : m[3] === "" ? Number.POSITIVE_INFINITY : Number(m[3]);
        if (max < min) fail("bad repetition bounds");
        if (min > MAX_REPEAT || (max !== Number.POSITIVE_INFINITY && max > MAX_REPEAT))
          fail(`repetition bounds above ${MAX_REPEAT} are not supported`);
        i += m[0].length - 1;
      } else return n;
      i++;
      eat(0x3f); // lazy: the same language
      if (peek() === 0x2b) fail("possessive quantifiers are not supported");
      n = rep(n, min, max);
    }
  }

  const node = alternation(0);
  if (i < cps.length) fail("unbalanced ')'");
  return node;
}

/** A literal string as a node (plain UTF-8). */
export const literal = (s: string): Node => bytes(s);
