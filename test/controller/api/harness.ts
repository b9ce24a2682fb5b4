import { request as httpRequest } from "node:http";
import { connect, type Socket } from "node:net";
import { type ApiFrontDoor, openFrontDoor } from "../../../cli/api-server.ts";
import { EmbeddedService } from "../../../cli/embedded/service.ts";
import type { Config } from "../../../schema/config.ts";
import { resolveConfig } from "../../../schema/config-load.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import type { RuntimeOptions } from "../../../worker/runtime/runtime-api.ts";
import { startRuntime } from "../../worker/runtime/fixture.ts";

/**
 * The embedded default's front door in this process: the real HTTP server,
 * tokenizer threads and catalog query engine (cli/api-server.ts, as `serve`
 * composes them) over a real worker runtime on the tiny model, on a free
 * port. Every structured log line is kept for the test to read.
 */
export interface ApiHarness {
  readonly url: string;
  readonly port: number;
  readonly logs: Record<string, unknown>[];
  readonly frontDoor: ApiFrontDoor;
  close(): Promise<void>;
}

export async function startApi(
  model: LoadedModel,
  configFile: Record<string, unknown> = {},
  runtime: Partial<RuntimeOptions> = {},
): Promise<ApiHarness> {
  const config: Config = resolveConfig(configFile, {});
  const rt = await startRuntime(model, runtime);
  const service = new EmbeddedService(rt.runtime, model, "tiny");
  const logs: Record<string, unknown>[] = [];
  const frontDoor = openFrontDoor({
    config: { ...config, controller: { ...config.controller, host: "127.0.0.1", httpPort: 0 } },
    service,
    models: [{ id: "tiny", dir: model.dir }],
    log: {
      log: (level, event, fields) => logs.push({ level, event, ...fields }),
      child() {
        return this;
      },
    },
  });
  const port = await frontDoor.server.start();
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    logs,
    frontDoor,
    async close() {
      await frontDoor.close();
      await rt.close();
    },
  };
}

export interface RawResponse {
  readonly status: number;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body: string;
}

/** One request through node:http (any method, any header, raw bytes), read to the end. */
export function rawRequest(
  url: string,
  opts: { method?: string; path?: string; headers?: Record<string, string>; body?: string | Buffer } = {},
): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const u = new URL(opts.path ?? "/", url);
    const req = httpRequest(
      {
        host: u.hostname,
        port: u.port,
        path: u.pathname + u.search,
        method: opts.method ?? "GET",
        headers: opts.headers,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () =>
          resolve({
            status: res.statusCode ?? 0,
            headers: res.headers,
            body: Buffer.concat(chunks).toString("utf8"),
          }),
        );
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(opts.body);
  });
}

/** POSTs JSON; the body as parsed JSON (or the text when it is not JSON). */
export async function postJson(
  url: string,
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<
  RawResponse & {
    json: { error?: { message: string; type: string; param: string | null; code: string | null } } & Record<
      string,
      unknown
    >;
  }
> {
  const r = await rawRequest(url, {
    method: "POST",
    path,
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  let json: Record<string, unknown> = {};
  try {
    json = JSON.parse(r.body) as Record<string, unknown>;
  } catch {
    // not JSON: the caller looks at body
  }
  return { ...r, json: json as never };
}

/** A raw TCP connection to the server; resolves once connected. */
export function openSocket(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(port, "127.0.0.1", () => resolve(s));
    s.once("error", reject);
  });
}

/** Resolves with true once the socket is closed by the peer, or false after `ms`. */
export function closedWithin(s: Socket, ms: number): Promise<boolean> {
  if (s.destroyed || s.readyState === "closed") return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    s.once("close", () => {
      clearTimeout(timer);
      resolve(true);
    });
    s.on("error", () => undefined);
  });
}

/** Polls `cond` every 10 ms until it holds or `ms` pass; returns whether it held. */
export async function eventually(cond: () => boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 10));
  }
  return true;
}

/** One Prometheus series' value from /metrics text, or undefined. */
export function seriesValue(text: string, name: string, labels: Record<string, string>): number | undefined {
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const m = /^([^{ ]+)(?:\{(.*)\})? (.+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const got: Record<string, string> = {};
    for (const kv of (m[2] ?? "").matchAll(/([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"/g)) got[kv[1]!] = kv[2]!;
    if (
      Object.entries(labels).every(([k, v]) => got[k] === v) &&
      Object.keys(got).length === Object.keys(labels).length
    )
      return Number(m[3]);
  }
  return undefined;
}
