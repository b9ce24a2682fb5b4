import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import OpenAI from "openai";
import type { KafkaTopics } from "../catalog/kafka/admin.ts";
import type { RecordedDecision } from "../controller/replay/records.ts";
import { predictionError } from "../controller/replay/records.ts";
import {
  type ClusterState,
  clusterDown,
  clusterUp,
  type RunningServices,
  startServices,
} from "../deploy/cluster.ts";
import type { Config } from "../schema/config.ts";
import { resolveConfig } from "../schema/config-load.ts";
import { generateModel } from "../worker/model/generate.ts";
import { loadModelDir } from "../worker/model/model-dir.ts";
import {
  decisionsSince,
  drive,
  fleetDecisions,
  freePort,
  freePortPair,
  minus,
  type PhaseResult,
  routedToHolderFraction,
  routedTokens,
  SCRAPE_TOKEN,
  settledTotals,
  type Totals,
} from "./_cluster-fleet.ts";
import {
  coldPrompts,
  type SharedShape,
  sharedWorkload,
  type Workload,
  type ZipfShape,
  zipfWorkload,
} from "./_cluster-workloads.ts";
import { cpuSecondsBetween, readCpu } from "./_proc-cpu.ts";
import { type Bench, percentile, round } from "./contract.ts";

/**
 * The whole fleet end to end: `cluster up`'s own code starts, as real
 * processes, two catalog writers, the controller and 2 workers on one real
 * Kafka broker and one real S3 server (deploy/ scripts, started once and
 * shared by every fleet below, each with its own catalog topics and bucket).
 * Requests go over HTTP through the official openai client, streamed, so
 * TTFT is what a client sees.
 *
 * Two workloads (bench/_cluster-workloads.ts), each on three fleets in turn:
 *   shared  tenants sharing a few long system prompts, 2 closed-loop clients,
 *           pools holding about one cached prefix; every worker reaches every
 *           peer's RAM;
 *   zipf    Zipf-skewed prefix popularity across tenants, every prefix
 *           computed once before measuring (the steady state), more
 *           closed-loop clients than workers, each pausing between its
 *           requests, one worker's pool and RAM tier holding about half the
 *           prefixes (the fleet's, all of them), S3 the only tier the
 *           workers share (CONTINUUM_BENCH_CLUSTER_PEER=on lets them read
 *           each other's RAM/SSD too); placement and prefetch on.
 *           bench/cluster.md says why this shape.
 * Fleets:
 *   full        TTFT routing (controller.routing: ttft), durable reuse on;
 *   no_reuse    TTFT routing, worker.durableReuse false: no checkpoints and no
 *               restores, only prefix pages still resident are reused;
 *   round_robin controller.routing: round_robin (workers in turn, blind to
 *               where prefixes are), durable reuse on.
 *
 * From each fleet's catalog the bench reads its decision records back: the
 * share of requests routed to a worker already holding their prefix, and
 * the router's prediction error against the measured TTFT. On the zipf full
 * fleet it also times warm start: the fleet's first request (a cold prompt,
 * right after `cluster up` reported ready) against the same kind of request
 * once the fleet is in steady state.
 *
 * Before the measured fleets, a discarded warm-up fleet (the first workload's
 * full variant, its warm phase and 8 requests, in its own topics, bucket and
 * folder) runs on the same broker and S3 server, so the services' warm-up is
 * not charged to whichever fleet is measured first.
 *
 * CONTINUUM_BENCH_CLUSTER=shared|zipf runs one workload only (default both).
 *
 * Model: the `small` preset (12 layers, hidden 768, ~88 M parameters): a
 * 128-token chunk (1.5 MiB) costs seconds to prefill on one core and a few ms
 * to restore, so durable reuse is there to measure (the tiny preset's prefill
 * is cheaper than a checkpoint and rightly never checkpointed).
 */

const MODEL_DIR = resolve(process.env.CONTINUUM_DATA_DIR ?? ".continuum", "models", "small");
const PAGE_TOKENS = 16;
const CHUNK_TOKENS = 128;
const GEN_TOKENS = 4;
const WORKERS = 2;
const MIB = 1 << 20;

interface Spec {
  readonly name: "shared" | "zipf";
  readonly clients: number;
  readonly physicalPages: number;
  /** store.ram.maxBytes of each worker (0: the default). */
  readonly ramBytes: number;
  /** store.dir.maxBytes of each worker (0: the default): its SSD tier, a cache of S3 kept below it. */
  readonly dirBytes: number;
  readonly peers: boolean;
  readonly shape: SharedShape | ZipfShape;
  readonly workload: (vocab: number) => Workload;
  /** Time warm start on the full fleet. */
  readonly warmStart: boolean;
}

/**
 * Pools: a worker's admission counts an accepted request's pages twice until
 * it ends (agent.ts: conservative), so a pool takes a second concurrent
 * request only with 2 × request + one more request of room; beyond that it
 * holds few cached prefixes.
 */
function specs(quick: boolean, peerSwitch: boolean): Spec[] {
  const shared: SharedShape = quick
    ? { tenants: 6, prompts: 2, promptTokens: 384, requests: 24 }
    : { tenants: 6, prompts: 3, promptTokens: 768, requests: 48 };
  const zipf: ZipfShape = quick
    ? { tenants: 4, prompts: 6, promptTokens: 384, requests: 128, s: 0.8, thinkMs: 400 }
    : { tenants: 4, prompts: 8, promptTokens: 512, requests: 192, s: 0.8, thinkMs: 400 };
  return [
    {
      name: "shared",
      clients: 2,
      physicalPages: quick ? 96 : 160,
      ramBytes: 0,
      dirBytes: 0,
      peers: true,
      shape: shared,
      workload: (v) => sharedWorkload(shared, v),
      warmStart: false,
    },
    {
      name: "zipf",
      clients: quick ? 4 : 6,
      // About three requests at a time per worker (counted twice) and a few prefixes of 24–32 pages beside them.
      physicalPages: quick ? 192 : 256,
      // A few prefixes of 4.5–6 MiB per worker's RAM tier.
      ramBytes: quick ? 24 * MIB : 48 * MIB,
      // Chunk files for about half the working set (24 × 4.5 MiB quick, 32 × 6 MiB full), as the pool and RAM.
      dirBytes: quick ? 54 * MIB : 96 * MIB,
      peers: peerSwitch,
      shape: zipf,
      workload: (v) => zipfWorkload(zipf, v),
      warmStart: true,
    },
  ];
}

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

const tenantKey = (t: number) => `bench-tenant-${t}-key`;

interface VariantResult {
  readonly cold: PhaseResult;
  readonly measured: PhaseResult;
  /** The measured phase's hits and restores. */
  readonly work: Totals;
  /** The whole run's (warm + measured): checkpoints happen mostly while prefixes are first computed. */
  readonly total: Totals;
  readonly routedTokens: Record<string, number>;
  /** The measured phase's first decisions, from the fleet's catalog. */
  readonly decisions: RecordedDecision[];
  /** Warm start: the fleet's first request and steady-state requests of the same kind (ms). */
  readonly firstRequestTtftMs: number | null;
  readonly steadyTtftMs: number | null;
  /** CPU seconds in the measured phase: the machine's, each fleet process's, and the rest (services, bench). */
  readonly cpuS: Record<string, number | null>;
}

function fleetConfig(
  spec: Spec,
  v: Variant,
  run: string,
  ports: { http: number; worker: number; peer: number },
) {
  const base = resolveConfig({}, {});
  const tokens: Record<string, string> = {};
  for (let t = 0; t < spec.shape.tenants; t++) tokens[tenantKey(t)] = `tenant-${t}`;
  const topicBase = `bench-${run}-${spec.name}-${v.name}`;
  const topics: KafkaTopics = {
    proposals: `${topicBase}.proposals`,
    tx: `${topicBase}.tx`,
    rejections: `${topicBase}.rejections`,
  };
  const ram = spec.ramBytes > 0 ? spec.ramBytes : base.store.ram.maxBytes;
  const placed = Math.max(0, ram - 4 * CHUNK_TOKENS * 12_288);
  const config: Config = {
    ...base,
    model: { ...base.model, dir: MODEL_DIR, preset: "small" },
    pages: { pageTokens: PAGE_TOKENS, physicalPages: spec.physicalPages, chunkTokens: CHUNK_TOKENS },
    store: {
      ...base.store,
      ram: { maxBytes: ram },
      dir: { ...base.store.dir, ...(spec.dirBytes > 0 && { maxBytes: spec.dirBytes }) },
      s3: { ...base.store.s3, bucket: `bench-${run}-${spec.name}-${v.name.replace("_", "-")}` },
    },
    catalog: { ...base.catalog, topics },
    controller: {
      ...base.controller,
      httpPort: ports.http,
      workerPort: ports.worker,
      routing: v.routing,
      // A prefill of seconds on a shared core must not read as a stuck worker.
      heartbeatTtlMs: 10_000,
      residentFreshMs: 5_000,
      offerTimeoutMs: 30_000,
      progressTimeoutMs: 300_000,
      placement: {
        ...base.controller.placement,
        intervalMs: 1_000,
        leaseTtlMs: 5_000,
        halfLifeMs: 60_000,
        demandWindowMs: 1_000,
        ramBytesPerWorker: placed,
        ssdBytesPerWorker: 0,
      },
    },
    worker: {
      ...base.worker,
      peerPortBase: ports.peer,
      threads: 1,
      durableReuse: v.durableReuse,
      peerTransfer: spec.peers,
      prefetch: { ...base.worker.prefetch, ramBytes: placed, retryMs: 1_000 },
    },
    auth: { ...base.auth, tokens, clusterSecret: "", metricsToken: SCRAPE_TOKEN },
  };
  return { config, topics };
}

async function runVariant(
  spec: Spec,
  v: Variant,
  vocab: number,
  services: RunningServices,
  run: string,
  root: string,
  log: (l: string) => void,
): Promise<VariantResult> {
  const ports = { http: await freePort(), worker: await freePort(), peer: await freePort() };
  const { config, topics } = fleetConfig(spec, v, run, ports);
  const tag = `${spec.name}/${v.name}`;
  const state: ClusterState = await clusterUp({
    dir: join(root, spec.name, v.name),
    workers: WORKERS,
    config,
    kafkaPort: 0,
    s3Port: 0,
    readyTimeoutMs: 300_000,
    progress: (l) => log(`  ${tag}: ${l}`),
    services,
  });
  try {
    const clients = Array.from(
      { length: spec.shape.tenants },
      (_, t) =>
        new OpenAI({ baseURL: `${state.api}/v1`, apiKey: tenantKey(t), maxRetries: 0, timeout: 600_000 }),
    );
    const model = (await clients[0]!.models.list()).data[0]!.id;
    const { warm, measured } = spec.workload(vocab);
    const probes = coldPrompts(4, spec.shape.promptTokens + 24, vocab, 0xc01d);
    const probe = async (tokens: readonly number[]) =>
      (await drive(clients, model, [{ tenant: 0, prompt: -1, tokens }], 1, GEN_TOKENS)).ttftMs[0]!;
    const warmStart = spec.warmStart && v.name === "full";
    const firstRequestTtftMs = warmStart ? await probe(probes[0]!) : null;
    log(`  ${tag}: warm phase, ${warm.length} prefixes once each`);
    const cold = await drive(clients, model, warm, spec.clients, GEN_TOKENS);
    const before = await settledTotals(state.api);
    const routedBefore = await routedTokens(state.api);
    log(`  ${tag}: measured phase, ${measured.length} requests from ${spec.clients} clients`);
    const pids = new Map(state.processes.map((p) => [p.name.replace(/-/g, "_"), p.pid]));
    const cpuFrom = readCpu(pids);
    const measuredFrom = Date.now();
    const m = await drive(clients, model, measured, spec.clients, GEN_TOKENS);
    const measuredTo = Date.now();
    const cpuS = cpuSecondsBetween(cpuFrom, readCpu(pids));
    log(
      `  ${tag}: CPU s in ${((measuredTo - measuredFrom) / 1000).toFixed(1)} s: ${Object.entries(cpuS)
        .map(([k, v]) => `${k} ${v === null ? "?" : v.toFixed(1)}`)
        .join(", ")}`,
    );
    const after = await settledTotals(state.api);
    const routedAfter = await routedTokens(state.api);
    const routed: Record<string, number> = {};
    for (const [k, n] of Object.entries(routedAfter)) routed[k] = n - (routedBefore[k] ?? 0);
    let steadyTtftMs: number | null = null;
    if (warmStart) {
      const steady: number[] = [];
      for (const p of probes.slice(1)) steady.push(await probe(p));
      steadyTtftMs = steady.reduce((a, b) => a + b, 0) / steady.length;
    }
    // The controller proposes decisions in batches every second: let the last ones land.
    await new Promise((r) => setTimeout(r, 2_500));
    const all = await fleetDecisions(services.brokers, topics);
    const decisions = decisionsSince(all, measuredFrom, measuredTo);
    // Kept for a post-mortem with the logs (CONTINUUM_KEEP_BENCH_LOGS): the measured decisions, parsed.
    if (process.env.CONTINUUM_KEEP_BENCH_LOGS)
      await writeFile(join(root, spec.name, v.name, "decisions.json"), JSON.stringify(decisions));
    return {
      cold,
      measured: m,
      work: minus(after, before),
      total: after,
      routedTokens: routed,
      decisions,
      firstRequestTtftMs,
      steadyTtftMs,
      cpuS,
    };
  } finally {
    await clusterDown(state, () => undefined);
  }
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

/**
 * The broker and the S3 server stand in for remote services but share this
 * host's cores with the fleet: at nice 10 they run when a worker waits, and
 * do not preempt its steps (no_reuse, which sends S3 nothing, would otherwise
 * win by the S3 server's CPU alone).
 */
const SERVICES_NICENESS = 10;

/** Measured requests of the discarded warm-up fleet. */
const WARMUP_REQUESTS = 8;

/** `spec` cut to a warm-up: its warm phase and its first WARMUP_REQUESTS requests, no warm-start probe. */
function warmupSpec(spec: Spec): Spec {
  return {
    ...spec,
    warmStart: false,
    workload: (v) => {
      const w = spec.workload(v);
      return { ...w, measured: w.measured.slice(0, WARMUP_REQUESTS) };
    },
  };
}

const mean = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);

/** One workload's figures, named `<prefix><variant>_<figure>`. */
function workloadFigures(
  prefix: string,
  results: Record<Variant["name"], VariantResult>,
): Record<string, number | null> {
  const figures: Record<string, number | null> = {};
  for (const v of VARIANTS) {
    const r = results[v.name];
    const m = r.measured;
    const f = (k: string, x: number | null) => {
      figures[`${prefix}${v.name}_${k}`] = x === null ? null : round(x);
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
    const err = predictionError(r.decisions);
    f("decisions", r.decisions.length);
    f("routed_to_holder_fraction", routedToHolderFraction(r.decisions));
    f("prediction_error_p90", err.relativeErrorP90);
    f("prediction_within_25pct", err.withinQuarter);
    for (const [term, t] of Object.entries(err.terms))
      f(`${term}_measured_over_predicted`, t.measuredOverPredicted);
    f("prefetched_chunks", r.work.prefetchedChunks);
    f("prefetch_hits", r.work.prefetchHits);
    f("prefetch_skipped", r.work.prefetchSkipped);
    if (r.firstRequestTtftMs !== null) f("first_request_ttft_ms", r.firstRequestTtftMs);
    if (r.steadyTtftMs !== null) f("steady_cold_ttft_ms", r.steadyTtftMs);
    for (const [k, s] of Object.entries(r.cpuS)) f(`cpu_s_${k}`, s);
  }
  return figures;
}

const bench: Bench = {
  summary:
    "the fleet end to end (real Kafka, S3, writers, controller, 2 workers): shared system prompts and a Zipf-skewed multi-tenant workload; full vs no durable reuse vs round-robin",
  async run({ quick, log }) {
    const only = process.env.CONTINUUM_BENCH_CLUSTER;
    if (only !== undefined && only !== "shared" && only !== "zipf")
      throw new Error(`CONTINUUM_BENCH_CLUSTER must be shared or zipf, got '${only}'`);
    const peerEnv = process.env.CONTINUUM_BENCH_CLUSTER_PEER ?? "off";
    if (peerEnv !== "on" && peerEnv !== "off")
      throw new Error(`CONTINUUM_BENCH_CLUSTER_PEER must be on or off, got '${peerEnv}'`);
    const chosen = specs(quick, peerEnv === "on").filter((s) => only === undefined || s.name === only);
    const vocab = await ensureSmallModel(log);
    if (vocab < 8000)
      throw new Error(`the small preset's vocabulary (${vocab}) is smaller than the workload's`);
    const root = await mkdtemp(join(tmpdir(), "continuum-bench-cluster-"));
    const run = Date.now().toString(36);
    log(`starting Kafka and S3 once for every fleet (${root})`);
    const services = await startServices({
      dir: root,
      kafkaPort: await freePortPair(),
      s3Port: await freePort(),
      niceness: SERVICES_NICENESS,
      progress: (l) => log(`  ${l}`),
    });
    const results: Partial<Record<Spec["name"], Record<Variant["name"], VariantResult>>> = {};
    try {
      // The broker and the S3 server (JVMs) warm up under the first fleet's traffic, and on a
      // shared host that fleet's requests pay for it, whichever variant runs first. A
      // discarded fleet takes that cost, so no measured one does.
      const first = chosen[0]!;
      log(`warm-up fleet '${first.name}/full' (discarded): ${WARMUP_REQUESTS} requests`);
      await runVariant(
        warmupSpec(first),
        VARIANTS[0]!,
        vocab,
        services,
        `${run}w`,
        join(root, "warmup"),
        log,
      );
      for (const spec of chosen) {
        const byVariant: Partial<Record<Variant["name"], VariantResult>> = {};
        for (const v of VARIANTS) {
          log(
            `fleet '${spec.name}/${v.name}': routing ${v.routing}, durable reuse ${v.durableReuse ? "on" : "off"}`,
          );
          const r = await runVariant(spec, v, vocab, services, run, root, log);
          byVariant[v.name] = r;
          log(
            `  ${spec.name}/${v.name}: TTFT mean ${round(mean(r.measured.ttftMs))} ms, p50 ${round(percentile(r.measured.ttftMs, 50))} ms, p99 ${round(percentile(r.measured.ttftMs, 99))} ms; cold mean ${round(mean(r.cold.ttftMs))} ms`,
          );
        }
        results[spec.name] = byVariant as Record<Variant["name"], VariantResult>;
      }
    } finally {
      await services.stop();
      // CONTINUUM_KEEP_BENCH_LOGS=1 keeps the fleets' logs and data for a post-mortem.
      if (process.env.CONTINUUM_KEEP_BENCH_LOGS) log(`kept ${root}`);
      else await rm(root, { recursive: true, force: true });
    }
    const figures: Record<string, number | null> = {
      ...(results.shared ? workloadFigures("", results.shared) : {}),
      ...(results.zipf ? workloadFigures("zipf_", results.zipf) : {}),
    };
    const ratio = (a: string, b: string) => {
      const x = figures[a];
      const y = figures[b];
      return x !== undefined && x !== null && y !== undefined && y !== null && y > 0 ? round(x / y) : null;
    };
    const ratios: Record<string, number | null> = {};
    if (results.shared) {
      ratios.ttft_mean_full_over_no_reuse = ratio("full_ttft_mean_ms", "no_reuse_ttft_mean_ms");
      ratios.ttft_p50_full_over_no_reuse = ratio("full_ttft_p50_ms", "no_reuse_ttft_p50_ms");
      ratios.ttft_p99_full_over_no_reuse = ratio("full_ttft_p99_ms", "no_reuse_ttft_p99_ms");
      ratios.ttft_mean_full_over_round_robin = ratio("full_ttft_mean_ms", "round_robin_ttft_mean_ms");
      ratios.ttft_p50_full_over_round_robin = ratio("full_ttft_p50_ms", "round_robin_ttft_p50_ms");
      ratios.ttft_p99_full_over_round_robin = ratio("full_ttft_p99_ms", "round_robin_ttft_p99_ms");
      ratios.throughput_full_over_no_reuse = ratio("full_requests_per_s", "no_reuse_requests_per_s");
      ratios.throughput_full_over_round_robin = ratio("full_requests_per_s", "round_robin_requests_per_s");
      ratios.computed_tokens_full_over_no_reuse = ratio(
        "full_computed_prompt_tokens",
        "no_reuse_computed_prompt_tokens",
      );
    }
    if (results.zipf) {
      const p = "zipf_";
      ratios[`${p}ttft_mean_full_over_round_robin`] = ratio(
        `${p}full_ttft_mean_ms`,
        `${p}round_robin_ttft_mean_ms`,
      );
      ratios[`${p}ttft_p99_full_over_round_robin`] = ratio(
        `${p}full_ttft_p99_ms`,
        `${p}round_robin_ttft_p99_ms`,
      );
      ratios[`${p}ttft_mean_full_over_no_reuse`] = ratio(
        `${p}full_ttft_mean_ms`,
        `${p}no_reuse_ttft_mean_ms`,
      );
      ratios[`${p}ttft_p99_full_over_no_reuse`] = ratio(`${p}full_ttft_p99_ms`, `${p}no_reuse_ttft_p99_ms`);
      ratios.first_request_ttft_over_steady = ratio(
        `${p}full_first_request_ttft_ms`,
        `${p}full_steady_cold_ttft_ms`,
      );
      // The headline figures the issue names: the zipf workload's full fleet.
      figures.routed_to_holder_fraction = figures[`${p}full_routed_to_holder_fraction`] ?? null;
      figures.prediction_error_p90 = figures[`${p}full_prediction_error_p90`] ?? null;
      figures.prefetch_hits = figures[`${p}full_prefetch_hits`] ?? null;
    }
    return {
      figures,
      ratios,
      env: {
        model: "small (12 layers, hidden 768, 4 kv heads of 64, ~88 M params, bf16 weights)",
        workers: WORKERS,
        worker_threads: 1,
        generated_tokens: GEN_TOKENS,
        page_tokens: PAGE_TOKENS,
        chunk_tokens: CHUNK_TOKENS,
        workloads: Object.fromEntries(
          chosen.map((s) => [
            s.name,
            {
              ...s.shape,
              clients: s.clients,
              physical_pages_per_worker: s.physicalPages,
              ram_tier_bytes: s.ramBytes || "default (1 GiB)",
              peer_transfer: s.peers,
              prefix_pages: Math.ceil(s.shape.promptTokens / PAGE_TOKENS),
            },
          ]),
        ),
        full: "controller.routing ttft; worker.durableReuse true (checkpoint to RAM/SSD/S3 + catalog, restore); placement and prefetch on",
        no_reuse:
          "controller.routing ttft; worker.durableReuse false: no checkpoints, no restores, no prefetch — only prefix pages still resident are reused",
        round_robin:
          "controller.routing round_robin (workers in turn, blind to residency); worker.durableReuse true",
        phases:
          "warm: prefixes once each (cold in every fleet, reported as cold_ttft); measured: the requests from closed-loop clients; TTFT, throughput, hits, restored bytes, decisions and prefetch figures are the measured phase's, published/written bytes the whole run's",
        decisions:
          "from each fleet's catalog: routed_to_holder_fraction = requests whose prefix was published that went to a worker holding it (resident pages or its own RAM/SSD copy); prediction_error_p90 = p90 of |predicted − measured| / measured TTFT (controller: offer → first token); <term>_measured_over_predicted from the workers' split of their time",
        warm_start:
          "zipf full fleet: first_request_ttft = its first request (a cold prompt) right after cluster up reported every worker ready; steady_cold_ttft = the mean of three such requests after the measured phase, one at a time",
        services: `one Kafka broker (KRaft) and one S3Proxy for every fleet, each with its own topics and bucket, both at nice ${SERVICES_NICENESS}`,
      },
    };
  },
};
export default bench;
