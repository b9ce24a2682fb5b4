import { ApiError, badRequest, unavailable } from "./errors.ts";
import type { ChatRequest, CompletionRequest } from "./request.ts";
import type { EncodeOptions, TextCodec } from "./service.ts";
import { JobError, PoolFullError, ThreadFailedError, type ThreadPool } from "./thread-pool.ts";

/**
 * A request's prompts as token ids. Small inputs are tokenized inline; any
 * request with more than INLINE_BYTES of prompt text is tokenized on the
 * tokenizer threads, so the event loop never spends more than about a
 * millisecond on one request's BPE. A chat request's template is rendered
 * here first (Jinja over the messages is linear and far cheaper than the
 * BPE of its result); its text is what the threads encode. The threads
 * encode as the service's codec does (cli/embedded/codec.ts's encodeText),
 * so the ids are the same either way.
 */

/** Prompt text tokenized inline at most (bytes); ~1 µs per byte with the byte-level BPE here. */
export const INLINE_BYTES = 4096;

/** A job for a tokenizer thread: these texts encoded with these options. */
export interface CodecJob {
  readonly texts: readonly string[];
  readonly opts: EncodeOptions;
}
export type CodecThreads = ThreadPool<CodecJob, number[][]>;

export interface Prompts {
  readonly ids: number[][];
  /** A chat request's rendered template text (null for completions). */
  readonly rendered: string | null;
}

export async function promptIds(
  parsed: CompletionRequest | ChatRequest,
  codec: TextCodec,
  threads: CodecThreads | undefined,
  textBytes: number,
): Promise<Prompts> {
  if (parsed.kind === "chat") {
    const rendered = codec.renderChat(parsed.chat.prompt);
    const ids = await encodeOne(codec, threads, rendered, { addSpecialTokens: parsed.chat.addSpecialTokens });
    return { ids: [ids], rendered };
  }
  const opts = { addSpecialTokens: parsed.addSpecialTokens };
  const offload = threads !== undefined && textBytes > INLINE_BYTES;
  const texts = parsed.prompts.flatMap((p) => (p.kind === "text" ? [p.text] : []));
  const encoded =
    offload && texts.length > 0
      ? (
          await Promise.all(spread(texts, threads.threads).map((part) => run(threads, { texts: part, opts })))
        ).flat()
      : texts.map((t) => tokenize(() => codec.encode(t, opts)));
  let next = 0;
  return { ids: parsed.prompts.map((p) => (p.kind === "text" ? encoded[next++]! : p.ids)), rendered: null };
}

/** One text's ids: inline when small, else on a tokenizer thread. */
export async function encodeOne(
  codec: TextCodec,
  threads: CodecThreads | undefined,
  text: string,
  opts: EncodeOptions,
): Promise<number[]> {
  if (threads === undefined || Buffer.byteLength(text) <= INLINE_BYTES)
    return tokenize(() => codec.encode(text, opts));
  return (await run(threads, { texts: [text], opts }))[0]!;
}

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
