import { type ChildProcess, spawn } from "node:child_process";

/**
 * `continuum serve` as a child process driven over HTTP, for bench gpu: the
 * process is this one's own command (process.argv[1]: bin/continuum.mjs, or
 * the bundled file on a GPU machine) with `serve --port 0`, configured by
 * environment; requests carry token ids, so no tokenizer is involved.
 */
export interface ServeHandle {
  readonly url: string;
  readonly model: string;
  /** The process's stderr lines so far (its structured log). */
  readonly logs: string[];
  stop(): Promise<void>;
}

export async function startServe(env: Record<string, string>, readyTimeoutMs: number): Promise<ServeHandle> {
  const child = spawn(process.execPath, [process.argv[1]!, "serve", "--port", "0"], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "ignore", "pipe"],
  });
  const logs: string[] = [];
  let partial = "";
  let url: string | undefined;
  child.stderr!.on("data", (d) => {
    const lines = (partial + String(d)).split("\n");
    partial = lines.pop()!;
    for (const l of lines) {
      if (logs.length < 10_000) logs.push(l);
      if (url === undefined && l.includes('"serve.ready"')) url = (JSON.parse(l) as { url: string }).url;
    }
  });
  const deadline = Date.now() + readyTimeoutMs;
  while (url === undefined) {
    if (child.exitCode !== null)
      throw new Error(`serve exited with ${child.exitCode}:\n${logs.slice(-30).join("\n")}`);
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`serve not ready after ${readyTimeoutMs} ms:\n${logs.slice(-30).join("\n")}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  const models = (await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] };
  return { url, model: models.data[0]!.id, logs, stop: () => stopChild(child) };
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill("SIGINT");
  await Promise.race([exited, new Promise((r) => setTimeout(r, 30_000))]);
  if (child.exitCode === null) {
    child.kill("SIGKILL");
    await exited;
  }
}

export interface Completion {
  readonly ms: number;
  readonly completionTokens: number;
  readonly cachedTokens: number;
}

/** A non-streamed completion; `ms` is its wall time (with max_tokens 1: the time to the first token). */
export async function complete(
  s: ServeHandle,
  prompt: readonly number[],
  maxTokens: number,
): Promise<Completion> {
  const t0 = performance.now();
  const r = await fetch(`${s.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: s.model, prompt, max_tokens: maxTokens, temperature: 0 }),
  });
  const body = (await r.json()) as {
    usage?: { completion_tokens: number; prompt_tokens_details?: { cached_tokens: number } };
    error?: { message: string };
  };
  if (r.status !== 200) throw new Error(`completion: ${r.status} ${body.error?.message ?? ""}`);
  return {
    ms: performance.now() - t0,
    completionTokens: body.usage!.completion_tokens,
    cachedTokens: body.usage!.prompt_tokens_details?.cached_tokens ?? 0,
  };
}

/** A streamed completion: when its first and last text chunks arrived, and its completion tokens. */
export async function stream(
  s: ServeHandle,
  prompt: readonly number[],
  maxTokens: number,
): Promise<{ firstMs: number; lastMs: number; completionTokens: number }> {
  const r = await fetch(`${s.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: s.model,
      prompt,
      max_tokens: maxTokens,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    }),
  });
  if (r.status !== 200 || r.body === null) throw new Error(`stream: ${r.status} ${await r.text()}`);
  let first = Number.NaN;
  let last = Number.NaN;
  let tokens = 0;
  let buf = "";
  const decoder = new TextDecoder();
  for await (const part of r.body) {
    buf += decoder.decode(part as Uint8Array, { stream: true });
    for (let at = buf.indexOf("\n\n"); at >= 0; at = buf.indexOf("\n\n")) {
      const event = buf.slice(0, at);
      buf = buf.slice(at + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const chunk = JSON.parse(event.slice(6)) as {
        choices?: unknown[];
        usage?: { completion_tokens: number };
        error?: { message: string };
      };
      if (chunk.error) throw new Error(`stream: ${chunk.error.message}`);
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      if (chunk.choices && chunk.choices.length > 0) {
        const now = performance.now();
        if (Number.isNaN(first)) first = now;
        last = now;
      }
    }
  }
  return { firstMs: first, lastMs: last, completionTokens: tokens };
}

/**
 * Decode tokens/s of `batch` concurrent greedy streams: each stream's rate
 * is (completion tokens − 1) over the time from its first to its last chunk
 * (the decode steps after its first token); the streams run side by side,
 * so the batch's rate is their sum.
 */
export async function decodeRate(
  s: ServeHandle,
  prompts: readonly (readonly number[])[],
  maxTokens: number,
): Promise<{ tokPerS: number; tokens: number }> {
  const runs = await Promise.all(prompts.map((p) => stream(s, p, maxTokens)));
  let rate = 0;
  let tokens = 0;
  for (const r of runs) {
    tokens += r.completionTokens;
    const span = r.lastMs - r.firstMs;
    if (r.completionTokens > 1 && span > 0) rate += (r.completionTokens - 1) / (span / 1000);
  }
  return { tokPerS: rate, tokens };
}

/** Counter values of /metrics by full name with labels. */
export async function metrics(s: { readonly url: string }): Promise<Map<string, number>> {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

/** Waits (bounded) until the catalog holds `n` ready replicas in `tier`; false on timeout. */
export async function readyReplicas(
  s: { readonly url: string },
  tier: string,
  n: number,
  timeoutMs: number,
): Promise<boolean> {
  const query = `[:find (count ?r) . :where [?r :replica/tier "${tier}"] [?r :replica/state "ready"]]`;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await fetch(`${s.url}/v1/catalog/query`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ query }),
    });
    const got = Number(((await r.json()) as { result: unknown }).result ?? 0);
    if (got >= n) return true;
    if (Date.now() > deadline) return false;
    await new Promise((res) => setTimeout(res, 200));
  }
}
