import { Effect } from "effect";
import { afterEach, describe, expect, it } from "vitest";
import { webViewResource } from "../../../cli/web-view.ts";
import { ApiServer } from "../../../controller/api/server.ts";
import type { InferenceService } from "../../../controller/api/service.ts";
import { defaultWebViewOptions, WebView } from "../../../controller/ui/web-view.ts";
import { resolveConfig } from "../../../schema/config-load.ts";

/**
 * The web view's HTTP surface on a real API server: pages are public, the
 * event stream is behind the API's tokens and bounded in clients, nothing
 * but GET/HEAD is served, and controller.ui false mounts nothing. (The page
 * itself is driven in a browser by test/e2e/operations.test.ts.)
 */

// Only the gauges are read by the server; nothing here generates.
const service: InferenceService = {
  models: () => [],
  generate: () => {
    throw new Error("not used");
  },
  gauges: () => ({ pagesFree: 1, pagesTotal: 2, queueDepth: 0, catalogLag: 0, cacheTokensBySource: {} }),
};

const opened: { server: ApiServer; view?: WebView }[] = [];
afterEach(async () => {
  for (const o of opened.splice(0)) {
    o.view?.close();
    await o.server.close();
  }
});

async function start(maxClients = 2): Promise<string> {
  const server = new ApiServer(service, {
    host: "127.0.0.1",
    port: 0,
    auth: { tokens: { secret: "ops" }, adminTenants: ["ops"], metricsToken: "" },
  });
  const view = new WebView(
    {
      mode: "embedded",
      workers: () => [],
      catalog: () => ({ offset: 3, lag: 0 }),
      decisions: null,
      ttft: server.metrics.histogram("continuum_ttft_seconds"),
      itl: server.metrics.histogram("continuum_inter_token_seconds"),
    },
    { ...defaultWebViewOptions, maxClients, tickMs: 50 },
  );
  view.start();
  server.mount(view);
  opened.push({ server, view });
  return `http://127.0.0.1:${await server.start()}`;
}

const auth = { authorization: "Bearer secret" };

describe("the web view's HTTP surface", () => {
  it("serves its page and vendored chart library without a token, with a strict content policy", async () => {
    const base = await start();
    const page = await fetch(`${base}/ui`);
    expect(page.status).toBe(200);
    expect(page.headers.get("content-security-policy")).toContain("script-src 'self'");
    expect(await page.text()).toContain('<script src="/ui/app.js" type="module">');
    const lib = await fetch(`${base}/ui/vendor/uPlot.iife.min.js`);
    expect([lib.status, lib.headers.get("content-type")]).toEqual([200, "text/javascript; charset=utf-8"]);
    expect((await fetch(`${base}/ui/nope.js`)).status).toBe(404);
    const post = await fetch(`${base}/ui/events`, { method: "POST", headers: auth });
    expect(post.status).toBe(405);
  });

  it("streams snapshots only with a token, and refuses one stream more than its bound", async () => {
    const base = await start(2);
    expect((await fetch(`${base}/ui/events`)).status).toBe(401);
    const a = new AbortController();
    const b = new AbortController();
    const first = await fetch(`${base}/ui/events`, { headers: auth, signal: a.signal });
    await fetch(`${base}/ui/events`, { headers: auth, signal: b.signal });
    const reader = first.body!.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    while (!text.includes("\n\n")) text += (await reader.read()).value;
    const frame = JSON.parse(text.slice(text.indexOf("data: ") + 6, text.indexOf("\n\n")));
    expect(frame).toMatchObject({ v: 1, mode: "embedded", catalog: { offset: 3, lag: 0 }, decisions: null });
    const third = await fetch(`${base}/ui/events`, { headers: auth });
    expect(third.status).toBe(503);
    expect(((await third.json()) as { error: { message: string } }).error.message).toMatch(/2 event streams/);
    a.abort();
    b.abort();
  });

  it("is not mounted when controller.ui is false", async () => {
    const server = new ApiServer(service, { host: "127.0.0.1", port: 0 });
    opened.push({ server });
    const view = await Effect.runPromise(
      Effect.scoped(
        webViewResource(resolveConfig({ controller: { ui: false } }, {}), server, {
          mode: "embedded",
          workers: () => [],
          catalog: () => null,
          decisions: null,
        }),
      ),
    );
    expect(view).toBeNull();
    const base = `http://127.0.0.1:${await server.start()}`;
    expect((await fetch(`${base}/ui`)).status).toBe(404);
  });
});
