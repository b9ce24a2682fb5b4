import { ApiError, badRequest, unavailable } from "./errors.ts";
import type { ChatRequest, CompletionRequest } from "./request.ts";
import type { TextCodec } from "./service.ts";
import { JobError, PoolFullError, ThreadFailedError, type ThreadPool } from "./thread-pool.ts";

/**
 * A request's prompts as token ids. Small inputs are tokenized inline; any
 * request with more than INLINE_BYTES of prompt text is tokenized (and its
 * chat template rendered) on the tokenizer threads, so the event loop never
 * spends more than about a millisecond on one request's text. The threads
 * run the same codec (cli/embedded/codec-thread.ts builds it the way the
 * service does), so the ids are the same either way.
 */

/** Prompt text tokenized inline at most (bytes); ~1 µs per byte with the byte-level BPE here. */
export const INLINE_BYTES = 4096;

/** A job for a tokenizer thread: one codec method applied to each argument list. */
export interface CodecJob {
  readonly method: "encode" | "chatPrompt";
  readonly argsList: readonly (readonly unknown[])[];
}
export type CodecThreads = ThreadPool<CodecJob, number[][]>;

export async function promptIds(
  parsed: CompletionRequest | ChatRequest,
  codec: TextCodec,
  threads: CodecThreads | undefined,
  textBytes: number,
): Promise<number[][]> {
  const offload = threads !== undefined && textBytes > INLINE_BYTES;
  if (parsed.kind === "chat") {
    if (!offload) return [tokenize(() => codec.chatPrompt(parsed.messages))];
    return run(threads, { method: "chatPrompt", argsList: [[parsed.messages]] });
  }
  const texts = parsed.prompts.flatMap((p) => (p.kind === "text" ? [p.text] : []));
  const encoded =
    offload && texts.length > 0
      ? (
          await Promise.all(spread(texts, threads.threads).map((part) => run(threads, encodeJob(part))))
        ).flat()
      : texts.map((t) => tokenize(() => codec.encode(t)));
  let next = 0;
  return parsed.prompts.map((p) => (p.kind === "text" ? encoded[next++]! : p.ids));
}

const encodeJob = (texts: readonly string[]): CodecJob => ({
  method: "encode",
  argsList: texts.map((t) => [t]),
});

/**
 * Consecutive runs of `texts`, at most `parts` of them, of about equal bytes:
 * one job per thread, so a request's prompts tokenize in parallel and its
 * answers come back in order.
 */
export function spread(texts: readonly string[], parts: number): string[][] {
  const total = texts.reduce((a, t) => a + t.length, 0);
  const target = total / Math.max(1, Math.min(parts, texts.length));
  const out: string[][] = [[]];
  let size = 0;
  for (const t of texts) {
    if (size >= target && out.length < parts) {
      out.push([]);
      size = 0;
    }
    out[out.length - 1]!.push(t);
    size += t.length;
  }
  return out;
}

function tokenize(f: () => number[]): number[] {
  try {
    return f();
  } catch (err) {
    throw badRequest(`the prompt could not be tokenized: ${(err as Error).message.slice(0, 200)}`, "prompt");
  }
}

async function run(threads: CodecThreads, job: CodecJob): Promise<number[][]> {
  try {
    return await threads.run(job);
  } catch (err) {
    if (err instanceof PoolFullError) throw unavailable(`${err.message}; retry shortly`, 1, "tokenizer_busy");
    if (err instanceof JobError)
      throw badRequest(`the prompt could not be tokenized: ${err.message.slice(0, 200)}`, "prompt");
    if (err instanceof ThreadFailedError) throw unavailable(err.message, 1, "tokenizer_failed");
    throw err instanceof ApiError ? err : unavailable(String(err));
  }
}
