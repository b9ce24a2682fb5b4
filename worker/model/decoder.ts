import type { Brand } from "../../schema/ids.ts";
import { type FinishReason, nextToken, type SamplerState } from "./sampling.ts";

/**
 * What both decoders offer: sequences that grow by appending tokens in
 * ragged batches. One `step` runs one native forward over every work item's
 * tokens (prefill chunks and single decode tokens alike) and returns, per
 * item, the logits of its last token. A step that fails leaves every
 * sequence's length as it was.
 */
export type SequenceId = Brand<number, "SequenceId">;

export interface DecodeWork {
  readonly seq: SequenceId;
  /** Tokens appended at positions length(seq) … length(seq) + tokens.length − 1. */
  readonly tokens: readonly number[];
}

export interface Decoder {
  readonly vocab: number;
  /** Starts an empty sequence; throws when the decoder is at its sequence bound. */
  open(): SequenceId;
  /** Tokens processed so far. */
  length(seq: SequenceId): number;
  step(work: readonly DecodeWork[]): Promise<Float32Array[]>;
  /** Ends a sequence and returns its memory. */
  close(seq: SequenceId): void;
}

export class DecodeError extends Error {
  override readonly name = "DecodeError";
}

/** Checks a step's work against the sequences' state; returns the total row count. */
export function checkWork(
  work: readonly DecodeWork[],
  length: (seq: SequenceId) => number,
  vocab: number,
  maxLength: number,
): number {
  if (work.length === 0) throw new DecodeError("a step needs at least one work item");
  const seen = new Set<number>();
  let rows = 0;
  for (const [i, w] of work.entries()) {
    if (seen.has(w.seq)) throw new DecodeError(`work[${i}]: sequence ${w.seq} appears twice in one step`);
    seen.add(w.seq);
    if (w.tokens.length === 0) throw new DecodeError(`work[${i}]: no tokens`);
    for (const [j, t] of w.tokens.entries())
      if (!Number.isInteger(t) || t < 0 || t >= vocab)
        throw new DecodeError(`work[${i}].tokens[${j}] = ${t} is outside the vocabulary (${vocab})`);
    const end = length(w.seq) + w.tokens.length;
    if (end > maxLength)
      throw new DecodeError(
        `work[${i}]: sequence ${w.seq} would reach ${end} tokens, over its bound ${maxLength}`,
      );
    rows += w.tokens.length;
  }
  return rows;
}

/** Splits a [rows, vocab] logits block into per-row views. */
export function splitLogits(block: Float32Array, rows: number, vocab: number): Float32Array[] {
  if (block.length !== rows * vocab)
    throw new DecodeError(`engine returned ${block.length} logits, expected ${rows * vocab}`);
  const out: Float32Array[] = [];
  for (let r = 0; r < rows; r++) out.push(block.subarray(r * vocab, (r + 1) * vocab));
  return out;
}

/** Prefills `tokens` in chunks of at most `chunk` tokens; returns the last token's logits. */
export async function prefill(
  decoder: Decoder,
  seq: SequenceId,
  tokens: readonly number[],
  chunk = Number.POSITIVE_INFINITY,
): Promise<Float32Array> {
  if (tokens.length === 0) throw new DecodeError("prefill needs at least one token");
  let logits: Float32Array | undefined;
  for (let i = 0; i < tokens.length; i += chunk) {
    [logits] = await decoder.step([{ seq, tokens: tokens.slice(i, Math.min(tokens.length, i + chunk)) }]);
  }
  return logits!;
}

export interface Generation {
  readonly tokens: number[];
  /** Logits that chose each token (kept for exactness tests). */
  readonly logits: Float32Array[];
  readonly finish: FinishReason;
}

/**
 * Generates for several prompts at once: one prefill step for all of them,
 * then decode steps of one token per unfinished request. Each request owns
 * its sampler state; the decoder's sequences are closed at the end.
 */
export async function generate(
  decoder: Decoder,
  prompts: readonly (readonly number[])[],
  samplers: readonly SamplerState[],
): Promise<Generation[]> {
  if (prompts.length !== samplers.length) throw new DecodeError("one sampler per prompt");
  const seqs = prompts.map(() => decoder.open());
  try {
    const states = [...samplers];
    const out = prompts.map(() => ({
      tokens: [] as number[],
      logits: [] as Float32Array[],
      finish: null as FinishReason | null,
    }));
    let logits = await decoder.step(prompts.map((p, i) => ({ seq: seqs[i]!, tokens: p })));
    let live = prompts.map((_, i) => i);
    while (live.length > 0) {
      const next: number[] = [];
      for (const [k, i] of live.entries()) {
        const row = logits[k]!;
        const r = nextToken(states[i]!, row);
        states[i] = r.state;
        out[i]!.tokens.push(r.token);
        out[i]!.logits.push(row.slice());
        if (r.finish) out[i]!.finish = r.finish;
        else next.push(i);
      }
      live = next;
      if (live.length === 0) break;
      logits = await decoder.step(live.map((i) => ({ seq: seqs[i]!, tokens: [out[i]!.tokens.at(-1)!] })));
    }
    return out.map((o) => ({ tokens: o.tokens, logits: o.logits, finish: o.finish! }));
  } finally {
    for (const s of seqs) decoder.close(s);
  }
}
