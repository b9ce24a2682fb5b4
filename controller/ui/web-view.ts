import { readFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { createRequire } from "node:module";
import { ApiError } from "../api/errors.ts";
import type { FleetWorkerView } from "../api/service.ts";
import type { Histogram } from "../metrics.ts";
import { LatencySeries } from "./latency-series.ts";
import type { RecentDecisions } from "./recent-decisions.ts";

/**
 * The operator's web view, mounted on the API server under /ui:
 *
 *   GET /ui              the page (static HTML, script and styles: no data, no auth)
 *   GET /ui/<asset>      app.js, app.css, vendor/uPlot.* (vendored from node_modules at start)
 *   GET /ui/events       Server-Sent Events, one `snapshot` frame a tick (and at once when a
 *                        decision arrives): the workers, this process's catalog replica, TTFT
 *                        and inter-token quantiles over the last minutes, the recent decisions.
 *                        Behind the API's bearer-token auth.
 *
 * The page's Datalog box posts to the API's own /v1/catalog/query with the
 * same token. Nothing here changes any state.
 *
 * Bounds: at most `maxClients` event streams at once (one more is answered
 * 503); a client that lets more than `maxBufferedBytes` of frames pile up
 * unread is disconnected; the latency history holds `historyTicks` ticks.
 */

export interface WebViewSource {
  readonly mode: "embedded" | "fleet";
  /** Each worker as the serving process sees it (embedded: its one in-process worker). */
  workers(): readonly FleetWorkerView[];
  /** The serving process's own catalog replica (null: none attached). */
  catalog(): { readonly offset: number; readonly lag: number } | null;
  /** The router's recent decisions (null: nothing routes here, as in the embedded default). */
  readonly decisions: RecentDecisions | null;
  /** The API's latency histograms (continuum_ttft_seconds, continuum_inter_token_seconds). */
  readonly ttft: Histogram;
  readonly itl: Histogram;
}

export interface WebViewOptions {
  readonly tickMs: number;
  /** Ticks of latency history (with tickMs 1000 and 300: the last five minutes). */
  readonly historyTicks: number;
  /** Ticks per quantile window. */
  readonly windowTicks: number;
  readonly maxClients: number;
  readonly maxBufferedBytes: number;
  /** Decisions shown (newest first). */
  readonly decisionsShown: number;
}

export const defaultWebViewOptions: WebViewOptions = {
  tickMs: 1_000,
  historyTicks: 300,
  windowTicks: 10,
  maxClients: 8,
  maxBufferedBytes: 1 << 20,
  decisionsShown: 25,
};

/** A decision's frame goes out this soon after it (several coalesce into one frame). */
const DECISION_PUSH_MS = 100;

interface Asset {
  readonly type: string;
  readonly body: Buffer;
}

const require = createRequire(import.meta.url);

function loadAssets(): ReadonlyMap<string, Asset> {
  const own = (name: string) => readFileSync(new URL(`./assets/${name}`, import.meta.url));
  const vendor = (spec: string) => readFileSync(require.resolve(spec));
  return new Map<string, Asset>([
    ["/ui", { type: "text/html; charset=utf-8", body: own("index.html") }],
    ["/ui/", { type: "text/html; charset=utf-8", body: own("index.html") }],
    ["/ui/app.js", { type: "text/javascript; charset=utf-8", body: own("app.js") }],
    ["/ui/app.css", { type: "text/css; charset=utf-8", body: own("app.css") }],
    [
      "/ui/vendor/uPlot.iife.min.js",
      { type: "text/javascript; charset=utf-8", body: vendor("uplot/dist/uPlot.iife.min.js") },
    ],
    [
      "/ui/vendor/uPlot.min.css",
      { type: "text/css; charset=utf-8", body: vendor("uplot/dist/uPlot.min.css") },
    ],
  ]);
}

const SECURITY_HEADERS = {
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
} as const;

export class WebView {
  readonly prefix = "/ui";
  private readonly assets = loadAssets();
  private readonly series: LatencySeries;
  private readonly clients = new Set<ServerResponse>();
  private timer: NodeJS.Timeout | undefined;
  private push: NodeJS.Timeout | undefined;
  private unsubscribe: (() => void) | undefined;

  constructor(
    private readonly source: WebViewSource,
    private readonly opts: WebViewOptions = defaultWebViewOptions,
  ) {
    this.series = new LatencySeries(opts.historyTicks + opts.windowTicks, opts.windowTicks);
  }

  /** Starts the tick (latency sampling and frames); `close` stops it. */
  start(): void {
    const sample = () =>
      this.series.record(Date.now(), this.source.ttft.snapshot(), this.source.itl.snapshot());
    sample();
    this.timer = setInterval(() => {
      sample();
      this.broadcast();
    }, this.opts.tickMs);
    this.unsubscribe = this.source.decisions?.onChange(() => {
      this.push ??= setTimeout(() => {
        this.push = undefined;
        this.broadcast();
      }, DECISION_PUSH_MS);
    });
  }

  /** Stops the tick and ends every event stream. */
  close(): void {
    clearInterval(this.timer);
    clearTimeout(this.push);
    this.unsubscribe?.();
    for (const res of this.clients) res.end();
    this.clients.clear();
  }

  /** Event streams open now. */
  get clientCount(): number {
    return this.clients.size;
  }

  /** The frame every client gets now. */
  snapshot(): Record<string, unknown> {
    const s = this.source;
    return {
      v: 1,
      mode: s.mode,
      time: Date.now(),
      tickMs: this.opts.tickMs,
      windowS: (this.opts.windowTicks * this.opts.tickMs) / 1000,
      workers: s.workers(),
      catalog: s.catalog(),
      latency: this.series.points(),
      decisions: s.decisions ? s.decisions.list().slice(0, this.opts.decisionsShown) : null,
    };
  }

  async handle(req: IncomingMessage, res: ServerResponse, url: URL, authenticate: () => void): Promise<void> {
    if (req.method !== "GET" && req.method !== "HEAD")
      throw new ApiError(405, `${req.method} is not served under /ui; use GET`);
    if (url.pathname === "/ui/events") {
      authenticate();
      return this.openStream(res);
    }
    const asset = this.assets.get(url.pathname);
    if (!asset) throw new ApiError(404, `no web view page ${url.pathname}`, "invalid_request_error");
    res.writeHead(200, {
      ...SECURITY_HEADERS,
      "content-type": asset.type,
      "content-length": asset.body.byteLength,
      "cache-control": "no-cache",
    });
    res.end(req.method === "HEAD" ? undefined : asset.body);
  }

  private openStream(res: ServerResponse): void {
    if (this.clients.size >= this.opts.maxClients)
      throw new ApiError(
        503,
        `the web view has ${this.opts.maxClients} event streams open; close one`,
        "server_error",
      );
    res.writeHead(200, {
      ...SECURITY_HEADERS,
      "content-type": "text/event-stream",
      "cache-control": "no-cache",
      connection: "keep-alive",
    });
    this.clients.add(res);
    res.on("close", () => this.clients.delete(res));
    this.send(res, `event: snapshot\ndata: ${JSON.stringify(this.snapshot())}\n\n`);
  }

  private broadcast(): void {
    if (this.clients.size === 0) return;
    const frame = `event: snapshot\ndata: ${JSON.stringify(this.snapshot())}\n\n`;
    for (const res of this.clients) this.send(res, frame);
  }

  private send(res: ServerResponse, frame: string): void {
    if (res.writableLength > this.opts.maxBufferedBytes) {
      // A reader this far behind gets nothing newer by waiting: drop it (it reconnects).
      this.clients.delete(res);
      res.destroy();
      return;
    }
    res.write(frame);
  }
}
