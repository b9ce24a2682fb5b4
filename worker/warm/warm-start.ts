import { randomBytes } from "node:crypto";
import { longestPublishedPrefixOfChain, readyReplicas } from "../../catalog/queries.ts";
import { catalogNodeId, contentId, prefixChain } from "../../schema/identity.ts";
import type { Logger } from "../../schema/log.ts";
import type { RestoreTier, Sample } from "../calibration/calibration.ts";
import type { DurableCache } from "../restore/durable-cache.ts";
import type { WorkerRuntime } from "../runtime/runtime.ts";
import { greedyRequest } from "../runtime/runtime-api.ts";
import { VerifiedChunk } from "../store/chunk.ts";
import type { ChunkTiers } from "../store/chunk-tiers.ts";
import { FileFullError } from "../store/errors.ts";

/**
 * Warm start: a worker says it is ready (heartbeat `ready`, its catalog
 * registration, GET /ready on its peer port) only after every one-time cost
 * a first request would otherwise pay has been paid, in this order:
 *
 *   model     weights loaded into the engine (the caller's first step);
 *   tiers     each store tier opened and probed: a chunk-sized probe
 *             object written, read back verified and deleted (RAM, SSD,
 *             S3); its reads are the tiers' first restore-cost samples;
 *   catalog   the replica caught up with the log, and the prepared queries
 *             the restorer and router read run once (first-call costs);
 *   engine    one warm-up request through the runtime (a prefill step and a
 *             decode step: the native path's first touch of its pages and
 *             scratch, the sampler, the loop), under its own cache salt so
 *             no client prompt ever shares its pages;
 *   registered  the model and worker registered in the catalog (others
 *             plan on it, and fetch from its peer port, from now on).
 *
 * `WarmStart` records each step's time; `ready` holds once all are done.
 */

export const WARM_STEPS = ["model", "tiers", "catalog", "engine", "registered"] as const;
export type WarmStep = (typeof WARM_STEPS)[number];

export class WarmStart {
  private readonly done = new Map<WarmStep, number>();

  /** Marks `step` done after `ms`; steps complete in WARM_STEPS order. */
  mark(step: WarmStep, ms: number): void {
    const i = WARM_STEPS.indexOf(step);
    const missing = WARM_STEPS.slice(0, i).filter((s) => !this.done.has(s));
    if (missing.length > 0) throw new Error(`warm start: ${step} before ${missing.join(", ")}`);
    this.done.set(step, ms);
  }

  get ready(): boolean {
    return this.done.size === WARM_STEPS.length;
  }

  /** Steps not done yet, in order. */
  missing(): WarmStep[] {
    return WARM_STEPS.filter((s) => !this.done.has(s));
  }

  /** Each done step's duration in ms. */
  report(): Partial<Record<WarmStep, number>> {
    return Object.fromEntries(this.done);
  }
}

/** Times `fn` and marks `step` with its duration. */
export async function warmStep<T>(warm: WarmStart, step: WarmStep, fn: () => Promise<T>): Promise<T> {
  const t0 = performance.now();
  const out = await fn();
  warm.mark(step, performance.now() - t0);
  return out;
}

/** One tier's probe: the whole round trip, and the best of its verified reads of `bytes`. */
export interface TierTiming {
  readonly ms: number;
  readonly readMs: number;
  readonly bytes: number;
}

export interface TierProbe {
  readonly ram: TierTiming | null;
  /** "full": the files are at store.dir.maxBytes (logged; they still serve reads). */
  readonly ssd: TierTiming | "full";
  /** null: no S3 tier; "failed": it did not answer (logged; the worker serves from its local tiers). */
  readonly s3: TierTiming | null | "failed";
}

/** Verified reads of the probe object per tier; the fastest is the sample (the first may pay a one-time path). */
const PROBE_READS = 2;

/**
 * Writes one probe object of `chunkBytes` (a chunk of this model, so the
 * per-byte figure carries a real chunk's per-object share) per tier, reads it
 * back verified PROBE_READS times and deletes it. RAM and SSD must work or
 * start-up stops; S3 failing is logged and the worker goes on (its
 * write-behind retries; restores fall back to other sources).
 */
export async function probeTiers(
  tiers: ChunkTiers,
  who: string,
  log: Logger,
  chunkBytes: number,
): Promise<TierProbe> {
  if (!Number.isSafeInteger(chunkBytes) || chunkBytes < 1)
    throw new RangeError(`warm start: probe size must be a positive integer of bytes, got ${chunkBytes}`);
  const probe = async (tier: {
    readonly tier: "ram" | "file" | "s3";
    readonly maxObjectBytes: number;
    putVerified(c: VerifiedChunk): Promise<void>;
    get(id: unknown): Promise<VerifiedChunk | undefined>;
    delete(id: unknown): Promise<boolean>;
  }): Promise<TierTiming> => {
    const bytes = new Uint8Array(randomBytes(Math.min(chunkBytes, tier.maxObjectBytes)));
    const meta = { format: "continuum.probe/1", worker: who, at: Date.now() };
    const id = contentId(bytes, meta);
    const t0 = performance.now();
    await tier.putVerified(VerifiedChunk.check(id, bytes, meta, tier));
    let readMs = Number.POSITIVE_INFINITY;
    for (let i = 0; i < PROBE_READS; i++) {
      const r0 = performance.now();
      const back = await tier.get(id);
      if (back === undefined || Buffer.compare(Buffer.from(back.bytes), Buffer.from(bytes)) !== 0)
        throw new Error(`warm start: the ${tier.tier} tier did not give its probe object back`);
      readMs = Math.min(readMs, performance.now() - r0);
    }
    await tier.delete(id);
    return { ms: performance.now() - t0, readMs, bytes: bytes.length };
  };
  const ram = tiers.ram ? await probe(tiers.ram) : null;
  let ssd: TierProbe["ssd"];
  try {
    ssd = await probe(tiers.file);
  } catch (err) {
    // Full files still serve reads (restores, the peer server); new chunks skip them until room is made.
    if (!(err instanceof FileFullError)) throw err;
    ssd = "full";
    log.log("warn", "warm.ssd_full", { message: err.message });
  }
  let s3: TierProbe["s3"] = null;
  if (tiers.s3) {
    try {
      s3 = await probe(tiers.s3);
    } catch (err) {
      s3 = "failed";
      log.log("warn", "warm.s3_probe_failed", { message: (err as Error).message });
    }
  }
  return { ram, ssd, s3 };
}

/**
 * The probe's reads as restore samples, so the worker's first heartbeat
 * prices each tier it has from a measurement, not the configured guess (a
 * guess that prices S3 above recompute is never corrected: the router then
 * never sends the worker an S3 restore to measure).
 */
export function probeSamples(probe: TierProbe): Sample[] {
  const out: Sample[] = [];
  const add = (tier: RestoreTier, t: TierTiming | null | "full" | "failed") => {
    if (t !== null && typeof t === "object")
      out.push({ kind: "restore", tier, bytes: t.bytes, deviceMs: t.readMs, queueMs: 0 });
  };
  add("ram", probe.ram);
  add("ssd", probe.ssd);
  add("s3", probe.s3);
  return out;
}

/**
 * The replica caught up, then the hot-path catalog queries run once on a
 * probe chain (an absent prefix: the full walk of a miss) and the restorer
 * plans it with the runtime's calibration, as the first request would.
 */
export async function warmCatalog(
  cache: DurableCache,
  runtime: WorkerRuntime,
  pageTokens: number,
  timeoutMs: number,
): Promise<void> {
  await cache.replica.catchUp(timeoutMs);
  const tokens = Array.from({ length: 4 * pageTokens }, (_, i) => (i * 7919) % 1000);
  const { fingerprint, chunkTokens } = cache.catalog.id;
  const chain = prefixChain(tokens, chunkTokens, WARM_SALT);
  longestPublishedPrefixOfChain(cache.catalog.db, fingerprint, chain);
  readyReplicas(
    cache.catalog.db,
    chain.map((n) => catalogNodeId(fingerprint, n.hash)),
  );
  cache.restorer.plan({
    tokens,
    salt: WARM_SALT,
    residentTokens: 0,
    calibration: runtime.stats().calibration,
    routes: cache.restorer.groups.map((g) => ({ window: g.window, availablePages: 0 })),
  });
}

/** The warm-up's cache salt: its chains never match a client's (tenant salts are tenant ids). */
const WARM_SALT = "continuum/warm-up";

/**
 * One request through the runtime: `promptTokens` tokens (two whole pages and
 * one, so both a prefill step and a decode step run) and two generated
 * tokens, under the warm-up salt, its pages freed at the end. Rejects if it
 * does not complete.
 */
export async function warmEngine(runtime: WorkerRuntime, pageTokens: number, vocab: number): Promise<void> {
  const prompt = Array.from({ length: 2 * pageTokens + 1 }, (_, i) => 1 + ((i * 7919) % (vocab - 1)));
  const g = runtime.submit(
    // Leaves no page behind: a fresh worker's pool is empty once warm.
    greedyRequest("continuum-warm-up", prompt, 2, { salt: WARM_SALT, ephemeral: true }),
  );
  for await (const e of g.events) {
    if (e.type === "error") throw new Error(`warm start: the warm-up request failed: ${e.message}`);
    if (e.type === "end") return;
  }
  throw new Error("warm start: the warm-up request ended without an end event");
}
