import { Effect } from "effect";
import type { ApiServer } from "../controller/api/server.ts";
import type { FleetWorkerView } from "../controller/api/service.ts";
import { WebView, type WebViewSource } from "../controller/ui/web-view.ts";
import type { Config } from "../schema/config.ts";
import type { WorkerStatus } from "../schema/control.ts";
import { resource } from "../schema/scope.ts";
import type { RuntimeStats } from "../worker/runtime/runtime-api.ts";

/**
 * The web view (/ui) on a role's API server, when controller.ui is on: it
 * reads the server's own latency histograms, so it is mounted after the
 * server is built and released (its event streams ended) when the scope
 * closes. Returns null when the view is configured off.
 */
export function webViewResource(
  config: Config,
  server: ApiServer,
  source: Omit<WebViewSource, "ttft" | "itl">,
) {
  if (!config.controller.ui) return Effect.succeed(null);
  return resource(
    () => {
      const view = new WebView({
        ...source,
        ttft: server.metrics.histogram("continuum_ttft_seconds"),
        itl: server.metrics.histogram("continuum_inter_token_seconds"),
      });
      view.start();
      server.mount(view);
      return view;
    },
    (view) => view.close(),
  );
}

/** The embedded default's one in-process worker, as the web view lists workers. Pure. */
export function embeddedWorkerView(
  stats: Pick<RuntimeStats, "pagesAvailable" | "waiting" | "running">,
  status: WorkerStatus,
): FleetWorkerView {
  return {
    workerId: "embedded",
    live: true,
    ready: true,
    heartbeatAgeMs: 0,
    freePages: stats.pagesAvailable,
    evictablePages: 0,
    queuedRequests: stats.waiting,
    runningRequests: stats.running,
    status,
  };
}
