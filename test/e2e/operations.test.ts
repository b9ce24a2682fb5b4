import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Browser, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bucketQuantile } from "../../controller/ui/latency-series.ts";
import { type ClusterState, clusterDown, clusterUp, parseMetrics } from "../../deploy/cluster.ts";
import { resolveConfig } from "../../schema/config-load.ts";
import {
  concrete,
  dashboardTargets,
  exportedFamilies,
  metricFamily,
  promqlMetricNames,
} from "../deploy/dashboard.ts";
import { freePort, freePortPair } from "../ports.ts";
import {
  prometheusInstalled,
  promtoolCheckMetrics,
  type RunningPrometheus,
  startPrometheus,
} from "./prometheus.ts";
import { type ServeProcess, startServe } from "./serve-process.ts";

/**
 * Operating it as a person would, against real processes: the embedded
 * server (`continuum serve`) and a local fleet (`cluster up` on the run's
 * Kafka broker and S3 server: two writers, the controller, two workers),
 * scraped by Debian's Prometheus and looked at in Debian's Chromium.
 *
 * - Prometheus: the Grafana dashboard's own PromQL (TTFT p99 from the
 *   histogram, tokens/s, cache hit ratio by source) returns exactly what the
 *   requests this test sent produced, and every dashboard expression names
 *   only metrics the servers export and returns data; promtool accepts every
 *   /metrics page.
 * - The web view: workers listed with their pages, a request's decision in
 *   the table within a second of its answer, a Datalog query's rows, a
 *   stopped worker leaving the table once its heartbeat expires; keyboard
 *   and axe-core accessibility checks; screenshots under test-output/.
 *
 * One fleet for both halves keeps the suite's cost to one start. The
 * expiry case runs last: it stops a worker.
 */

const CHROMIUM = "/usr/bin/chromium";
const TOKEN = `ops-${randomBytes(6).toString("hex")}`;
const AUTH = { authorization: `Bearer ${TOKEN}` };
const OUT = new URL("../../test-output/operations/", import.meta.url).pathname;
/** Prometheus's window for the dashboard's $__rate_interval here: it covers the whole run. */
const WINDOW = "5m";
const WINDOW_S = 300;
const HEARTBEAT_TTL_MS = 3_000;

const tools = existsSync(CHROMIUM) && prometheusInstalled();
if (!tools && process.env.CI)
  throw new Error(`CI must have ${CHROMIUM}, prometheus and promtool (.ci/run installs them)`);

let serve: ServeProcess;
let clusterDir: string;
let state: ClusterState;
let fleetUrl: string;
let prom: RunningPrometheus;
let browser: Browser;

async function complete(base: string, prompt: string): Promise<{ id: string; usage: Usage }> {
  const r = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...AUTH },
    body: JSON.stringify({ model: "tiny", prompt, max_tokens: 8, temperature: 0 }),
  });
  expect(r.status, await r.clone().text()).toBe(200);
  return (await r.json()) as { id: string; usage: Usage };
}

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

async function metricsText(base: string): Promise<string> {
  const r = await fetch(`${base}/metrics`, { headers: AUTH });
  expect(r.status).toBe(200);
  return r.text();
}

async function until<T>(what: string, timeoutMs: number, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`no ${what} within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** A histogram's cumulative buckets from a parsed /metrics page, in bound order (+Inf last). */
function buckets(m: Record<string, number>, name: string): { bounds: number[]; cumulative: number[] } {
  const rows = Object.entries(m)
    .filter(([k]) => k.startsWith(`${name}_bucket{`))
    .map(([k, v]) => [Number(/le="([^"]+)"/.exec(k)![1]!.replace("+Inf", "Infinity")), v] as const)
    .sort((a, b) => a[0] - b[0]);
  return { bounds: rows.map((r) => r[0]), cumulative: rows.map((r) => r[1]) };
}

function target(panel: string, refId: string): string {
  const t = dashboardTargets().find((x) => x.panel === panel && x.refId === refId);
  if (!t) throw new Error(`the dashboard has no ${panel} ${refId}`);
  return t.expr;
}

async function openView(base: string, name: string): Promise<Page> {
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 }, bypassCSP: true });
  const page = await context.newPage();
  const errors: string[] = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(`${base}/ui`);
  // The page itself is public; its data needs the API token, asked for in a form.
  await page.getByLabel("API token").fill(TOKEN);
  await page.getByRole("button", { name: "Connect" }).click();
  await page.waitForSelector("#workers-table tbody tr[data-worker]");
  expect(errors, `${name}: script errors`).toEqual([]);
  return page;
}

/** axe-core's WCAG checks on the page as it is (contrast, names, labels, table headers). */
async function axeViolations(page: Page): Promise<string[]> {
  await page.addScriptTag({ path: createRequire(import.meta.url).resolve("axe-core/axe.min.js") });
  return page.evaluate(async () => {
    const axe = (
      globalThis as unknown as { axe: { run(): Promise<{ violations: { id: string; help: string }[] }> } }
    ).axe;
    const r = await axe.run();
    return r.violations.map((v) => `${v.id}: ${v.help}`);
  });
}

/**
 * Waits (bounded) until the element's text — or an attribute — matches, as a
 * person reading the page would; fails naming what it last saw.
 */
// The first catalog query starts the query thread (a DataScript replica of its own);
// on a loaded 2-core CI machine that took up to 13 s.
const QUERY_ANSWER_MS = 30_000;

async function expectText(page: Page, selector: string, re: RegExp, attr?: string, timeoutMs = 5_000) {
  try {
    // Evaluated in the page (a string: this file is typed for Node, not the DOM).
    const el = `document.querySelector(${JSON.stringify(selector)})`;
    const text = attr ? `${el}?.getAttribute(${JSON.stringify(attr)})` : `${el}?.textContent`;
    await page.waitForFunction(
      `new RegExp(${JSON.stringify(re.source)}, ${JSON.stringify(re.flags)}).test(${text} ?? "")`,
      undefined,
      {
        timeout: timeoutMs,
      },
    );
  } catch {
    const el = page.locator(selector).first();
    const seen = attr ? await el.getAttribute(attr) : await el.textContent();
    throw new Error(
      `${selector}${attr ? `[${attr}]` : ""} never matched ${re}; it read ${JSON.stringify(seen)}`,
    );
  }
}

/** Numbers in a worker's row, by column header. */
async function workerRow(page: Page, id: string): Promise<Record<string, string>> {
  const cells = await page.locator(`#workers-table tr[data-worker="${id}"] > *`).allTextContents();
  const names = [
    "worker",
    "free",
    "resident",
    "queued",
    "running",
    "residentHits",
    "ram",
    "ssd",
    "peer",
    "s3",
  ];
  return Object.fromEntries(names.map((n, i) => [n, cells[i] ?? ""]));
}

describe.skipIf(!tools)("operating continuum: Prometheus, Grafana's queries and the web view", () => {
  beforeAll(async () => {
    await mkdir(OUT, { recursive: true });
    const brokers = process.env.CONTINUUM_KAFKA_BROKERS;
    const s3Endpoint = process.env.CONTINUUM_S3_ENDPOINT;
    if (!brokers || !s3Endpoint) throw new Error("the test setup's Kafka broker and S3 server are needed");
    const tokens = JSON.stringify({ [TOKEN]: "ops" });
    // The test's one tenant is an admin: it reads /metrics, /ui/events and every catalog fact.
    serve = await startServe({
      CONTINUUM_AUTH_TOKENS: tokens,
      CONTINUUM_AUTH_ADMIN_TENANTS: "ops",
      CONTINUUM_WORKER_THREADS: "1",
    });
    clusterDir = await mkdtemp(join(tmpdir(), "continuum-ops-"));
    const run = randomBytes(4).toString("hex");
    const httpPort = await freePort();
    fleetUrl = `http://127.0.0.1:${httpPort}`;
    const config = resolveConfig(
      {
        pages: { physicalPages: 256, chunkTokens: 128 },
        controller: {
          httpPort,
          workerPort: await freePort(),
          heartbeatTtlMs: HEARTBEAT_TTL_MS,
          residentFreshMs: HEARTBEAT_TTL_MS,
        },
        worker: { peerPortBase: await freePortPair(), heartbeatIntervalMs: 500, threads: 1 },
        catalog: {
          topics: {
            proposals: `ops-${run}.proposals`,
            tx: `ops-${run}.tx`,
            rejections: `ops-${run}.rejections`,
          },
        },
        store: {
          s3: {
            bucket: `ops-${run}`,
            accessKeyId: process.env.CONTINUUM_S3_ACCESS_KEY_ID ?? "continuum",
            secretAccessKey: process.env.CONTINUUM_S3_SECRET_ACCESS_KEY ?? "continuum-secret",
          },
        },
        auth: { tokens: { [TOKEN]: "ops" }, adminTenants: ["ops"] },
      },
      {},
    );
    state = await clusterUp({
      dir: clusterDir,
      workers: 2,
      config,
      kafkaPort: 0,
      s3Port: 0,
      readyTimeoutMs: 150_000,
      progress: () => undefined,
      services: { brokers, s3Endpoint },
    });
    prom = await startPrometheus([
      { job: "embedded", target: `127.0.0.1:${serve.port}`, bearer: TOKEN },
      { job: "fleet", target: `127.0.0.1:${httpPort}`, bearer: TOKEN },
    ]);
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
  }, 300_000);

  afterAll(async () => {
    await browser?.close();
    await prom?.stop();
    if (state) {
      for (const p of state.processes) {
        try {
          process.kill(p.pid, "SIGCONT");
        } catch {
          // already gone
        }
      }
      await clusterDown(state, () => undefined);
    }
    await serve?.stop();
    if (clusterDir) await rm(clusterDir, { recursive: true, force: true });
  }, 120_000);

  it("the dashboard's PromQL on a real Prometheus returns the TTFT p99, tokens/s and cache hit ratios the requests produced", async () => {
    const jobs = { embedded: serve.url, fleet: fleetUrl } as const;
    // Every series' first sample is from before any request, so rate/increase over the window are exact.
    await until("both targets up", 30_000, async () => {
      const up = await prom.query("up");
      return up.length === 2 && up.every((s) => s.value[1] === 1) ? true : undefined;
    });
    const prefix = "You are a careful assistant who answers briefly and never repeats itself. ".repeat(12);
    const caused: Record<string, { completion: number; cached: number; requests: number }> = {};
    for (const [job, base] of Object.entries(jobs)) {
      const c = { completion: 0, cached: 0, requests: 0 };
      for (const q of ["What is a river?", "What is a lake?"]) {
        const r = await complete(base, `${prefix}${q}`);
        c.completion += r.usage.completion_tokens;
        c.cached += r.usage.prompt_tokens_details.cached_tokens;
        c.requests += 1;
        // The next request sees this one's prefix in a heartbeat (fleet) or in resident pages (embedded).
        await new Promise((r) => setTimeout(r, 1_200));
      }
      caused[job] = c;
    }

    const exported = new Set<string>();
    let latest = 0;
    for (const [job, base] of Object.entries(jobs)) {
      const text = await metricsText(base);
      for (const f of exportedFamilies(text)) exported.add(f);
      const m = parseMetrics(text);
      const c = caused[job]!;
      expect(m.continuum_ttft_seconds_count, job).toBe(c.requests);
      expect(m.continuum_generated_tokens_total, job).toBe(c.completion);
      // Wait for a scrape taken after the last request, then query at that sample's time.
      const t = await until(`${job}: a scrape after the traffic`, 20_000, async () => {
        const s = await prom.query(`timestamp(continuum_generated_tokens_total{job="${job}"})`);
        const v = await prom.query(`continuum_ttft_seconds_count{job="${job}"}`);
        return v[0]?.value[1] === c.requests && s[0] ? s[0].value[1] : undefined;
      });
      latest = Math.max(latest, t);
      const at = (expr: string) => prom.query(concrete(expr, job, WINDOW), t);

      const ttft = buckets(m, "continuum_ttft_seconds");
      const p99 = await at(target("Time to first token", "B"));
      expect(p99[0]!.value[1], `${job} TTFT p99`).toBeCloseTo(
        bucketQuantile(0.99, ttft.bounds, ttft.cumulative)!,
        9,
      );

      const tokensPerS = await at(target("Tokens per second", "A"));
      expect(tokensPerS[0]!.value[1] * WINDOW_S, `${job} tokens/s × window`).toBeCloseTo(c.completion, 6);

      const ratios = await at(target("Cache hit ratio by source", "A"));
      const bySource = Object.fromEntries(ratios.map((s) => [s.metric.source!, s.value[1]]));
      const tokens = Object.fromEntries(
        Object.entries(m)
          .filter(([k]) => k.startsWith("continuum_cache_tokens{"))
          .map(([k, v]) => [/source="([^"]+)"/.exec(k)![1]!, v]),
      );
      const total = Object.values(tokens).reduce((a, b) => a + b, 0);
      expect(Object.keys(bySource).sort(), job).toEqual(Object.keys(tokens).sort());
      for (const [source, v] of Object.entries(tokens))
        expect(bySource[source], `${job} ${source}`).toBeCloseTo(v / total, 9);
      // What the responses reported as cached is what the cache sources hold.
      expect(c.cached, `${job}: the second request reused the shared prefix`).toBeGreaterThan(0);
      expect(total - tokens.recompute!, `${job} cached tokens`).toBe(c.cached);
    }

    // Every metric the dashboard names is exported, and every panel's query returns data.
    for (const t of dashboardTargets()) {
      for (const name of promqlMetricNames(t.expr))
        expect(metricFamily(name, exported), `${t.panel}: ${name} is not exported`).toBeDefined();
      const rows = await prom.query(concrete(t.expr, ".+", WINDOW), latest);
      expect(rows.length, `${t.panel} ${t.refId} returned nothing`).toBeGreaterThan(0);
    }
  }, 120_000);

  it("promtool check metrics accepts every /metrics page", async () => {
    for (const base of [serve.url, fleetUrl]) {
      const r = await promtoolCheckMetrics(await metricsText(base));
      expect(r, base).toEqual({ code: 0, out: "" });
    }
  });

  it("the fleet's web view lists the workers, shows a request's decision within a second, answers Datalog", async () => {
    const page = await openView(fleetUrl, "fleet");
    await expectText(page, "#mode", /^· fleet controller$/);
    for (const id of ["worker-0", "worker-1"]) {
      await page.waitForSelector(`#workers-table tr[data-worker="${id}"]`);
      const row = await workerRow(page, id);
      expect(Number(row.free), `${id} free pages`).toBeGreaterThan(0);
      const [resident, total] = row.resident!.split(" / ").map(Number);
      expect(total, `${id} total pages`).toBe(256);
      expect(resident).toBeGreaterThanOrEqual(0);
    }

    const r = await complete(fleetUrl, "Decisions appear in the web view while the operator watches.");
    const answered = Date.now();
    const row = page.locator(`#decisions-table tr[data-request="${r.id}"]`);
    await row.waitFor({ timeout: 1_000 });
    const seenAfterMs = Date.now() - answered;
    expect(seenAfterMs).toBeLessThanOrEqual(1_000);
    const cells = await row.locator("> *").allTextContents();
    expect(cells[4]).toMatch(/^worker-[01]$/);
    expect(Number(cells[7]), "predicted TTFT").toBeGreaterThan(0);
    await expectText(page, `#decisions-table tr[data-request="${r.id}"] td:nth-child(9)`, /^[\d.]+$/); // measured TTFT
    await row.locator("summary").click();
    await expectText(page, `#decisions-table tr[data-request="${r.id}"] details li`, /predicted [\d.]+ ms/);

    // Keyboard: after a reload (the token stays for the tab) the skip link is the first stop and
    // moves focus to the workers; the query runs with Ctrl+Enter.
    await page.reload();
    await page.waitForSelector('#workers-table tr[data-worker="worker-0"]');
    await page.keyboard.press("Tab");
    expect(await page.evaluate("document.activeElement?.textContent")).toBe("Skip to the workers");
    await page.keyboard.press("Enter");
    expect(await page.evaluate("document.activeElement?.id")).toBe("workers");
    await page.locator("#query").fill("[:find ?x :where [?x :worker/id]");
    await page.locator("#query").press("Control+Enter");
    await expectText(page, "#query-error", /error/, undefined, QUERY_ANSWER_MS);
    await page
      .locator("#query")
      .fill("[:find ?id ?address :where [?w :worker/id ?id] [?w :worker/address ?address]]");
    await page.locator("#query").press("Control+Enter");
    await expectText(page, "#query-caption", /^2 rows$/, undefined, QUERY_ANSWER_MS);
    const ids = await page.locator("#query-table tbody tr td:first-child").allTextContents();
    expect(ids.sort()).toEqual(["worker-0", "worker-1"]);

    // Text alternatives of the charts carry the numbers.
    await expectText(page, "#ttft-chart", /Time to first token: .*highest p99 [\d.]+ ms/, "aria-label");
    expect(await axeViolations(page)).toEqual([]);
    await page.screenshot({ path: join(OUT, "fleet.png"), fullPage: true });

    // A worker that stops sending heartbeats leaves the table once its TTL runs out.
    const worker1 = state.processes.find((p) => p.name === "worker-1")!;
    process.kill(worker1.pid, "SIGSTOP");
    try {
      await page.locator('#workers-table tr[data-worker="worker-1"]').waitFor({
        state: "detached",
        timeout: HEARTBEAT_TTL_MS + 10_000,
      });
      await expectText(page, "#offline", /worker-1/);
      expect(await page.locator('#workers-table tr[data-worker="worker-0"]').count()).toBe(1);
    } finally {
      process.kill(worker1.pid, "SIGCONT");
    }
    await page.context().close();
  }, 90_000);

  it("the embedded server's web view shows its one worker and its catalog, and keeps its data behind the token", async () => {
    expect((await fetch(`${serve.url}/ui`)).status).toBe(200);
    expect((await fetch(`${serve.url}/ui/events`)).status).toBe(401);
    const page = await openView(serve.url, "embedded");
    await expectText(page, "#mode", /^· embedded server$/);
    const row = await workerRow(page, "embedded");
    expect(Number(row.free)).toBeGreaterThan(0);
    expect(Number(row.residentHits), "the shared prefix's resident hits").toBeGreaterThan(0);
    await expectText(page, "#decisions-note", /nothing is routed/);
    await page.getByRole("button", { name: "Run query" }).click();
    await expectText(page, "#query-caption", /^1 row$/, undefined, QUERY_ANSWER_MS);
    expect(await axeViolations(page)).toEqual([]);
    await page.screenshot({ path: join(OUT, "embedded.png"), fullPage: true });
    await page.context().close();
  }, 60_000);
});
