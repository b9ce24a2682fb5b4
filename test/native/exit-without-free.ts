// Run as a child process by exit.test.ts: creates an engine, runs one step,
// and lets the process end without freeing it.
import { createEngine } from "../../native/engine.ts";
import { makeModel } from "./model.ts";

const m = makeModel(
  {
    nLayers: 1,
    hidden: 32,
    nHeads: 2,
    nKvHeads: 1,
    headDim: 16,
    ffn: 48,
    vocab: 31,
    rmsEps: 1e-5,
    ropeTheta: 10000,
    attentionBias: false,
    tiedEmbeddings: false,
    maxPosition: 64,
  },
  3,
);
const engine = await createEngine(m.spec, m.weights, { threads: 2 });
engine.createPool(4, 16);
await engine.step({
  tokens: Int32Array.of(1, 2),
  positions: Int32Array.of(0, 1),
  rowSeq: Int32Array.of(0, 0),
  slotMapping: Int32Array.of(0, 1),
  pageTable: Int32Array.of(0),
  ptStride: 1,
  logitRows: Int32Array.of(1),
});
process.stdout.write("engine ready\n");
