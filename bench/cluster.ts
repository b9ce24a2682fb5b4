import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import OpenAI from "openai";
import type { FleetWorkerView } from "../controller/api/service.ts";
import {
  type ClusterState,
  clusterDown,
  clusterUp,
  parseMetrics,
  type RunningServices,
  startServices,
} from "../deploy/cluster.ts";
import { type Config, resolveConfig } from "../schema/config.ts";
import type { WorkerStatus } from "../schema/control.ts";
import { generateModel } from "../worker/model/generate.ts";
import { loadModelDir } from "../worker/model/model-dir.ts";
import { Rng, seedRng } from "../worker/model/prng.ts";
import { type Bench, percentile, round } from "./contract.ts";

/** The fleet has API tokens (one per tenant), so /metrics and /workers take a scrape token. */
const SCRAPE_TOKEN = "bench-scrape";
const SCRAPE = { authorization: `Bearer ${SCRAPE_TOKEN}` };

/**
 * The whole fleet end to end: `cluster up`'s own code starts, as real
 * processes, two catalog writers, the controller and 2 workers on one real
 * Kafka broker and one real S3 server (deploy/ scripts, started once and
 * shared by the three fleets below, each with its own catalog topics and
 * bucket). Requests go over HTTP through the official openai client,
 * streamed, so TTFT is what a client sees.
 *
 * Workload: many users share a few long system prompts. P system prompts
 * of L tokens; T tenants, each with its own API key, so its prefixes are
 * salted (never shared across tenants): T × P distinct prefixes. Every
 * request is a tenant's system prompt + a unique 16–32 token user message,
 * 4 generated tokens (temperature 0). The workers' page pools hold about one
 * cached prefix beside the running request, far fewer than T × P: which
 * prefixes stay resident is up to eviction, and a prefix that left the pool
 * is restored (RAM, SSD, a peer, S3) or recomputed. That is where durable
 * reuse matters.
 *
 * Phases, identical in every configuration (same seed, same order):
 *   warm      each distinct prefix once (its first computation: cold in
 *             every configuration; reported apart as cold TTFT);
 *   measured  N requests over the prefixes, uniformly at random, from 2
 *             closed-loop clients.
 *
 * Three fleets, one after the other in one run:
 *   full        TTFT routing (controller.routing: ttft), durable reuse on;
 *   no_reuse    TTFT routing, worker.durableReuse false: the workers neither
 *               checkpoint (capture finished prefixes into RAM, chunk files
 *               and S3, publish them in the catalog) nor restore; a request
 *               reuses only prefix pages still resident in its worker's pool,
 *               and anything else is recomputed;
 *   round_robin controller.routing: round_robin (workers in turn, blind to
 *               where prefixes are), durable reuse on.
 *
 * Model: the `small` preset (12 layers, hidden 768, ~88 M parameters). The
 * tiny preset prefills a token in ~0.07 ms, so a 128-token chunk costs less
 * to recompute (~9 ms) than to checkpoint (~12 ms, two fsyncs), and the
 * worker's checkpoint admission rightly declines it: there would be no
 * durable reuse to measure. With small, a 384–768-token prefix costs one to
 * several seconds of prefill on one core, and a chunk (128 tokens, 1.5 MiB)
 * a few ms to restore.
 * Sizes: quick 6 tenants × 2 prompts of 384 tokens, 24 measured requests,
 * 96 pages per worker; full 6 × 3 of 768 tokens, 48 requests, 160 pages.
 */

const MODEL_DIR = resolve(process.env.CONTINUUM_DATA_DIR ?? ".continuum", "models", "small");
const PAGE_TOKENS = 16;
const CHUNK_TOKENS = 128;
const GEN_TOKENS = 4;
const CLIENTS = 2;
const WORKERS = 2;

interface Shape {
  readonly tenants: number;
  readonly prompts: number;
  readonly promptTokens: number;
  readonly requests: number;
  readonly physicalPages: number;
}

/**
 * Pools: a worker's admission counts an accepted request's pages twice until
 * it ends (agent.ts: conservative), so a pool takes a second concurrent
 * request only with 2 × request + one more request of room; beyond that it
 * holds few cached prefixes: quick 2 × 96 pages vs 12 prefixes × 24 pages,
 * full 2 × 160 vs 18 × 48.
 */
const QUICK: Shape = { tenants: 6, prompts: 2, promptTokens: 384, requests: 24, physicalPages: 96 };
const FULL: Shape = { tenants: 6, prompts: 3, promptTokens: 768, requests: 48, physicalPages: 160 };
/** A request the controller refused for want of a worker with room is retried this often, this far apart. */
const NO_WORKER_RETRIES = 40;
const NO_WORKER_BACKOFF_MS = 250;

interface Variant {
  readonly name: "full" | "no_reuse" | "round_robin";
  readonly routing: Config["controller"]["routing"];
  readonly durableReuse: boolean;
}

const VARIANTS: readonly Variant[] = [
  { name: "full", routing: "ttft", durableReuse: true },
  { name: "no_reuse", routing: "ttft", durableReuse: false },
  { name: "round_robin", routing: "round_robin", durableReuse: true },
];

interface Job {
  readonly tenant: number;
  readonly prompt: number;
  readonly tokens: readonly number[];
}

/** The workload, the same for every variant: warm (each prefix once) and measured requests. */
function workload(shape: Shape, vocab: number): { warm: Job[]; measured: Job[] } {
  const rng = new Rng(seedRng(0x5eed));
  const word = () => 1 + Math.floor(rng.nextFloat() * (vocab - 1));
  const system = Array.from({ length: shape.prompts }, () =>
    Array.from({ length: shape.promptTokens }, word),
  );
  const job = (tenant: number, prompt: number): Job => {
    const suffix = Array.from({ length: 16 + Math.floor(rng.nextFloat() * 17) }, word);
    return { tenant, prompt, tokens: [...system[prompt]!, ...suffix] };
  };
  const warm: Job[] = [];
  for (let p = 0; p < shape.prompts; p++) for (let t = 0; t < shape.tenants; t++) warm.push(job(t, p));
  const measured: Job[] = [];
  for (let i = 0; i < shape.requests; i++)
    measured.push(
      job(Math.floor(rng.nextFloat() * shape.tenants), Math.floor(rng.nextFloat() * shape.prompts)),
    );
  return { warm, measured };
}

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** A free port whose successor is free too (Kafka's broker and its KRaft controller). */
async function freePortPair(): Promise<number> {
  for (let i = 0; i < 50; i++) {
    const p = await freePort();
    if (p >= 65535) continue;
    const s = createServer();
    const ok = await new Promise<boolean>((r) => {
      s.once("error", () => r(false));
      s.listen(p + 1, "127.0.0.1", () => r(true));
    });
    if (ok) {
      await new Promise<void>((r) => s.close(() => r()));
      return p;
    }
  }
  throw new Error("no free pair of ports");
}

const tenantKey = (t: number) => `bench-tenant-${t}-key`;

interface Totals {
  residentHitTokens: number;
  computedTokens: number;
  restoredChunks: Record<"ram" | "ssd" | "peer" | "s3", number>;
  restoredBytes: Record<"ram" | "ssd" | "peer" | "s3", number>;
  publishedChunks: number;
  publishedBytes: number;
}

function totals(fleet: readonly FleetWorkerView[]): Totals {
  const t: Totals = {
    residentHitTokens: 0,
    computedTokens: 0,
    restoredChunks: { ram: 0, ssd: 0, peer: 0, s3: 0 },
    restoredBytes: { ram: 0, ssd: 0, peer: 0, s3: 0 },
    publishedChunks: 0,
    publishedBytes: 0,
  };
  for (const w of fleet) {
    const s: WorkerStatus | null = w.status;
    if (s === null) throw new Error(`${w.workerId} reports no status`);
    t.residentHitTokens += s.residentHitTokens;
    t.computedTokens += s.computedTokens;
    t.publishedChunks += s.publishedChunks;
    t.publishedBytes += s.publishedBytes;
    for (const k of ["ram", "ssd", "peer", "s3"] as const) {
      t.restoredChunks[k] += s.restoredChunks[k];
      t.restoredBytes[k] += s.restoredBytes[k];
    }
  }
  return t;
}

function minus(a: Totals, b: Totals): Totals {
  const tier = (x: Totals["restoredChunks"], y: Totals["restoredChunks"]) => ({
    ram: x.ram - y.ram,
    ssd: x.ssd - y.ssd,
    peer: x.peer - y.peer,
    s3: x.s3 - y.s3,
  });
  return {
    residentHitTokens: a.residentHitTokens - b.residentHitTokens,
    computedTokens: a.computedTokens - b.computedTokens,
    restoredChunks: tier(a.restoredChunks, b.restoredChunks),
    restoredBytes: tier(a.restoredBytes, b.restoredBytes),
    publishedChunks: a.publishedChunks - b.publishedChunks,
    publishedBytes: a.publishedBytes - b.publishedBytes,
  };
}

/**
 * The fleet's totals once every worker's heartbeat reflects all finished work:
 * two heartbeats in a row with the same counters (bounded: 30 s).
 */
async function settledTotals(api: string): Promise<Totals> {
  let last = "";
  const deadline = Date.now() + 30_000;
  for (;;) {
    const fleet = (
      (await (await fetch(`${api}/workers`, { headers: SCRAPE })).json()) as { workers: FleetWorkerView[] }
    ).workers;
    const t = totals(fleet);
    const key = JSON.stringify(t);
    if (key === last || Date.now() > deadline) return t;
    last = key;
    await new Promise((r) => setTimeout(r, 1_200));
  }
}

interface PhaseResult {
  readonly ttftMs: number[];
  readonly wallMs: number;
  /** Prompt tokens of the requests served. */
  readonly promptTokens: number;
  /** Requests refused (no worker had room) and sent again; their TTFT counts from the first try. */
  readonly retries: number;
}

/** Runs jobs from `clients` closed-loop clients (each takes the next job when its last one finished). */
async function drive(
  clients: readonly OpenAI[],
  model: string,
  jobs: readonly Job[],
  concurrency: number,
): Promise<PhaseResult> {
  const ttftMs: number[] = [];
  let promptTokens = 0;
  let retries = 0;
  let next = 0;
  const t0 = performance.now();
  /** TTFT of one request (ms from `start`), or "no_worker" when the controller refused it before any token. */
  const attempt = async (job: Job, start: number): Promise<number | "no_worker"> => {
    let first: number | null = null;
    try {
      const stream = await clients[job.tenant]!.completions.create({
        model,
        prompt: [...job.tokens],
        max_tokens: GEN_TOKENS,
        temperature: 0,
        stream: true,
      });
      for await (const chunk of stream) {
        if (chunk.choices.length === 0) continue;
        first ??= performance.now() - start;
      }
    } catch (err) {
      if (first === null && /no_worker/.test((err as Error).message)) return "no_worker";
      throw err;
    }
    if (first === null) throw new Error("a request streamed no token");
    return first;
  };
  const one = async () => {
    for (let i = next++; i < jobs.length; i = next++) {
      const start = performance.now();
      let ttft = await attempt(jobs[i]!, start);
      for (let r = 0; ttft === "no_worker"; r++) {
        if (r === NO_WORKER_RETRIES) throw new Error(`request ${i}: no worker had room after ${r} retries`);
        retries++;
        await new Promise((res) => setTimeout(res, NO_WORKER_BACKOFF_MS));
        ttft = await attempt(jobs[i]!, start);
      }
      ttftMs.push(ttft);
      promptTokens += jobs[i]!.tokens.length;
    }
  };
  // Every client runs to its end before a failure is reported (none is left unhandled).
  const settled = await Promise.allSettled(Array.from({ length: concurrency }, one));
  const failed = settled.find((r) => r.status === "rejected");
  if (failed) throw (failed as PromiseRejectedResult).reason;
  return { ttftMs, wallMs: performance.now() - t0, promptTokens, retries };
}

interface VariantResult {
  readonly cold: PhaseResult;
  readonly measured: PhaseResult;
  /** The measured phase's hits and restores. */
  readonly work: Totals;
  /** The whole run's (warm + measured): checkpoints happen mostly while prefixes are first computed. */
  readonly total: Totals;
  readonly routedTokens: Record<string, number>;
}

async function runVariant(
  v: Variant,
  shape: Shape,
  services: RunningServices,
  run: string,
  root: string,
  log: (l: string) => void,
): Promise<VariantResult> {
  const base = resolveConfig({}, {});
  const tokens: Record<string, string> = {};
  for (let t = 0; t < shape.tenants; t++) tokens[tenantKey(t)] = `tenant-${t}`;
  const config: Config = {
    ...base,
    model: { ...base.model, dir: MODEL_DIR, preset: "small" },
    pages: { pageTokens: PAGE_TOKENS, physicalPages: shape.physicalPages, chunkTokens: CHUNK_TOKENS },
    store: { ...base.store, s3: { ...base.store.s3, bucket: `bench-${run}-${v.name.replace("_", "-")}` } },
    catalog: {
      ...base.catalog,
      topics: {
        proposals: `bench-${run}-${v.name}.proposals`,
        tx: `bench-${run}-${v.name}.tx`,
        rejections: `bench-${run}-${v.name}.rejections`,
      },
    },
    controller: {
      ...base.controller,
      httpPort: await freePort(),
      workerPort: await freePort(),
      routing: v.routing,
      // A prefill of seconds on a shared core must not read as a stuck worker.
      heartbeatTtlMs: 10_000,
      residentFreshMs: 5_000,
      offerTimeoutMs: 30_000,
      progressTimeoutMs: 300_000,
    },
    worker: { ...base.worker, peerPortBase: await freePort(), threads: 1, durableReuse: v.durableReuse },
    auth: { ...base.auth, tokens, clusterSecret: "", metricsToken: SCRAPE_TOKEN },
  };
  const dir = join(root, v.name);
  const state: ClusterState = await clusterUp({
    dir,
    workers: WORKERS,
    config,
    kafkaPort: 0,
    s3Port: 0,
    readyTimeoutMs: 300_000,
    progress: (l) => log(`  ${v.name}: ${l}`),
    services,
  });
  try {
    const clients = Array.from(
      { length: shape.tenants },
      (_, t) =>
        new OpenAI({ baseURL: `${state.api}/v1`, apiKey: tenantKey(t), maxRetries: 0, timeout: 600_000 }),
    );
    const model = (await clients[0]!.models.list()).data[0]!.id;
    const { warm, measured } = workload(shape, 8000);
    log(`  ${v.name}: warm phase, ${warm.length} distinct prefixes once each`);
    const cold = await drive(clients, model, warm, CLIENTS);
    const before = await settledTotals(state.api);
    const routedBefore = await routed(state.api);
    log(`  ${v.name}: measured phase, ${measured.length} requests from ${CLIENTS} clients`);
    const m = await drive(clients, model, measured, CLIENTS);
    const after = await settledTotals(state.api);
    const routedAfter = await routed(state.api);
    const routedTokens: Record<string, number> = {};
    for (const [k, n] of Object.entries(routedAfter)) routedTokens[k] = n - (routedBefore[k] ?? 0);
    return { cold, measured: m, work: minus(after, before), total: after, routedTokens };
  } finally {
    await clusterDown(state, () => undefined);
  }
}

/** The controller's prompt tokens by the source its router chose (resident, ram, ssd, peer, s3, recompute). */
async function routed(api: string): Promise<Record<string, number>> {
  const m = parseMetrics(await (await fetch(`${api}/metrics`, { headers: SCRAPE })).text());
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(m)) {
    const hit = /^continuum_cache_tokens\{source="(\w+)"\}$/.exec(k);
    if (hit) out[hit[1]!] = v;
  }
  return out;
}

async function ensureSmallModel(log: (l: string) => void): Promise<number> {
  try {
    return (await loadModelDir(MODEL_DIR, { variant: "bench" })).config.spec.vocab;
  } catch {
    log(`generating the small preset into ${MODEL_DIR} (once)`);
    await generateModel({ preset: "small", out: MODEL_DIR, seed: 0, force: true });
    return (await loadModelDir(MODEL_DIR, { variant: "bench" })).config.spec.vocab;
  }
}

const mean = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

const bench: Bench = {
  summary:
    "the fleet end to end (real Kafka, S3, writers, controller, 2 workers): multi-tenant shared system prompts; full vs no durable reuse vs round-robin",
  async run({ quick, log }) {
    const shape = quick ? QUICK : FULL;
    const vocab = await ensureSmallModel(log);
    if (vocab < 8000)
      throw new Error(`the small preset's vocabulary (${vocab}) is smaller than the workload's`);
    const root = await mkdtemp(join(tmpdir(), "continuum-bench-cluster-"));
    const run = Date.now().toString(36);
    log(`starting Kafka and S3 once for the three fleets (${root})`);
    const services = await startServices({
      dir: root,
      kafkaPort: await freePortPair(),
      s3Port: await freePort(),
      progress: (l) => log(`  ${l}`),
    });
    const results: Partial<Record<Variant["name"], VariantResult>> = {};
    try {
      for (const v of VARIANTS) {
        log(`fleet '${v.name}': routing ${v.routing}, durable reuse ${v.durableReuse ? "on" : "off"}`);
        results[v.name] = await runVariant(v, shape, services, run, root, log);
        const r = results[v.name]!;
        log(
          `  ${v.name}: TTFT mean ${round(mean(r.measured.ttftMs))} ms, p50 ${round(percentile(r.measured.ttftMs, 50))} ms, p99 ${round(percentile(r.measured.ttftMs, 99))} ms; cold mean ${round(mean(r.cold.ttftMs))} ms`,
        );
      }
    } finally {
      await services.stop();
      // CONTINUUM_KEEP_BENCH_LOGS=1 keeps the fleets' logs and data for a post-mortem.
      if (process.env.CONTINUUM_KEEP_BENCH_LOGS) log(`kept ${root}`);
      else await rm(root, { recursive: true, force: true });
    }
    const figures: Record<string, number> = {};
    for (const v of VARIANTS) {
      const r = results[v.name]!;
      const m = r.measured;
      const f = (k: string, x: number) => {
        figures[`${v.name}_${k}`] = round(x);
      };
      f("ttft_mean_ms", mean(m.ttftMs));
      f("ttft_p50_ms", percentile(m.ttftMs, 50));
      f("ttft_p99_ms", percentile(m.ttftMs, 99));
      f("cold_ttft_mean_ms", mean(r.cold.ttftMs));
      f("requests_per_s", (m.ttftMs.length / m.wallMs) * 1000);
      f("prompt_tokens_per_s", (m.promptTokens / m.wallMs) * 1000);
      f("no_worker_retries", m.retries + r.cold.retries);
      f("hit_resident_tokens", r.work.residentHitTokens);
      f("computed_prompt_tokens", r.work.computedTokens);
      for (const k of ["ram", "ssd", "peer", "s3"] as const) {
        f(`hit_${k}_chunks`, r.work.restoredChunks[k]);
        f(`restored_${k}_bytes`, r.work.restoredBytes[k]);
      }
      // Over the whole run: each published chunk was written to its worker's RAM and SSD and uploaded to S3 once.
      f("published_chunks", r.total.publishedChunks);
      f("written_local_bytes", r.total.publishedBytes);
      f("written_s3_bytes", r.total.publishedBytes);
      for (const [k, n] of Object.entries(r.routedTokens)) f(`routed_${k}_tokens`, n);
    }
    const ratio = (a: string, b: string) => {
      const x = figures[a];
      const y = figures[b];
      return x !== undefined && y !== undefined && y > 0 ? round(x / y) : null;
    };
    return {
      figures,
      ratios: {
        ttft_mean_full_over_no_reuse: ratio("full_ttft_mean_ms", "no_reuse_ttft_mean_ms"),
        ttft_p50_full_over_no_reuse: ratio("full_ttft_p50_ms", "no_reuse_ttft_p50_ms"),
        ttft_p99_full_over_no_reuse: ratio("full_ttft_p99_ms", "no_reuse_ttft_p99_ms"),
        ttft_mean_full_over_round_robin: ratio("full_ttft_mean_ms", "round_robin_ttft_mean_ms"),
        ttft_p50_full_over_round_robin: ratio("full_ttft_p50_ms", "round_robin_ttft_p50_ms"),
        ttft_p99_full_over_round_robin: ratio("full_ttft_p99_ms", "round_robin_ttft_p99_ms"),
        throughput_full_over_no_reuse: ratio("full_requests_per_s", "no_reuse_requests_per_s"),
        throughput_full_over_round_robin: ratio("full_requests_per_s", "round_robin_requests_per_s"),
        computed_tokens_full_over_no_reuse: ratio(
          "full_computed_prompt_tokens",
          "no_reuse_computed_prompt_tokens",
        ),
      },
      env: {
        model: "small (12 layers, hidden 768, 4 kv heads of 64, ~88 M params, bf16 weights)",
        workers: WORKERS,
        worker_threads: 1,
        clients: CLIENTS,
        tenants: shape.tenants,
        system_prompts: shape.prompts,
        distinct_prefixes: shape.tenants * shape.prompts,
        system_prompt_tokens: shape.promptTokens,
        user_tokens: "16-32, unique per request",
        generated_tokens: GEN_TOKENS,
        measured_requests: shape.requests,
        physical_pages_per_worker: shape.physicalPages,
        page_tokens: PAGE_TOKENS,
        chunk_tokens: CHUNK_TOKENS,
        prefix_pages: Math.ceil(shape.promptTokens / PAGE_TOKENS),
        full: "controller.routing ttft; worker.durableReuse true (checkpoint to RAM/SSD/S3 + catalog, restore from RAM/SSD/peer/S3)",
        no_reuse:
          "controller.routing ttft; worker.durableReuse false: no checkpoints and no restores — a request reuses only prefix pages still resident in its worker's page pool, everything else is recomputed",
        round_robin:
          "controller.routing round_robin (workers in turn, blind to residency); worker.durableReuse true",
        phases:
          "warm: each distinct prefix once (cold in every fleet, reported as cold_ttft); measured: the requests below from 2 closed-loop clients; TTFT, throughput, hits and restored bytes are the measured phase's, published/written bytes the whole run's",
        hits: "hit_resident_tokens: prompt tokens from the worker's own resident pages; hit_<tier>_chunks: chunks restored into pages from that tier (peer = another worker's RAM/SSD)",
        services:
          "one Kafka broker (KRaft) and one S3Proxy for the three fleets, each with its own topics and bucket",
      },
    };
  },
};
export default bench;
