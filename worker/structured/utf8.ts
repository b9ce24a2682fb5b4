/**
 * Code point ranges as UTF-8 byte-range sequences, so a character class over
 * Unicode becomes byte transitions (the constrained sampler walks bytes).
 * The classic split (as Rust's regex-syntax Utf8Sequences): cut [lo, hi] at
 * the encoded-length boundaries (0x7F, 0x7FF, 0xFFFF), around the
 * surrogates, then until every continuation byte spans its full 0x80–0xBF
 * range or a single value. Pure.
 */

export type ByteRange = readonly [lo: number, hi: number];

const MAX_CP = 0x10ffff;

function encode(cp: number): number[] {
  if (cp < 0x80) return [cp];
  if (cp < 0x800) return [0xc0 | (cp >> 6), 0x80 | (cp & 0x3f)];
  if (cp < 0x10000) return [0xe0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f)];
  return [0xf0 | (cp >> 18), 0x80 | ((cp >> 12) & 0x3f), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f)];
}

/** Byte-range sequences matching exactly the UTF-8 encodings of code points in [lo, hi] (surrogates excluded). */
export function utf8Sequences(lo: number, hi: number): ByteRange[][] {
  if (lo < 0 || hi > MAX_CP || lo > hi) throw new RangeError(`bad code point range ${lo}..${hi}`);
  const out: ByteRange[][] = [];
  const stack: [number, number][] = [[lo, hi]];
  while (stack.length > 0) {
    const [a, b] = stack.pop()!;
    // Surrogates have no UTF-8 encoding.
    if (a <= 0xdfff && b >= 0xd800) {
      if (a < 0xd800) stack.push([a, 0xd7ff]);
      if (b > 0xdfff) stack.push([0xe000, b]);
      continue;
    }
    // Split at the length boundaries.
    let split = false;
    for (const edge of [0x7f, 0x7ff, 0xffff]) {
      if (a <= edge && b > edge) {
        stack.push([edge + 1, b]);
        stack.push([a, edge]);
        split = true;
        break;
      }
    }
    if (split) continue;
    if (b < 0x80) {
      out.push([[a, b]]);
      continue;
    }
    // Split until each continuation position spans a whole block or one value.
    const n = encode(a).length;
    let done = false;
    for (let i = 1; i < n && !done; i++) {
      const m = (1 << (6 * i)) - 1;
      if ((a & ~m) !== (b & ~m)) {
        if ((a & m) !== 0) {
          stack.push([(a | m) + 1, b]);
          stack.push([a, a | m]);
          done = true;
        } else if ((b & m) !== m) {
          stack.push([b & ~m, b]);
          stack.push([a, (b & ~m) - 1]);
          done = true;
        }
      }
    }
    if (done) continue;
    const ea = encode(a);
    const eb = encode(b);
    out.push(ea.map((x, i) => [x, eb[i]!] as const));
  }
  // The stack pops in reverse: restore ascending order.
  out.sort((x, y) => x[0]![0] - y[0]![0] || (x[1]?.[0] ?? 0) - (y[1]?.[0] ?? 0));
  return out;
}

/** Normalises code point ranges: sorted, merged, clipped to valid code points. */
export function normalise(ranges: readonly ByteRange[]): ByteRange[] {
  const sorted = [...ranges]
    .map(([a, b]) => [Math.max(0, a), Math.min(MAX_CP, b)] as const)
    .filter(([a, b]) => a <= b);
  sorted.sort((x, y) => x[0] - y[0]);
  const out: [number, number][] = [];
  for (const [a, b] of sorted) {
    const last = out[out.length - 1];
    if (last && a <= last[1] + 1) last[1] = Math.max(last[1], b);
    else out.push([a, b]);
  }
  return out;
}

/** The complement of normalised ranges within [0, 0x10FFFF]. */
export function complement(ranges: readonly ByteRange[]): ByteRange[] {
  const out: [number, number][] = [];
  let next = 0;
  for (const [a, b] of normalise(ranges)) {
    if (a > next) out.push([next, a - 1]);
    next = b + 1;
  }
  if (next <= MAX_CP) out.push([next, MAX_CP]);
  return out;
}

export function utf8Bytes(s: string): Uint8Array {
  return new Uint8Array(Buffer.from(s, "utf8"));
}
