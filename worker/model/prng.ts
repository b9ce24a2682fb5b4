import { createHash } from "node:crypto";

/**
 * xoshiro128** (Blackman & Vigna): a small, fast 32-bit generator whose whole
 * state is four u32 words, so a sampler's state can be copied, stored with its
 * request and resumed exactly. Seeded through sha256 of (seed, label), so
 * streams with different labels (tensor names, request ids) are independent.
 */
export type RngState = readonly [number, number, number, number];

export function seedRng(seed: number | bigint | string, label = ""): RngState {
  const h = createHash("sha256")
    .update(`continuum/rng/v1\u0000${String(seed)}\u0000${label}`)
    .digest();
  const s: [number, number, number, number] = [
    h.readUInt32LE(0),
    h.readUInt32LE(4),
    h.readUInt32LE(8),
    h.readUInt32LE(12),
  ];
  // The all-zero state is xoshiro's one fixed point.
  if ((s[0] | s[1] | s[2] | s[3]) === 0) s[0] = 1;
  return s;
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/** A mutable generator over an RngState. */
export class Rng {
  private a: number;
  private b: number;
  private c: number;
  private d: number;

  constructor(state: RngState) {
    [this.a, this.b, this.c, this.d] = state;
  }

  state(): RngState {
    return [this.a, this.b, this.c, this.d];
  }

  nextU32(): number {
    const result = Math.imul(rotl(Math.imul(this.b, 5) >>> 0, 7), 9) >>> 0;
    const t = (this.b << 9) >>> 0;
    this.c = (this.c ^ this.a) >>> 0;
    this.d = (this.d ^ this.b) >>> 0;
    this.b = (this.b ^ this.c) >>> 0;
    this.a = (this.a ^ this.d) >>> 0;
    this.c = (this.c ^ t) >>> 0;
    this.d = rotl(this.d, 11);
    return result;
  }

  /** Uniform in [0, 1) with 53 random bits. */
  nextFloat(): number {
    const hi = this.nextU32() >>> 5; // 27 bits
    const lo = this.nextU32() >>> 6; // 26 bits
    return (hi * 67108864 + lo) / 9007199254740992;
  }
}
