import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { loadavg } from "node:os";
import { fileURLToPath } from "node:url";
import { CatalogDb } from "../catalog/db.ts";
import { DEFAULT_WRITER_TX } from "../catalog/kafka/lease.ts";
import { KafkaLog } from "../catalog/kafka/log.ts";
import { DEFAULT_PROPOSAL_SEND } from "../catalog/kafka/proposer.ts";
import { TX_BATCH } from "../catalog/kafka/records.ts";
import type { FullCatalogLog } from "../catalog/log.ts";
import { EmbeddedLog } from "../catalog/log-embedded.ts";
import {
  chainNodeIds,
  longestPublishedPrefix,
  longestPublishedPrefixOfChain,
  type PublishedPrefix,
  readyPrefixByWorkerTier,
  readyReplicasOfChunk,
} from "../catalog/queries.ts";
import { Replica } from "../catalog/replica.ts";
import { CatalogWriter } from "../catalog/writer.ts";
import { NODE_HEAP_FLAGS } from "../deploy/node-flags.ts";
import { type CatalogOp, type Proposal, ProposalMsg } from "../schema/catalog.ts";
import { catalogNodeId } from "../schema/identity.ts";
import { silentLogger } from "../schema/log.ts";
import { encodeMessage } from "../schema/wire.ts";
import {
  CHUNK,
  chain,
  fp,
  publication,
  publications,
  publicationWaves,
  setup,
  TIERS,
  WORKERS,
} from "./_catalog-workload.ts";
import { type Bench, type BenchOptions, percentile, round } from "./contract.ts";

/**
 * The catalog benchmark; bench/catalog.md says what each figure measures,
 * the goals, and the measurements behind the Kafka transport's constants.
 *  - publications/s end to end: proposal encoded and appended → writer
 *    resolves and commits → replica applies (one publication = a chunk and
 *    its ready replica, one proposal; beside it, 16 per proposal). Through
 *    real Kafka when CONTINUUM_KAFKA_BROKERS is set (the writer in its own
 *    process, as in a fleet; proposer and replica here), else through the
 *    embedded log (all three in this process).
 *  - a warm-up first (a throughput run and a short run at the lag rate on
 *    fresh topics), reported apart as warmup_*.
 *  - replica apply lag p50/p99 at a fixed offered rate (5,000/s), after a
 *    settle period that is offered but not counted.
 *  - lookup p50/p99 on a catalog of 200,000 chunks, and the apply rates of
 *    the two replica modes.
 * CONTINUUM_BENCH_CATALOG=e2e shrinks the in-process parts for profiling the
 * pipeline alone; =lag runs the warm-up and the lag run only.
 */

const WRITER = fileURLToPath(new URL("./_catalog-writer.ts", import.meta.url));

interface Pipeline {
  readonly log: FullCatalogLog;
  readonly transport: string;
  readonly replica: Replica;
  /** CPU µs the writer process has used so far; null when it shares this process (embedded). */
  writerCpuUs(): number | null;
  close(): Promise<void>;
}

/**
 * CPU time (user + system) of another process from /proc/PID/stat, in µs;
 * null where /proc is not readable. Fields 14 and 15 (utime, stime) count
 * USER_HZ ticks, 100 per second on Linux's x86 and arm ABIs: 10 ms
 * resolution, fine over runs of seconds.
 */
function processCpuUs(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) * 10_000;
  } catch {
    return null;
  }
}

/**
 * The log, a writer and one replica. On Kafka (CONTINUUM_KAFKA_BROKERS) the
 * writer runs in its own process, as in a fleet; on the embedded log all
 * three share this process, as in the single-process default.
 */
async function pipeline(): Promise<Pipeline> {
  const brokers = process.env.CONTINUUM_KAFKA_BROKERS;
  let log: FullCatalogLog;
  let stopWriter: () => Promise<void>;
  let transport: string;
  let writerPid: number | undefined;
  if (brokers) {
    const s = randomUUID().slice(0, 8);
    const topics = {
      proposals: `bench-${s}.proposals`,
      tx: `bench-${s}.tx`,
      rejections: `bench-${s}.rejections`,
    };
    log = await KafkaLog.open({ brokers: brokers.split(","), clientId: `bench-${s}`, topics });
    // `node --cpu-prof …` profiles the writer too (its profile lands beside this process's).
    const prof = process.execArgv.filter((a) => a.startsWith("--cpu-prof"));
    const child = spawn(
      process.execPath,
      [...prof, ...NODE_HEAP_FLAGS, "--import", "tsx", WRITER, brokers, JSON.stringify(topics)],
      {
        stdio: ["ignore", "pipe", "inherit"],
      },
    );
    await new Promise<void>((resolve, reject) => {
      child.once("exit", (code) => reject(new Error(`bench writer exited with ${code}`)));
      child.stdout!.once("data", () => resolve());
    });
    child.removeAllListeners("exit");
    writerPid = child.pid;
    stopWriter = async () => {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await exited;
    };
    transport = "kafka (writer in its own process)";
  } else {
    log = await EmbeddedLog.open();
    const writer = new CatalogWriter({ log, newDb: () => CatalogDb.empty(), logger: silentLogger });
    const running = writer.run();
    stopWriter = async () => {
      await writer.stop();
      await running;
    };
    transport = "embedded, in-memory (proposer, writer and replica in one process)";
  }
  const replica = await Replica.start({ log });
  await log.propose(encodeMessage(ProposalMsg, setup()));
  await replica.waitFor(1, 120_000);
  return {
    log,
    transport,
    replica,
    writerCpuUs: () => processCpuUs(writerPid),
    close: async () => {
      await replica.stop();
      await stopWriter();
      await log.close();
    },
  };
}

interface Throughput {
  readonly perS: number;
  /** CPU µs per publication of this process (proposer and replica; on the embedded log the writer too). */
  readonly cpuUsMain: number;
  /** CPU µs per publication of the writer process; null on the embedded log. */
  readonly cpuUsWriter: number | null;
}

/** Publications/s: all proposed as fast as the log takes them, until the replica has applied the last. */
async function throughput(p: Pipeline, n: number, perProposal = 1): Promise<Throughput> {
  // Chains of 16 chunks: n/16 independent proposals per wave, 16/perProposal waves.
  const waves = publicationWaves(n, `tp-${randomUUID().slice(0, 6)}`, 16, perProposal);
  let target = p.replica.offset();
  const cpu0 = process.cpuUsage();
  const writer0 = p.writerCpuUs();
  const t0 = performance.now();
  for (const wave of waves) {
    // At most 2,000 unacknowledged proposals (bounded memory).
    for (let i = 0; i < wave.length; i += 2_000) {
      await Promise.all(
        wave.slice(i, i + 2_000).map((prop) => p.log.propose(encodeMessage(ProposalMsg, prop))),
      );
    }
    target += wave.length;
    await p.replica.waitFor(target, 300_000);
  }
  const perS = (n / (performance.now() - t0)) * 1000;
  const cpu = process.cpuUsage(cpu0);
  const writer1 = p.writerCpuUs();
  return {
    perS,
    cpuUsMain: (cpu.user + cpu.system) / n,
    cpuUsWriter: writer0 === null || writer1 === null ? null : (writer1 - writer0) / n,
  };
}

/**
 * `count` lag-run proposals, encoded before the clock starts into one
 * buffer (proposal i at bytes[offsets[i], offsets[i + 1])) with ids
 * `${tag}-${i}`. Made during the run, they cost this process ~20 µs each of
 * hashing and encoding (a tenth of a core at 5,000/s) on the two cores the
 * pipeline it measures runs on; one buffer and one offset array hold them
 * without adding objects for the collector to trace.
 */
function encodedLagProposals(count: number, tag: string): { bytes: Buffer; offsets: Uint32Array } {
  // Chains of 4: a wave is a quarter of the run (≥ 1 s at 5,000/s over 4 s), far longer than the lag, so parents are applied before children are offered.
  const ps = publications(count, tag, 4);
  const offsets = new Uint32Array(count + 1);
  let bytes = Buffer.allocUnsafeSlow(count * 512);
  for (let i = 0; i < count; i++) {
    const m = encodeMessage(ProposalMsg, { ...ps.next().value!.proposal, id: `${tag}-${i}` });
    if (offsets[i]! + m.length > bytes.length) {
      const grown = Buffer.allocUnsafeSlow(bytes.length * 2);
      bytes.copy(grown, 0, 0, offsets[i]);
      bytes = grown;
    }
    bytes.set(m, offsets[i]);
    offsets[i + 1] = offsets[i]! + m.length;
  }
  return { bytes, offsets };
}

/**
 * Apply lag at a fixed offered rate: proposals paced in 5 ms slots.
 *
 * The harness shares its process with the replica it measures, so it keeps
 * its own work and garbage small: proposals are encoded before the clock
 * starts (encodedLagProposals), send times go to a preallocated array indexed
 * by the number in the proposal id, acknowledgements are counted rather than
 * collected, and lags go to a preallocated array. (Holding a second of
 * acknowledgement promises and every send time in maps promoted them to the
 * old generation and forced collections of the very heap whose pauses the
 * lag should show.)
 */
async function lag(
  p: Pipeline,
  ratePerS: number,
  seconds: number,
  settleSeconds: number,
): Promise<{
  p50: number;
  p99: number;
  max: number;
  n: number;
  complete: boolean;
  cpuUsMain: number;
  cpuUsWriter: number | null;
}> {
  // Proposals offered while settling are applied like the rest but not timed.
  const settle = Math.round(ratePerS * settleSeconds);
  const n = settle + Math.round(ratePerS * seconds);
  const tag = `lag-${randomUUID().slice(0, 6)}`;
  const { bytes, offsets } = encodedLagProposals(n, tag);
  const idPrefix = `${tag}-`;
  const sentAt = new Float64Array(n);
  const lags = new Float64Array(n - settle);
  let measured = 0;
  const off = p.replica.listen((reports) => {
    const now = performance.now();
    for (const r of reports) {
      const id = r.tx.proposalId;
      if (!id.startsWith(idPrefix)) continue;
      const i = Number(id.slice(idPrefix.length));
      if (i >= settle) lags[measured++] = now - sentAt[i]!;
    }
  });
  const target = p.replica.offset() + n;
  const slotMs = 5;
  const perSlot = (ratePerS * slotMs) / 1000;
  // At most this many proposals offered and not yet acknowledged by the log.
  const maxUnacked = 5_000;
  let unacked = 0;
  let ackFailure: unknown;
  const acked = () => {
    unacked--;
  };
  const failed = (err: unknown) => {
    unacked--;
    ackFailure ??= err;
  };
  const cpu0 = process.cpuUsage();
  const writer0 = p.writerCpuUs();
  const t0 = performance.now();
  let i = 0;
  while (i < n) {
    // Offer everything due by now: (elapsed / 1000) × rate proposals in total.
    const due = Math.min(n, Math.floor(((performance.now() - t0) / 1000) * ratePerS) + Math.ceil(perSlot));
    for (; i < due && unacked < maxUnacked; i++) {
      sentAt[i] = performance.now();
      unacked++;
      p.log.propose(bytes.subarray(offsets[i], offsets[i + 1])).then(acked, failed);
    }
    if (ackFailure !== undefined) throw ackFailure;
    await new Promise((r) => setTimeout(r, slotMs));
  }
  while (unacked > 0 && ackFailure === undefined) await new Promise((r) => setTimeout(r, slotMs));
  if (ackFailure !== undefined) throw ackFailure;
  // A child offered before its parent was applied is rejected and never arrives: report, do not hang.
  const complete = await p.replica.waitFor(target, 60_000).then(
    () => true,
    () => false,
  );
  off();
  const cpu = process.cpuUsage(cpu0);
  const writer1 = p.writerCpuUs();
  const samples = Array.from(lags.subarray(0, measured));
  return {
    p50: percentile(samples, 50),
    p99: percentile(samples, 99),
    max: percentile(samples, 100),
    n: measured,
    complete,
    cpuUsMain: (cpu.user + cpu.system) / n,
    cpuUsWriter: writer0 === null || writer1 === null ? null : (writer1 - writer0) / n,
  };
}

/** A catalog of `chunks` chunks in 128-chunk chains (each chunk with 1–2 ready replicas), built by resolve + apply. */
function bigCatalog(chunks: number, log: (l: string) => void): { db: CatalogDb; chains: number } {
  const db = CatalogDb.empty();
  const apply = (p: Proposal) => {
    const r = db.resolve(p, 0);
    if (!r.ok) throw new Error(`bench catalog: ${r.reason}`);
    db.apply({ txNo: db.nextTxNo, proposalId: p.id, clientId: p.clientId, time: 0, datoms: r.datoms });
  };
  apply(setup());
  const chains = Math.ceil(chunks / 128);
  let made = 0;
  for (let c = 0; c < chains && made < chunks; c++) {
    const ops: CatalogOp[] = [];
    for (const n of chain(c, 128)) {
      if (made >= chunks) break;
      const [pub, rep] = publication(n, WORKERS[c % 4]!, TIERS[c % 4]!, "x").ops;
      ops.push(pub!, rep!);
      if (c % 3 === 0)
        ops.push({
          op: "replica.ready",
          node: catalogNodeId(fp, n.hash),
          worker: WORKERS[(c + 1) % 4]!,
          tier: "s3",
          verifiedAt: 0,
        });
      made++;
    }
    apply({ id: `big-${c}`, clientId: "bench", ops });
    if (c % 400 === 0) log(`  catalog: ${made} chunks`);
  }
  return { db, chains };
}

/**
 * One lookup = longest published prefix of a 128-chunk chain + ready runs by
 * worker and tier + ready replicas of its deepest chunk. Two ways to the
 * chunks, timed alternately: the model's prefix index (no hashing), and node
 * ids computed from the chain (128 sha256) then the node index.
 */
function lookups(
  db: CatalogDb,
  chains: number,
  samples: number,
): { p50: number; p99: number; p50ViaNodeIds: number; p99ViaNodeIds: number } {
  const byPrefix: number[] = [];
  const viaNodeIds: number[] = [];
  let sink = 0;
  const rest = (prefix: PublishedPrefix) => {
    const runs = readyPrefixByWorkerTier(db, prefix);
    const last = prefix.chunks[prefix.chunks.length - 1];
    const ready = last === undefined ? [] : readyReplicasOfChunk(db, last);
    sink += prefix.length + runs.size + ready.length;
  };
  for (let s = 0; s < samples; s++) {
    const ch = chain((s * 7919) % chains, 128);
    const t0 = performance.now();
    rest(longestPublishedPrefixOfChain(db, fp, ch));
    const t1 = performance.now();
    rest(longestPublishedPrefix(db, chainNodeIds(fp, ch)));
    const t2 = performance.now();
    byPrefix.push(t1 - t0);
    viaNodeIds.push(t2 - t1);
  }
  if (sink === 0) throw new Error("bench lookups found nothing");
  return {
    p50: percentile(byPrefix, 50),
    p99: percentile(byPrefix, 99),
    p50ViaNodeIds: percentile(viaNodeIds, 50),
    p99ViaNodeIds: percentile(viaNodeIds, 99),
  };
}

/** Apply rate of a replica's db over pre-resolved txs; `eager` folds each batch of 1,000 into DataScript. */
function applyRate(n: number, eager: boolean): number {
  const writer = CatalogDb.empty();
  const txs = [setup(), ...publicationWaves(n, "apply", 64).flat()].map((p) => {
    const r = writer.resolve(p, 0);
    if (!r.ok) throw new Error(r.reason);
    const tx = { txNo: writer.nextTxNo, proposalId: p.id, clientId: p.clientId, time: 0, datoms: r.datoms };
    writer.apply(tx);
    return tx;
  });
  const db = CatalogDb.empty();
  db.apply(txs[0]!);
  db.datalog();
  const t0 = performance.now();
  for (let i = 1; i < txs.length; i++) {
    db.apply(txs[i]!);
    if (eager && i % 1000 === 0) db.datalog();
  }
  if (eager) db.datalog();
  return (n / (performance.now() - t0)) * 1000;
}

const bench: Bench = {
  summary:
    "catalog: publications/s end to end, replica lag at 5,000/s, prefix+replica lookup on 200,000 chunks",
  async run(opts: BenchOptions) {
    const q = opts.quick;
    const log = opts.log;
    const figures: Record<string, number | string | boolean | null> = {};
    const loadAtStart = loadavg()[0]!;
    // For profiling the pipeline alone (`node --cpu-prof`): CONTINUUM_BENCH_CATALOG=e2e skips the
    // in-process apply rates and lookups; =lag also skips the throughput runs (the lag run alone).
    const mode = process.env.CONTINUUM_BENCH_CATALOG;
    const lagOnly = mode === "lag";
    const e2eOnly = mode === "e2e" || lagOnly;

    log("apply rates (pre-resolved txs, one replica db)…");
    const applyN = e2eOnly ? 1_000 : q ? 10_000 : 40_000;
    const lazy = applyRate(applyN, false);
    const eager = applyRate(applyN, true);
    figures.replica_apply_pubs_per_s = round(lazy);
    figures.replica_apply_datascript_eager_pubs_per_s = round(eager);

    const p = await pipeline();
    try {
      figures.transport = p.transport;
      // Warm-up, reported apart: a fresh broker and fresh topics (segments, JIT, coordinators) meet this
      // load for the first time; the measured runs below follow it.
      log(`warm-up through ${p.transport}…`);
      const w0 = performance.now();
      const warm = await throughput(p, q ? 2_000 : 20_000);
      const warmLag = await lag(p, 5_000, q ? 1 : 4, 0);
      figures.warmup_publications_per_s = round(warm.perS);
      figures.warmup_lag_p99_ms = round(warmLag.p99);
      figures.warmup_s = round((performance.now() - w0) / 1000);
      log(`end to end through ${p.transport}…`);
      if (!lagOnly) {
        const one = await throughput(p, q ? 20_000 : 60_000);
        figures.publications_per_s = round(one.perS);
        // CPU per publication by process (a 2-core machine runs out of CPU before anything waits).
        figures.cpu_us_per_publication_main = round(one.cpuUsMain);
        figures.cpu_us_per_publication_writer = one.cpuUsWriter === null ? null : round(one.cpuUsWriter);
        // A worker's checkpoint publishes a captured range at once: 16 chunks (4,096 tokens) per proposal.
        const sixteen = await throughput(p, q ? 20_000 : 60_000, 16);
        figures.publications_16_per_proposal_per_s = round(sixteen.perS);
        figures.cpu_us_per_publication_16_main = round(sixteen.cpuUsMain);
        figures.cpu_us_per_publication_16_writer =
          sixteen.cpuUsWriter === null ? null : round(sixteen.cpuUsWriter);
      }
      log("lag at 5,000/s…");
      const l = await lag(p, 5_000, q ? 4 : 15, q ? 1 : 5);
      figures.lag_offered_per_s = 5_000;
      figures.lag_settle_s = q ? 1 : 5;
      figures.lag_p50_ms = round(l.p50);
      figures.lag_p99_ms = round(l.p99);
      figures.lag_max_ms = round(l.max);
      figures.lag_samples = l.n;
      figures.lag_all_applied = l.complete;
      // At 5,000/s requests carry few proposals each, so each publication costs more CPU than at full speed.
      figures.lag_cpu_us_per_publication_main = round(l.cpuUsMain);
      figures.lag_cpu_us_per_publication_writer = l.cpuUsWriter === null ? null : round(l.cpuUsWriter);
    } finally {
      await p.close();
    }

    const chunks = e2eOnly ? 2_000 : 200_000;
    log(`lookup catalog of ${chunks} chunks…`);
    const t0 = performance.now();
    const big = bigCatalog(chunks, log);
    figures.catalog_build_s = round((performance.now() - t0) / 1000);
    figures.catalog_chunks = chunks;
    figures.catalog_datoms = big.db.datomCount;
    const lk = lookups(big.db, big.chains, q ? 2_000 : 10_000);
    figures.lookup_p50_ms = round(lk.p50);
    figures.lookup_p99_ms = round(lk.p99);
    figures.lookup_via_node_ids_p50_ms = round(lk.p50ViaNodeIds);
    figures.lookup_via_node_ids_p99_ms = round(lk.p99ViaNodeIds);

    return {
      figures,
      ratios: {
        lazy_over_eager_apply: round(lazy / eager),
        publications_over_goal_15000: lagOnly ? null : round((figures.publications_per_s as number) / 15_000),
        lag_p99_over_goal_100ms: round((figures.lag_p99_ms as number) / 100),
        lookup_p99_over_goal_2ms: round(lk.p99 / 2),
      },
      env: {
        load_avg_1m_at_start: round(loadAtStart),
        load_avg_1m_at_end: round(loadavg()[0]!),
        chain_chunks: 128,
        kafka_writer_tx_max_proposals: DEFAULT_WRITER_TX.maxRecords,
        kafka_proposal_send_max_proposals: DEFAULT_PROPOSAL_SEND.maxRecords,
        kafka_tx_record_max_txs: TX_BATCH.maxItems,
        chunk_tokens: CHUNK,
        workers: WORKERS.length,
        // The replica's process: its old-space flag (deploy/node-flags.ts) is on when started as ./bin/continuum.mjs.
        main_node_flags: process.execArgv.join(" "),
        writer_node_flags: NODE_HEAP_FLAGS.join(" "),
      },
    };
  },
};

export default bench;
