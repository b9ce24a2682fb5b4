/**
 * A small seeded PRNG: xoshiro128** (Blackman & Vigna), state seeded by
 * splitmix32 from one integer, so one seed names one stream on every
 * platform. Not for cryptography; for reproducible simulation.
 */
export class Prng {
  private a: number;
  private b: number;
  private c: number;
  private d: number;

  constructor(seed: number) {
    if (!Number.isSafeInteger(seed)) throw new RangeError(`seed must be an integer, got ${seed}`);
    // splitmix32 over the low and high words of the seed
    let x = (seed | 0) ^ Math.floor(seed / 2 ** 32);
    const next = (): number => {
      x = (x + 0x9e3779b9) | 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.a = next();
    this.b = next();
    this.c = next();
    this.d = next();
    if ((this.a | this.b | this.c | this.d) === 0) this.d = 1; // the all-zero state is a fixed point
  }

  /** Next uniform u32. */
  u32(): number {
    const r = Math.imul(rotl(Math.imul(this.b, 5), 7), 9) >>> 0;
    const t = this.b << 9;
    this.c ^= this.a;
    this.d ^= this.b;
    this.b ^= this.c;
    this.a ^= this.d;
    this.c ^= t;
    this.d = rotl(this.d, 11);
    return r;
  }

  /** Uniform in [0, 1) with 32 bits of resolution. */
  float(): number {
    return this.u32() / 2 ** 32;
  }

  /** Uniform integer in [lo, hi] (inclusive). */
  int(lo: number, hi: number): number {
    if (hi < lo) throw new RangeError(`empty range ${lo}..${hi}`);
    return lo + Math.floor(this.float() * (hi - lo + 1));
  }

  chance(p: number): boolean {
    return this.float() < p;
  }

  /** Exponential with the given mean (inverse CDF). */
  exponential(mean: number): number {
    return -mean * Math.log(1 - this.float());
  }

  /** An independent stream for a sub-component (so adding draws in one part does not shift another). */
  fork(): Prng {
    return new Prng(this.u32() * 2 ** 21 + (this.u32() >>> 11));
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k)) | 0;
}
