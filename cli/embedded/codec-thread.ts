import { parentPort, workerData } from "node:worker_threads";
import type { CodecJob } from "../../controller/api/prompts.ts";
import { ModelTokenizer } from "../../worker/model/tokenizer.ts";
import { codecOf } from "./codec.ts";

/**
 * A tokenizer thread (controller/api/thread-pool.ts's contract): loads the
 * model's tokenizer from its directory and builds the same codec the
 * service uses (codecOf), then answers codec jobs.
 */
export interface CodecThreadData {
  readonly modelDir: string;
  readonly eosTokenIds: readonly number[];
  readonly vocabSize: number;
}

const data = (workerData as { data: CodecThreadData }).data;
const codec = codecOf(await ModelTokenizer.load(data.modelDir), data.eosTokenIds, data.vocabSize);
const port = parentPort!;

port.on("message", ({ id, job }: { id: number; job: CodecJob }) => {
  try {
    const f = codec[job.method] as (...args: unknown[]) => number[];
    port.postMessage({ id, ok: job.argsList.map((args) => f(...args)) });
  } catch (err) {
    port.postMessage({ id, error: err instanceof Error ? err.message : String(err) });
  }
});
