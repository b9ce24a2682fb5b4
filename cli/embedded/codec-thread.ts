import { parentPort, workerData } from "node:worker_threads";
import type { CodecJob } from "../../controller/api/prompts.ts";
import { ModelTokenizer } from "../../worker/model/tokenizer.ts";
import { encodeText } from "./codec.ts";

/**
 * A tokenizer thread (controller/api/thread-pool.ts's contract): loads the
 * model's tokenizer from its directory and encodes as the service's codec
 * does (encodeText), answering encode jobs.
 */
export interface CodecThreadData {
  readonly modelDir: string;
}

const data = (workerData as { data: CodecThreadData }).data;
const tok = await ModelTokenizer.load(data.modelDir);
const port = parentPort!;

port.on("message", ({ id, job }: { id: number; job: CodecJob }) => {
  try {
    port.postMessage({ id, ok: job.texts.map((text) => encodeText(tok, text, job.opts)) });
  } catch (err) {
    port.postMessage({ id, error: err instanceof Error ? err.message : String(err) });
  }
});
