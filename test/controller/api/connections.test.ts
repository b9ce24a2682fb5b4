import type { Socket } from "node:net";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { tinyModel } from "../../worker/runtime/fixture.ts";
import {
  type ApiHarness,
  closedWithin,
  eventually,
  openSocket,
  rawRequest,
  seriesValue,
  startApi,
} from "./harness.ts";

/**
 * The HTTP server's connection bounds over real TCP sockets: a connection
 * that sends nothing, one that drips its headers, one kept alive after a
 * response, and more connections than the cap. Bounds are set small so the
 * tests take seconds; what is asserted is the behaviour, with generous slack
 * for a loaded machine.
 */

let model: LoadedModel;
let cleanup: () => Promise<void>;
let api: ApiHarness;
const sockets: Socket[] = [];

const HEADERS_MS = 400;
const IDLE_MS = 400;
const MAX_CONNECTIONS = 6;

beforeAll(async () => {
  ({ model, cleanup } = await tinyModel());
  api = await startApi(model, {
    controller: {
      http: {
        headersTimeoutMs: HEADERS_MS,
        requestTimeoutMs: 2_000,
        idleTimeoutMs: IDLE_MS,
        maxConnections: MAX_CONNECTIONS,
      },
    },
  });
});
afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy();
  // Until the server has seen them close (only the scrape's own connection open), so tests do not share the cap.
  const deadline = Date.now() + 5_000;
  for (;;) {
    const r = await rawRequest(api.url, { path: "/metrics", headers: { connection: "close" } }).catch(
      () => null,
    );
    if (r?.status === 200 && seriesValue(r.body, "continuum_http_connections", { state: "open" }) === 1)
      break;
    if (Date.now() > deadline) throw new Error("connections of the last test are still open");
    await new Promise((res) => setTimeout(res, 20));
  }
});
afterAll(async () => {
  await api?.close();
  await cleanup?.();
});

async function open(): Promise<Socket> {
  const s = await openSocket(api.port);
  sockets.push(s);
  s.on("error", () => undefined);
  return s;
}

/** Everything the server sends on `s` until it closes (or `ms` pass). */
function received(s: Socket, ms: number): Promise<string> {
  return new Promise((resolve) => {
    let text = "";
    s.on("data", (d) => {
      text += d.toString();
    });
    const done = () => resolve(text);
    s.once("close", done);
    setTimeout(done, ms);
  });
}

describe("HTTP connection bounds", () => {
  it("closes a connection that sends nothing within the headers timeout", async () => {
    const silent = await open();
    expect(await closedWithin(silent, HEADERS_MS + 5_000)).toBe(true);
  });

  it("answers headers that drip in slower than the headers timeout with 408 and closes", async () => {
    const s = await open();
    const text = received(s, 10_000);
    s.write("GET /health HTTP/1.1\r\nHost: x\r\n");
    const drip = setInterval(() => {
      if (!s.destroyed) s.write("X-Slow: 1\r\n");
    }, 100);
    const got = await text;
    clearInterval(drip);
    expect(s.destroyed || s.readyState !== "open").toBe(true);
    expect(got === "" || got.startsWith("HTTP/1.1 408")).toBe(true);
  });

  it("closes a kept-alive connection after the idle timeout", async () => {
    const s = await open();
    const text = received(s, IDLE_MS + 5_000);
    s.write("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    const got = await text;
    expect(got).toMatch(/^HTTP\/1\.1 200/);
    expect(await closedWithin(s, 0)).toBe(true);
  });

  it("sheds the longest-idle connection when the cap is reached, and logs it", async () => {
    const idle: Socket[] = [];
    for (let i = 0; i < MAX_CONNECTIONS; i++) idle.push(await open());
    const oldest = closedWithin(idle[0]!, 2_000);
    const r = await rawRequest(api.url, { path: "/health" });
    expect(r.status).toBe(200);
    expect(await oldest).toBe(true);
    expect(idle.slice(1).every((s) => !s.destroyed)).toBe(true);
    expect(await eventually(() => api.logs.some((l) => l.event === "http.connection_shed"), 2_000)).toBe(
      true,
    );
  });

  it("refuses a connection over the cap with 503 and Retry-After when none is idle", async () => {
    // Each of these has sent its headers and is still sending its body: a request in flight.
    const busy: Socket[] = [];
    for (let i = 0; i < MAX_CONNECTIONS; i++) {
      const s = await open();
      s.write(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
      );
      busy.push(s);
    }
    await new Promise((r) => setTimeout(r, 100));
    const extra = await open();
    const text = await received(extra, 5_000);
    expect(text).toMatch(/^HTTP\/1\.1 503/);
    expect(text).toMatch(/retry-after: \d+/i);
    expect(busy.every((s) => !s.destroyed)).toBe(true);
  });

  it("bounds the whole request: a body that never ends gets 408 after the request timeout", async () => {
    const s = await open();
    const text = received(s, 10_000);
    s.write(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    );
    const got = await text;
    expect(got).toMatch(/^HTTP\/1\.1 408/);
  });
});
