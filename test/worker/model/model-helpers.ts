import { ModelConfigError, parseModelConfig } from "../../../worker/model/config.ts";
import { type Decoder, prefill } from "../../../worker/model/decoder.ts";
import { Rng, seedRng } from "../../../worker/model/prng.ts";

/** Shuffled page order from a seed: page tables come out fragmented and non-monotonic. */
export function shuffled(n: number, seed: number): number[] {
  const rng = new Rng(seedRng(seed, "pages"));
  const a = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = rng.nextU32() % (i + 1);
    [a[i], a[j]] = [a[j]!, a[i]!];
  }
  return a;
}

/** `len` seeded token ids below `vocab`. */
export function promptOf(len: number, seed: number, vocab: number): number[] {
  const rng = new Rng(seedRng(seed, "prompt"));
  return Array.from({ length: len }, () => rng.nextU32() % vocab);
}

export function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

export function sameBits(a: Float32Array, b: Float32Array): boolean {
  return (
    Buffer.compare(
      Buffer.from(a.buffer, a.byteOffset, a.byteLength),
      Buffer.from(b.buffer, b.byteOffset, b.byteLength),
    ) === 0
  );
}

/** Logits of every position, by feeding tokens one per step. */
export async function allRows(decoder: Decoder, tokens: readonly number[]): Promise<Float32Array[]> {
  const seq = decoder.open();
  try {
    const rows: Float32Array[] = [];
    for (const t of tokens) rows.push((await decoder.step([{ seq, tokens: [t] }]))[0]!.slice());
    return rows;
  } finally {
    decoder.close(seq);
  }
}

/**
 * For each prefill chunk size: prefill `tokens` in chunks of that size, then
 * one decode step; that step's logits (the cached K/V must be the same too).
 */
export async function afterChunkedPrefill(
  decoder: Decoder,
  tokens: readonly number[],
  chunks: readonly number[],
): Promise<Float32Array[]> {
  const results: Float32Array[] = [];
  for (const chunk of chunks) {
    const seq = decoder.open();
    await prefill(decoder, seq, tokens, chunk);
    results.push((await decoder.step([{ seq, tokens: [3] }]))[0]!.slice());
    decoder.close(seq);
  }
  return results;
}

/** The ModelConfigError that parsing `cfg` throws. */
export function configErrorOf(cfg: unknown): ModelConfigError {
  try {
    parseModelConfig(cfg);
  } catch (err) {
    if (err instanceof ModelConfigError) return err;
    throw err;
  }
  throw new Error("expected a ModelConfigError");
}
