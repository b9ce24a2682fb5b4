import { request as httpRequest } from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { tinyModel } from "../../worker/runtime/fixture.ts";
import { type ApiHarness, eventually, postJson, rawRequest, seriesValue, startApi } from "./harness.ts";

/**
 * The HTTP contract of the front door, over real sockets against the real
 * embedded service on the tiny model: methods and routes, content types,
 * request ids, CORS, overload answers, cancellations, and what /metrics
 * counts.
 */

let model: LoadedModel;
let cleanup: () => Promise<void>;
let api: ApiHarness;

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
  api = await startApi(model);
});
afterAll(async () => {
  await api?.close();
  await cleanup?.();
});

const completion = { model: "tiny", prompt: "Once upon a time", max_tokens: 4, temperature: 0 };

/** Nested arrays `depth` deep around 1 (JSON text, so building it costs no recursion). */
const deep = (depth: number) => `${"[".repeat(depth)}1${"]".repeat(depth)}`;

describe("methods and routes", () => {
  it("answers a wrong method on a known path with 405 and Allow, an unknown path with 404", async () => {
    const get = await rawRequest(api.url, { path: "/v1/completions" });
    expect(get.status).toBe(405);
    expect(get.headers.allow).toBe("POST");
    expect(JSON.parse(get.body).error.code).toBe("method_not_allowed");
    const del = await rawRequest(api.url, { method: "DELETE", path: "/health" });
    expect(del.status).toBe(405);
    expect(del.headers.allow).toBe("GET, HEAD");
    const none = await rawRequest(api.url, { path: "/v1/nothing?x=1" });
    expect(none.status).toBe(404);
    expect(JSON.parse(none.body).error.code).toBe("not_found");
  });

  it("answers HEAD /health with 200 and no body", async () => {
    const r = await rawRequest(api.url, { method: "HEAD", path: "/health" });
    expect(r.status).toBe(200);
    expect(r.body).toBe("");
  });
});

describe("request bodies", () => {
  it("refuses a body that is not declared JSON with 415, before reading it as JSON", async () => {
    const plain = await rawRequest(api.url, {
      method: "POST",
      path: "/v1/completions",
      headers: { "content-type": "text/plain" },
      body: JSON.stringify(completion),
    });
    expect(plain.status).toBe(415);
    expect(JSON.parse(plain.body).error.message).toMatch(/content-type/i);
    const none = await rawRequest(api.url, {
      method: "POST",
      path: "/v1/completions",
      body: JSON.stringify(completion),
    });
    expect(none.status).toBe(415);
    const withCharset = await postJson(api.url, "/v1/completions", completion, {
      "content-type": "application/json; charset=utf-8",
    });
    expect(withCharset.status).toBe(200);
  });

  it("refuses invalid UTF-8 with a 400 that says so", async () => {
    const r = await rawRequest(api.url, {
      method: "POST",
      path: "/v1/completions",
      headers: { "content-type": "application/json" },
      body: Buffer.concat([
        Buffer.from('{"model":"tiny","prompt":"'),
        Buffer.from([0xff, 0xfe, 0x80]),
        Buffer.from('"}'),
      ]),
    });
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body).error.message).toMatch(/UTF-8/);
  });

  it("answers a deeply nested value in any field with a 400 naming the field, never a 500", async () => {
    for (const field of ["max_tokens", "stream", "temperature", "prompt", "stop", "n"]) {
      const text = `{"model":"tiny","prompt":"x","${field}":${deep(200_000)}}`.replace(
        '"prompt":"x","prompt"',
        '"prompt"',
      );
      const r = await postJson(api.url, "/v1/completions", text);
      expect(r.status, field).toBe(400);
      expect(r.json.error?.param, field).toBe(field);
      expect(r.body.length, field).toBeLessThan(2_000);
    }
    const chat = await postJson(
      api.url,
      "/v1/chat/completions",
      `{"model":"tiny","messages":${deep(200_000)}}`,
    );
    expect(chat.status).toBe(400);
  });
});

describe("request ids", () => {
  it("echoes a valid X-Request-Id on every response and carries it into the logs", async () => {
    const ok = await postJson(api.url, "/v1/completions", completion, { "x-request-id": "client-42.abc" });
    expect(ok.status).toBe(200);
    expect(ok.headers["x-request-id"]).toBe("client-42.abc");
    expect(String(ok.json.id)).toContain("client-42.abc");
    const logged = api.logs.filter((l) => l.xRequestId === "client-42.abc").map((l) => l.event);
    expect(logged).toContain("request.admitted");
    expect(logged).toContain("request.done");
    const missing = await rawRequest(api.url, { path: "/nope", headers: { "x-request-id": "err-7" } });
    expect(missing.status).toBe(404);
    expect(missing.headers["x-request-id"]).toBe("err-7");
    const health = await rawRequest(api.url, { path: "/health", headers: { "x-request-id": "h-1" } });
    expect(health.headers["x-request-id"]).toBe("h-1");
  });

  it("generates one when absent and refuses an invalid one with a 400 naming the header", async () => {
    const a = await rawRequest(api.url, { path: "/health" });
    const b = await rawRequest(api.url, { path: "/health" });
    expect(a.headers["x-request-id"]).toMatch(/^[0-9a-f-]{36}$/);
    expect(b.headers["x-request-id"]).not.toBe(a.headers["x-request-id"]);
    const long = await postJson(api.url, "/v1/completions", completion, { "x-request-id": "x".repeat(500) });
    expect(long.status).toBe(400);
    expect(long.json.error?.message).toMatch(/X-Request-Id/);
    expect(String(long.headers["x-request-id"]).length).toBeLessThanOrEqual(96);
    const spaced = await postJson(api.url, "/v1/completions", completion, { "x-request-id": "has space" });
    expect(spaced.status).toBe(400);
  });
});

describe("CORS", () => {
  it("is off by default: no CORS headers, and a preflight is a wrong method", async () => {
    const r = await rawRequest(api.url, { path: "/health", headers: { origin: "http://evil.example" } });
    expect(r.status).toBe(200);
    expect(r.headers["access-control-allow-origin"]).toBeUndefined();
    const pre = await rawRequest(api.url, {
      method: "OPTIONS",
      path: "/v1/completions",
      headers: { origin: "http://evil.example", "access-control-request-method": "POST" },
    });
    expect(pre.status).toBe(405);
    expect(pre.headers["access-control-allow-origin"]).toBeUndefined();
  });
});

/** Starts a stream and resolves once its first data frame arrived; `abort` closes the connection. */
function openStream(url: string, body: unknown): Promise<{ abort: () => void; firstFrame: string }> {
  return new Promise((resolve, reject) => {
    const u = new URL("/v1/completions", url);
    const req = httpRequest(
      {
        host: u.hostname,
        port: u.port,
        path: u.pathname,
        method: "POST",
        headers: { "content-type": "application/json" },
      },
      (res) => {
        res.once("data", (c: Buffer) => resolve({ abort: () => req.destroy(), firstFrame: c.toString() }));
        res.on("error", () => undefined);
      },
    );
    req.on("error", (e) => {
      if ((e as NodeJS.ErrnoException).code !== "ECONNRESET") reject(e);
    });
    req.end(JSON.stringify(body));
  });
}

describe("cancellations", () => {
  it("logs and counts an aborted stream as cancelled, not as done or 200", async () => {
    const before = await (await fetch(`${api.url}/metrics`)).text();
    const cancelledBefore =
      seriesValue(before, "continuum_http_requests_total", {
        route: "POST /v1/completions",
        status: "499",
      }) ?? 0;
    const s = await openStream(api.url, { ...completion, max_tokens: 1500, stream: true });
    expect(s.firstFrame).toMatch(/^data: /);
    const admitted = api.logs.filter((l) => l.event === "request.admitted").at(-1)!;
    s.abort();
    const id = admitted.requestId;
    expect(
      await eventually(
        () => api.logs.some((l) => l.event === "request.cancelled" && l.requestId === id),
        10_000,
      ),
    ).toBe(true);
    expect(api.logs.some((l) => l.event === "request.done" && l.requestId === id)).toBe(false);
    const after = await (await fetch(`${api.url}/metrics`)).text();
    expect(
      seriesValue(after, "continuum_http_requests_total", { route: "POST /v1/completions", status: "499" }),
    ).toBe(cancelledBefore + 1);
  });

  it("logs an aborted non-streaming request as cancelled", async () => {
    const ac = new AbortController();
    const pending = fetch(`${api.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...completion, max_tokens: 1500 }),
      signal: ac.signal,
    }).catch(() => undefined);
    const n = api.logs.length;
    expect(
      await eventually(() => api.logs.slice(n).some((l) => l.event === "request.admitted"), 10_000),
    ).toBe(true);
    const id = api.logs.slice(n).find((l) => l.event === "request.admitted")!.requestId;
    ac.abort();
    await pending;
    expect(
      await eventually(
        () => api.logs.some((l) => l.event === "request.cancelled" && l.requestId === id),
        10_000,
      ),
    ).toBe(true);
  });
});

describe("/metrics route labels", () => {
  it("keep a fixed set: 300 distinct unknown paths add no series and silence none", async () => {
    for (let i = 0; i < 300; i++) {
      const r = await rawRequest(api.url, { path: `/probe/${i}?q=${i}` });
      expect(r.status).toBe(404);
    }
    const ok = await postJson(api.url, "/v1/chat/completions", {
      model: "tiny",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 2,
    });
    expect(ok.status).toBe(200);
    const text = await (await fetch(`${api.url}/metrics`)).text();
    const routes = new Set(
      [...text.matchAll(/^continuum_http_requests_total\{([^}]*)\}/gm)].map(
        (m) => /route="([^"]*)"/.exec(m[1]!)![1]!,
      ),
    );
    expect([...routes].filter((r) => r.includes("/probe") || r.includes("?"))).toEqual([]);
    expect(
      seriesValue(text, "continuum_http_requests_total", { route: "unmatched", status: "404" }),
    ).toBeGreaterThanOrEqual(300);
    expect(
      seriesValue(text, "continuum_http_requests_total", {
        route: "POST /v1/chat/completions",
        status: "200",
      }),
    ).toBeGreaterThanOrEqual(1);
  });
});

describe("overload", () => {
  let busy: ApiHarness;
  beforeAll(async () => {
    busy = await startApi(model, {}, { maxQueued: 1, maxBatchSeqs: 1 });
  });
  afterAll(async () => {
    await busy?.close();
  });

  it("answers 429 with Retry-After and OpenAI's rate-limit type", async () => {
    const s = await openStream(busy.url, { ...completion, max_tokens: 1500, stream: true });
    const r = await postJson(busy.url, "/v1/completions", completion);
    s.abort();
    expect(r.status).toBe(429);
    expect(Number(r.headers["retry-after"])).toBeGreaterThanOrEqual(1);
    expect(r.json.error?.type).toBe("rate_limit_exceeded");
    expect(r.json.error?.code).toBe("rate_limit_exceeded");
  });
});

describe("CORS when configured", () => {
  let cors: ApiHarness;
  beforeAll(async () => {
    cors = await startApi(model, { controller: { corsOrigins: ["http://app.example"] } });
  });
  afterAll(async () => {
    await cors?.close();
  });

  it("allows a listed origin on responses and preflights, and no other", async () => {
    const ok = await postJson(cors.url, "/v1/completions", completion, { origin: "http://app.example" });
    expect(ok.status).toBe(200);
    expect(ok.headers["access-control-allow-origin"]).toBe("http://app.example");
    expect(String(ok.headers["access-control-expose-headers"])).toMatch(/X-Request-Id/);
    expect(ok.headers.vary).toBe("Origin");
    const other = await rawRequest(cors.url, { path: "/health", headers: { origin: "http://evil.example" } });
    expect(other.headers["access-control-allow-origin"]).toBeUndefined();
    const pre = await rawRequest(cors.url, {
      method: "OPTIONS",
      path: "/v1/chat/completions",
      headers: {
        origin: "http://app.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os",
      },
    });
    expect(pre.status).toBe(204);
    expect(pre.headers["access-control-allow-origin"]).toBe("http://app.example");
    expect(pre.headers["access-control-allow-methods"]).toMatch(/POST/);
    expect(pre.headers["access-control-allow-headers"]).toBe("authorization, content-type, x-stainless-os");
    const denied = await rawRequest(cors.url, {
      method: "OPTIONS",
      path: "/v1/completions",
      headers: { origin: "http://evil.example", "access-control-request-method": "POST" },
    });
    expect(denied.status).toBe(403);
    expect(denied.headers["access-control-allow-origin"]).toBeUndefined();
  });
});

describe("/metrics and operator endpoints behind auth", () => {
  let locked: ApiHarness;
  beforeAll(async () => {
    locked = await startApi(model, {
      auth: {
        tokens: { "tok-a": "tenant-a", "tok-root": "ops" },
        adminTenants: ["ops"],
        metricsToken: "scrape-1",
      },
    });
  });
  afterAll(async () => {
    await locked?.close();
  });

  it("needs the scrape token or an admin tenant's token; /health stays open", async () => {
    expect((await rawRequest(locked.url, { path: "/health" })).status).toBe(200);
    expect((await rawRequest(locked.url, { path: "/metrics" })).status).toBe(401);
    const tenant = await rawRequest(locked.url, {
      path: "/metrics",
      headers: { authorization: "Bearer tok-a" },
    });
    expect(tenant.status).toBe(403);
    const scrape = await rawRequest(locked.url, {
      path: "/metrics",
      headers: { authorization: "Bearer scrape-1" },
    });
    expect(scrape.status).toBe(200);
    expect(scrape.body).toMatch(/^continuum_http_requests_total\{/m);
    const admin = await rawRequest(locked.url, {
      path: "/metrics",
      headers: { authorization: "Bearer tok-root" },
    });
    expect(admin.status).toBe(200);
    // the scrape token is no API token
    const r = await postJson(locked.url, "/v1/completions", completion, { authorization: "Bearer scrape-1" });
    expect(r.status).toBe(401);
  });
});
