import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ServeProcess, startServe } from "./serve-process.ts";

/**
 * `continuum serve` as a real process under inputs that used to stall or
 * kill it: a runaway Datalog query, prompts whose tokenizing took seconds on
 * the event loop, inputs over the length limits. Through all of it /health
 * must keep answering; the bounds on what it may take are generous (this is
 * not a benchmark), far under the seconds each of these blocked it before.
 */

const HEALTH_BOUND_MS = 2_000;

/** About `bytes` of text in words that rarely repeat (a tokenizer's word cache cannot shortcut it), from a seed. */
function randomWords(bytes: number, seed: number): string {
  let x = seed >>> 0;
  const parts: string[] = [];
  let n = 0;
  while (n < bytes) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    const len = 3 + (x % 9);
    let w = "";
    for (let i = 0; i < len; i++) {
      x = (Math.imul(x, 1103515245) + 12345) >>> 0;
      w += String.fromCharCode(97 + ((x >>> 16) % 26));
    }
    parts.push(w);
    n += len + 1;
  }
  return parts.join(" ");
}
const TOKENS = { "tok-a": "tenant-a", "tok-b": "tenant-b", "tok-ops": "ops" };
let server: ServeProcess;

beforeAll(async () => {
  server = await startServe({
    CONTINUUM_AUTH_TOKENS: JSON.stringify(TOKENS),
    CONTINUUM_AUTH_ADMIN_TENANTS: "ops",
    CONTINUUM_CONTROLLER_CATALOG_QUERY_TIMEOUT_MS: "2000",
  });
});
afterAll(async () => {
  await server?.stop();
});

async function post(path: string, body: unknown, token = "tok-a", signal?: AbortSignal) {
  const r = await fetch(`${server.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
    body: typeof body === "string" ? body : JSON.stringify(body),
    signal: signal ?? AbortSignal.timeout(200_000),
  });
  const text = await r.text();
  let json: { error?: { message: string; param: string | null; code: string | null }; result?: unknown } = {};
  try {
    json = JSON.parse(text);
  } catch {
    // not JSON
  }
  return { status: r.status, json, text };
}

/**
 * Polls /health every 50 ms while `work` runs; resolves with the work's
 * result and the slowest /health answer seen (a failed or late probe counts
 * as the time it took to give up).
 */
async function healthDuring<T>(
  work: Promise<T>,
): Promise<{ result: T; worstMs: number; probes: number; workMs: number }> {
  const t0 = performance.now();
  let done = false;
  let worstMs = 0;
  let probes = 0;
  const prober = (async () => {
    while (!done) {
      const t0 = performance.now();
      try {
        const r = await fetch(`${server.url}/health`, { signal: AbortSignal.timeout(20_000) });
        if (r.status !== 200) worstMs = Number.POSITIVE_INFINITY;
      } catch {
        worstMs = Number.POSITIVE_INFINITY;
      }
      worstMs = Math.max(worstMs, performance.now() - t0);
      probes++;
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  try {
    const result = await work;
    return { result, worstMs, probes, workMs: performance.now() - t0 };
  } finally {
    done = true;
    await prober;
  }
}

describe("the event loop stays free", () => {
  it("a runaway recursive catalog query is cancelled at its time budget, naming it, while /health answers", async () => {
    const { result, worstMs, probes } = await healthDuring(
      post(
        "/v1/catalog/query",
        {
          query: "[:find ?x ?z :in $ % :where (r ?x ?z)]",
          rules: "[[(r ?x ?z) (r ?x ?y) (r ?y ?z)]]",
        },
        "tok-ops",
      ),
    );
    expect(result.status).toBe(400);
    expect(result.json.error?.code).toBe("query_time_budget");
    expect(result.json.error?.message).toMatch(/controller\.catalogQuery\.timeoutMs/);
    expect(probes).toBeGreaterThan(3);
    expect(worstMs).toBeLessThan(HEALTH_BOUND_MS);
    // The engine restarts its thread: the next query is answered.
    const after = await post(
      "/v1/catalog/query",
      { query: "[:find (count ?m) . :where [?m :model/name]]" },
      "tok-ops",
    );
    expect(after.status).toBe(200);
    expect(after.json.result).toBe(1);
  });

  // The work takes seconds on any machine (~1 µs per byte unloaded, several times that under load);
  // /health must answer in a small part of it, where before it waited for all of it.
  it("a 2 MB text prompt is tokenized off the event loop: /health answers throughout, then its 400", async () => {
    const prompt = randomWords(2_000_000, 1);
    const { result, worstMs, workMs } = await healthDuring(
      post("/v1/completions", { model: "tiny", prompt, max_tokens: 1 }),
    );
    expect(result.status).toBe(400);
    expect(result.json.error?.code).toBe("context_length_exceeded");
    expect(worstMs).toBeLessThan(Math.min(HEALTH_BOUND_MS, workMs / 2));
  }, 240_000);

  it("64 prompts of 48 KB are tokenized off the event loop", async () => {
    const prompts = Array.from({ length: 64 }, (_, i) => randomWords(48_000, 100 + i));
    const { result, worstMs, workMs } = await healthDuring(
      post("/v1/completions", { model: "tiny", prompt: prompts, max_tokens: 1 }),
    );
    expect(result.status).toBe(400);
    expect(result.json.error?.code).toBe("context_length_exceeded");
    expect(worstMs).toBeLessThan(Math.min(HEALTH_BOUND_MS, workMs / 2));
  }, 240_000);
});

describe("length limits come before any tokenizing", () => {
  it("refuses a prompt over the byte limit with a 400 naming the limit", async () => {
    const prompt = "x".repeat(5 * 1024 * 1024);
    const t0 = performance.now();
    const r = await post("/v1/completions", { model: "tiny", prompt, max_tokens: 1 });
    expect(r.status).toBe(400);
    expect(r.json.error?.message).toMatch(/controller\.limits\.maxPromptBytes/);
    expect(r.json.error?.code).toBe("prompt_too_large");
    expect(performance.now() - t0).toBeLessThan(5_000);
  });

  it("refuses 120,000 chat messages with a 400 naming the limit", async () => {
    const messages = Array.from({ length: 120_000 }, (_, i) => ({
      role: i % 2 ? "assistant" : "user",
      content: "hi",
    }));
    const { result, worstMs } = await healthDuring(
      post("/v1/chat/completions", { model: "tiny", messages, max_tokens: 1 }),
    );
    expect(result.status).toBe(400);
    expect(result.json.error?.message).toMatch(/controller\.limits\.maxMessages/);
    expect(result.json.error?.param).toBe("messages");
    expect(worstMs).toBeLessThan(HEALTH_BOUND_MS);
  });
});

describe("catalog queries are scoped to the caller", () => {
  it("a tenant sees no worker, peer address or replica; an admin does", async () => {
    const tenantView = await post(
      "/v1/catalog/query",
      { query: "[:find ?w ?a :where [?w :worker/address ?a]]" },
      "tok-a",
    );
    expect(tenantView.status).toBe(200);
    expect(tenantView.json.result).toEqual([]);
    const admin = await post(
      "/v1/catalog/query",
      { query: "[:find ?a . :where [?w :worker/address ?a]]" },
      "tok-ops",
    );
    expect(admin.status).toBe(200);
    expect(typeof admin.json.result).toBe("string");
    const args = await post(
      "/v1/catalog/query",
      { query: "[:find ?w :where [?w :worker/id]]", args: [1] },
      "tok-ops",
    );
    expect(args.status).toBe(400);
    expect(args.json.error?.param).toBe("args");
  });
});

describe("stopping", () => {
  it("SIGTERM stops the server while a runaway query runs", async () => {
    const pending = post(
      "/v1/catalog/query",
      { query: "[:find ?x ?z :in $ % :where (r ?x ?z)]", rules: "[[(r ?x ?z) (r ?x ?y) (r ?y ?z)]]" },
      "tok-ops",
    ).catch(() => null);
    await new Promise((r) => setTimeout(r, 500));
    const exited = new Promise<number | null>((resolve) =>
      server.child.once("exit", (code) => resolve(code)),
    );
    server.child.kill("SIGTERM");
    const code = await Promise.race([
      exited,
      new Promise<"hung">((r) => setTimeout(() => r("hung"), 15_000)),
    ]);
    expect(code).toBe(0);
    await pending;
  });
});
