import { createServer } from "node:net";
import type OpenAI from "openai";
import type { KafkaTopics } from "../catalog/kafka/admin.ts";
import { KafkaLog } from "../catalog/kafka/log.ts";
import { Replica } from "../catalog/replica.ts";
import type { FleetWorkerView } from "../controller/api/service.ts";
import { type RecordedDecision, readDecisions } from "../controller/replay/records.ts";
import { parseMetrics } from "../deploy/cluster.ts";
import type { WorkerStatus } from "../schema/control.ts";
import type { Job } from "./_cluster-workloads.ts";

/**
 * What `bench cluster` does to one running fleet: drive closed-loop clients
 * over HTTP (the official openai client, streamed, so TTFT is what a client
 * sees), read the workers' counters from the controller, and read the
 * fleet's decision records back from its catalog.
 */

/** The fleet has API tokens (one per tenant), so /metrics and /workers take a scrape token. */
export const SCRAPE_TOKEN = "bench-scrape";
const SCRAPE = { authorization: `Bearer ${SCRAPE_TOKEN}` };

export async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** A free port whose successor is free too (Kafka's broker and its KRaft controller). */
export async function freePortPair(): Promise<number> {
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

export interface Totals {
  residentHitTokens: number;
  computedTokens: number;
  restoredChunks: Record<"ram" | "ssd" | "peer" | "s3", number>;
  restoredBytes: Record<"ram" | "ssd" | "peer" | "s3", number>;
  publishedChunks: number;
  publishedBytes: number;
  prefetchedChunks: number;
  prefetchHits: number;
  prefetchSkipped: number;
}

function totals(fleet: readonly FleetWorkerView[]): Totals {
  const t: Totals = {
    residentHitTokens: 0,
    computedTokens: 0,
    restoredChunks: { ram: 0, ssd: 0, peer: 0, s3: 0 },
    restoredBytes: { ram: 0, ssd: 0, peer: 0, s3: 0 },
    publishedChunks: 0,
    publishedBytes: 0,
    prefetchedChunks: 0,
    prefetchHits: 0,
    prefetchSkipped: 0,
  };
  for (const w of fleet) {
    const s: WorkerStatus | null = w.status;
    if (s === null) throw new Error(`${w.workerId} reports no status`);
    t.residentHitTokens += s.residentHitTokens;
    t.computedTokens += s.computedTokens;
    t.publishedChunks += s.publishedChunks;
    t.publishedBytes += s.publishedBytes;
    t.prefetchedChunks += s.prefetch?.chunks ?? 0;
    t.prefetchHits += s.prefetch?.hits ?? 0;
    t.prefetchSkipped += s.prefetch?.skipped ?? 0;
    for (const k of ["ram", "ssd", "peer", "s3"] as const) {
      t.restoredChunks[k] += s.restoredChunks[k];
      t.restoredBytes[k] += s.restoredBytes[k];
    }
  }
  return t;
}

export function minus(a: Totals, b: Totals): Totals {
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
    prefetchedChunks: a.prefetchedChunks - b.prefetchedChunks,
    prefetchHits: a.prefetchHits - b.prefetchHits,
    prefetchSkipped: a.prefetchSkipped - b.prefetchSkipped,
  };
}

/**
 * The fleet's totals once every worker's heartbeat reflects all finished work:
 * two heartbeats in a row with the same counters (bounded: 30 s).
 */
export async function settledTotals(api: string): Promise<Totals> {
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

/** The controller's prompt tokens by the source its router chose (resident, ram, ssd, peer, s3, recompute). */
export async function routedTokens(api: string): Promise<Record<string, number>> {
  const m = parseMetrics(await (await fetch(`${api}/metrics`, { headers: SCRAPE })).text());
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(m)) {
    const hit = /^continuum_cache_tokens\{source="(\w+)"\}$/.exec(k);
    if (hit) out[hit[1]!] = v;
  }
  return out;
}

export interface PhaseResult {
  readonly ttftMs: number[];
  readonly wallMs: number;
  /** Prompt tokens of the requests served. */
  readonly promptTokens: number;
  /** Requests refused (no worker had room) and sent again; their TTFT counts from the first try. */
  readonly retries: number;
}

/** A request the controller refused for want of a worker with room is retried this often, this far apart. */
const NO_WORKER_RETRIES = 40;
const NO_WORKER_BACKOFF_MS = 250;

/**
 * Runs jobs from `concurrency` closed-loop clients: each takes the next job
 * when its last one finished and that job's think time has passed.
 */
export async function drive(
  clients: readonly OpenAI[],
  model: string,
  jobs: readonly Job[],
  concurrency: number,
  genTokens: number,
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
        max_tokens: genTokens,
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
      const think = jobs[i]!.thinkMs ?? 0;
      if (think > 0) await new Promise((res) => setTimeout(res, think));
    }
  };
  // Every client runs to its end before a failure is reported (none is left unhandled).
  const settled = await Promise.allSettled(Array.from({ length: concurrency }, one));
  const failed = settled.find((r) => r.status === "rejected");
  if (failed) throw (failed as PromiseRejectedResult).reason;
  return { ttftMs, wallMs: performance.now() - t0, promptTokens, retries };
}

/** The fleet's decision records, read back from its catalog topics (a replica of its own, caught up). */
export async function fleetDecisions(brokers: string, topics: KafkaTopics): Promise<RecordedDecision[]> {
  const log = await KafkaLog.open({ brokers: [brokers], clientId: "bench-cluster-decisions", topics });
  try {
    const replica = await Replica.start({ log });
    try {
      await replica.catchUp(60_000);
      return readDecisions(replica.catalog).decisions;
    } finally {
      await replica.stop();
    }
  } finally {
    await log.close();
  }
}

/** First decisions (attempt 1) routed in [fromMs, toMs) (wall clock). */
export function decisionsSince(
  decisions: readonly RecordedDecision[],
  fromMs: number,
  toMs: number,
): RecordedDecision[] {
  return decisions.filter(
    (d) => d.attempt === 1 && d.text.context!.routedAtMs >= fromMs && d.text.context!.routedAtMs < toMs,
  );
}

/** Share of decisions whose chosen worker already held the prefix: resident pages, or its own RAM/SSD copy. */
export function routedToHolderFraction(decisions: readonly RecordedDecision[]): number | null {
  const used = decisions.filter((d) => d.text.context!.published > 0);
  if (used.length === 0) return null;
  const holder = used.filter((d) => d.source === "resident" || d.source === "ram" || d.source === "ssd");
  return holder.length / used.length;
}
