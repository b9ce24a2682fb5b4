import type { Engine } from "../../native/engine.ts";
import {
  checkWork,
  DecodeError,
  type Decoder,
  type DecodeWork,
  type SequenceId,
  splitLogits,
} from "./decoder.ts";

/**
 * The contiguous decoder: each sequence owns one row of the engine's
 * contiguous cache [maxSeqs, ctxCap] per layer. No paging at all, so it is
 * the oracle the paged decoder is held to, and the simple path for small
 * models.
 */
export class ContiguousDecoder implements Decoder {
  readonly vocab: number;
  private readonly free: number[] = [];
  private readonly lengths = new Map<SequenceId, number>();

  constructor(
    private readonly engine: Engine,
    readonly maxSeqs: number,
    readonly ctxCap: number,
  ) {
    if (!Number.isInteger(maxSeqs) || maxSeqs < 1)
      throw new RangeError(`maxSeqs must be positive, got ${maxSeqs}`);
    if (!Number.isInteger(ctxCap) || ctxCap < 1)
      throw new RangeError(`ctxCap must be positive, got ${ctxCap}`);
    this.vocab = engine.spec.vocab;
    engine.createContiguousCache(maxSeqs, Math.min(ctxCap, engine.spec.maxPosition));
    for (let s = maxSeqs - 1; s >= 0; s--) this.free.push(s);
  }

  open(): SequenceId {
    const slot = this.free.pop();
    if (slot === undefined) throw new DecodeError(`all ${this.maxSeqs} contiguous cache rows are in use`);
    this.lengths.set(slot as SequenceId, 0);
    return slot as SequenceId;
  }

  length(seq: SequenceId): number {
    const n = this.lengths.get(seq);
    if (n === undefined) throw new DecodeError(`sequence ${seq} is not open`);
    return n;
  }

  close(seq: SequenceId): void {
    this.length(seq);
    this.lengths.delete(seq);
    this.free.push(seq);
  }

  async step(work: readonly DecodeWork[]): Promise<Float32Array[]> {
    const T = checkWork(
      work,
      (s) => this.length(s),
      this.vocab,
      Math.min(this.ctxCap, this.engine.spec.maxPosition),
    );
    const tokens = new Int32Array(T);
    const positions = new Int32Array(T);
    const rowSeq = new Int32Array(T);
    const logitRows = new Int32Array(work.length);
    let t = 0;
    for (const [i, w] of work.entries()) {
      const start = this.length(w.seq);
      for (let j = 0; j < w.tokens.length; j++, t++) {
        tokens[t] = w.tokens[j]!;
        positions[t] = start + j;
        rowSeq[t] = w.seq;
      }
      logitRows[i] = t - 1;
    }
    const block = await this.engine.stepContiguous({ tokens, positions, rowSeq, logitRows });
    // Lengths move only once the engine has written every row.
    for (const w of work) this.lengths.set(w.seq, this.length(w.seq) + w.tokens.length);
    return splitLogits(block, work.length, this.vocab);
  }
}
