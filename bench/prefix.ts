import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CatalogDb } from "../catalog/db.ts";
import { EmbeddedLog } from "../catalog/log-embedded.ts";
import { CatalogWriter } from "../catalog/writer.ts";
import type { Engine } from "../native/engine.ts";
import { type Config, defaultConfig } from "../schema/config.ts";
import { ContinuationId, type PageId, TokenCount } from "../schema/ids.ts";
import { silentLogger } from "../schema/log.ts";
import { type Calibration, initialCalibration, type RestoreTier } from "../worker/calibration/calibration.ts";
import { KvGeometry } from "../worker/checkpoint/chunk-format.ts";
import { PageHashChain } from "../worker/pages/page-hashes.ts";
import { PageManager } from "../worker/pages/page-manager.ts";
import { DurableCache, durableGeometry } from "../worker/restore/durable-cache.ts";
import { Restorer } from "../worker/restore/restorer.ts";
import { buildBatch } from "../worker/runtime/batch.ts";
import { loadEngine } from "../worker/runtime/engine-load.ts";
import { refuseGrouped } from "./_exact.ts";
import { smallModel } from "./_models.ts";
import { type Bench, round } from "./contract.ts";

/**
 * Time to first token of a long prompt on the `small` preset when part of its
 * prefix is already durable, per source, against a cold recompute measured in
 * the same run.
 *
 * Worker A prefills the prompt cold (that is the 0% figure), its checkpointer
 * captures every whole chunk into RAM, SSD (and S3 when a server is
 * configured through CONTINUUM_S3_ENDPOINT) and publishes them. Then, for
 * each source and each cached fraction f ∈ {50, 90, 100}%, a fresh route
 * restores the first floor(min(f·N, N−1) / C) · C rows from that source —
 * RAM and SSD from A's own tiers, peer from A over HTTP as seen by worker B,
 * S3 as seen by worker C — prefills the rest, and takes the first token's
 * logits. TTFT = restore (fetch, verify, unpack, upload) + suffix prefill +
 * first logits. 100% is 15 of 16 chunks: the pending token's chunk is never
 * whole. "ssd" reads files the OS may still hold in its page cache.
 *
 * Goal (issue 7): ttft 3840 of 4096 tokens from SSD ≤ 0.2 × cold.
 */
const PAGE = 16;
const CHUNK = 256;
const TILE = 512;
const FRACTIONS = [0.5, 0.9, 1] as const;

function preferring(tier: RestoreTier, prefillPerTokenMs: number): Calibration {
  const per = { ram: 1, ssd: 1, peer: 1, s3: 1 };
  per[tier] = 1e-9;
  return initialCalibration({ prefillPerTokenMs, firstTokenMs: 1, decodeStepMs: 1, restorePerByteMs: per });
}

/** Prefills tokens[route rows, end) in tiles of TILE rows; returns the last row's logits. */
async function prefill(
  engine: Engine,
  pages: PageManager,
  route: ContinuationId,
  tokens: readonly number[],
): Promise<Float32Array> {
  const chain = new PageHashChain(PAGE, undefined);
  let logits: Float32Array | undefined;
  for (let have = pages.route(route).tokens; have < tokens.length; have = pages.route(route).tokens) {
    const rows = Math.min(TILE, tokens.length - have);
    const last = have + rows === tokens.length;
    const plan = pages.beginAppend(route, TokenCount(rows));
    for (const c of plan.copies) await engine.copyPage(c.src, c.dst);
    const built = buildBatch([
      {
        tokens: tokens.slice(have, have + rows),
        firstPosition: have,
        slots: plan.slots,
        pageTable: plan.pageTable as PageId[],
        wantLogits: last,
      },
    ]);
    const out = await engine.step(built.batch);
    pages.commitAppend(route, chain.extend(tokens, have + rows).slice(Math.floor(have / PAGE)));
    if (last) logits = out;
  }
  return logits!;
}

function storeConfig(dir: string, s3: boolean, bucket: string): Config["store"] {
  return {
    dataDir: dir,
    ram: { maxBytes: 1 << 30 },
    dir: { path: join(dir, "store"), maxObjectBytes: 256 << 20, maxBytes: 8 * 2 ** 30 },
    s3: s3
      ? {
          ...defaultConfig.store.s3,
          enabled: true,
          endpoint: process.env.CONTINUUM_S3_ENDPOINT!,
          accessKeyId: process.env.CONTINUUM_S3_ACCESS_KEY_ID ?? "local-identity",
          secretAccessKey: process.env.CONTINUUM_S3_SECRET_ACCESS_KEY ?? "local-credential",
          region: process.env.CONTINUUM_S3_REGION ?? "us-east-1",
          bucket,
          createBucket: true,
        }
      : defaultConfig.store.s3,
  };
}

const bench: Bench = {
  summary:
    "TTFT with 0/50/90/100% of a long prompt cached, per source (RAM, SSD, peer, S3) vs cold recompute",
  async run({ quick, log }) {
    const N = quick ? 1024 : 4096;
    const model = await smallModel(log);
    refuseGrouped(model, "bench prefix");
    const physicalPages = Math.ceil(N / PAGE) * 3 + 8;
    const engine = await loadEngine(model, { physicalPages, pageTokens: PAGE });
    const pages = new PageManager({ pageTokens: PAGE, physicalPages });
    const root = await mkdtemp(join(tmpdir(), "continuum-bench-prefix-"));
    const embeddedLog = await EmbeddedLog.open();
    const writer = new CatalogWriter({
      log: embeddedLog,
      newDb: () => CatalogDb.empty(),
      logger: silentLogger,
    });
    const writing = writer.run().catch(() => undefined);
    const s3 = Boolean(process.env.CONTINUUM_S3_ENDPOINT);
    const bucket = `bench-prefix-${Date.now()}`;
    const caches: DurableCache[] = [];
    const open = async (id: string) => {
      const dir = join(root, id);
      const c = await DurableCache.open({
        engine,
        fingerprint: model.fingerprint,
        modelName: "small",
        layout: model.manifest.layout,
        config: {
          pages: { pageTokens: PAGE, physicalPages, chunkTokens: CHUNK },
          store: storeConfig(dir, s3, bucket),
          worker: { ...defaultConfig.worker, id },
          auth: { ...defaultConfig.auth, clusterSecret: "bench-secret" },
        },
        log: embeddedLog,
        logger: silentLogger,
        peerPort: 0,
        fetchTimeoutMs: 60_000,
        storeReport: () => undefined,
      });
      caches.push(c);
      return c;
    };
    try {
      const a = await open("bench-a");
      const b = await open("bench-b");
      const c = s3 ? await open("bench-c") : undefined;
      let x = 12345;
      const prompt = Array.from({ length: N }, () => {
        x = (x * 1103515245 + 12345) >>> 0;
        return x % model.config.spec.vocab;
      });
      const g = KvGeometry.of(engine.spec);

      // Cold: the whole prompt computed from nothing (then kept for the checkpoint).
      log(`cold prefill of ${N} tokens`);
      const cold = ContinuationId("cold");
      pages.openRoute(cold, { reserveTokens: TokenCount(N) });
      const t0 = performance.now();
      await prefill(engine, pages, cold, prompt);
      const coldMs = performance.now() - t0;
      const prefillPerTokenMs = coldMs / N;
      log(`cold ttft ${round(coldMs)} ms; checkpointing`);
      const whole = Math.floor((N - 1) / CHUNK) * CHUNK;
      const chain = new PageHashChain(PAGE, undefined).extend(prompt, N);
      const t1 = performance.now();
      a.checkpointer.offer({
        prefix: chain.slice(0, whole / PAGE),
        tokens: prompt.slice(0, whole),
        salt: undefined,
        hits: 0,
        pages,
        released: () => undefined,
        // Admission weighs the measured prefill against configured restore and capture costs.
        calibration: initialCalibration({
          prefillPerTokenMs,
          firstTokenMs: 1,
          decodeStepMs: 1,
          restorePerByteMs: { ram: 1e-7, ssd: 1e-6, peer: 2e-6, s3: 1e-5 },
        }),
      });
      await a.idle();
      const checkpointMs = performance.now() - t1;
      const published = a.checkpointer.stats().chunksPublished;
      pages.releaseRoute(cold);
      for (const w of [b, c])
        if (w) await w.catalog.waitUntil(() => w.replica.offset() >= a.replica.offset(), 30_000);

      const figures: Record<string, number | string | boolean | null> = {
        prompt_tokens: N,
        chunk_tokens: CHUNK,
        chunk_bytes: g.chunkBytes(CHUNK),
        chunks_published: published,
        cold_ttft_ms: round(coldMs),
        checkpoint_ms: round(checkpointMs),
        checkpoint_mb_per_s: round((published * g.chunkBytes(CHUNK)) / (checkpointMs / 1000) / 1e6),
      };
      const ratios: Record<string, number | null> = {};
      const sources: [RestoreTier, DurableCache | undefined][] = [
        ["ram", a],
        ["ssd", a],
        ["peer", b],
        ["s3", c],
      ];
      let run = 0;
      for (const [tier, cache] of sources) {
        if (cache === undefined) {
          figures[`${tier}_skipped`] = "no S3 server (set CONTINUUM_S3_ENDPOINT)";
          continue;
        }
        let restoredBytes = 0;
        let restoreMsTotal = 0;
        for (const f of FRACTIONS) {
          const cached = Math.floor(Math.min(f * N, N - 1) / CHUNK) * CHUNK;
          const restorer = new Restorer({
            engine,
            ...durableGeometry(engine.spec),
            tiers: cache.tiers,
            catalog: cache.catalog,
            pageTokens: PAGE,
            chunkTokens: CHUNK,
            peerSecret: "bench-secret",
            fetchTimeoutMs: 60_000,
            logger: silentLogger,
          });
          const route = ContinuationId(`run-${run++}`);
          pages.openRoute(route, { reserveTokens: TokenCount(N) });
          const s0 = performance.now();
          const ticket = restorer.begin({
            routes: [route],
            tokens: prompt.slice(0, cached),
            pageHashes: chain.slice(0, Math.floor(cached / PAGE)),
            salt: undefined,
            residentTokens: 0,
            pages,
            calibration: preferring(tier, prefillPerTokenMs),
            record: () => undefined,
          });
          const ok = ticket !== null && (await ticket.done);
          const restoreMs = performance.now() - s0;
          await prefill(engine, pages, route, prompt);
          const ttft = performance.now() - s0;
          pages.releaseRoute(route);
          await restorer.idle();
          const st = restorer.stats();
          const pct = Math.round(f * 100);
          figures[`${tier}_${pct}pct_cached_tokens`] = ok ? cached : 0;
          figures[`${tier}_${pct}pct_ttft_ms`] = round(ttft);
          figures[`${tier}_${pct}pct_restore_ms`] = round(restoreMs);
          ratios[`${tier}_${pct}pct_ttft_over_cold`] = round(ttft / coldMs);
          restoredBytes += st.bytes[tier];
          restoreMsTotal += restoreMs;
          log(
            `${tier} ${pct}%: ${ok ? cached : 0} tokens restored in ${round(restoreMs)} ms, ttft ${round(ttft)} ms`,
          );
        }
        figures[`${tier}_restore_mb_per_s`] = round(restoredBytes / (restoreMsTotal / 1000) / 1e6);
      }
      const ssdGoal = ratios.ssd_100pct_ttft_over_cold;
      figures.goal_ssd_3840_of_4096_le_0_2_cold = quick
        ? null
        : ssdGoal !== undefined && ssdGoal !== null && ssdGoal <= 0.2;
      return {
        figures,
        ratios,
        env: {
          model: "small",
          page_tokens: PAGE,
          prefill_tile: TILE,
          s3: s3,
          quick_note: quick ? "quick: 1024-token prompt instead of 4096" : undefined,
        },
      };
    } finally {
      for (const c of caches.reverse()) await c.close().catch(() => undefined);
      await writer.stop();
      await writing;
      await embeddedLog.close();
      engine.free();
      await rm(root, { recursive: true, force: true });
    }
  },
};

export default bench;
