import type { WorkerId } from "../../schema/ids.ts";
import type { Prng } from "./prng.ts";
import type { SimOptions } from "./simulate.ts";
import { type SimCosts, SimWorker, type SimWorkerShape } from "./worker.ts";
import type { Workload } from "./workload.ts";

/**
 * The simulator's workers: generated (heterogeneous hardware around one
 * cost profile, a Llama-3-8B-shaped KV size) or, for `continuum replay`,
 * those of a recorded world.
 */

/** One worker of a recorded world: its shape, its true costs and the costs its heartbeats report. */
export interface SimWorldWorker {
  readonly id: WorkerId;
  readonly costs: SimCosts;
  readonly reported: SimCosts;
  readonly shape: Omit<SimWorkerShape, "fingerprint" | "frameTokens" | "maxQueuedJobs">;
}

export interface SimWorld {
  readonly workload: Workload;
  readonly workers: readonly SimWorldWorker[];
}

/** Attention state per token of a Llama-3-8B-shaped model: 32 layers × 8 KV heads × 128 × (K, V) × 2 bytes. */
const KV_BYTES_PER_TOKEN = 128 * 1024;

function makeCosts(rng: Prng): SimCosts {
  // Heterogeneous hardware: each worker's costs scaled by a factor in [0.8, 1.25].
  const f = 0.8 + rng.float() * 0.45;
  return {
    prefillPerTokenMs: 0.15 * f,
    firstTokenMs: 20 * f,
    decodeMsPerToken: 12 * f,
    uploadMsPerMiB: 0.04 * f,
    restoreMsPerMiB: { ram: 0.05, ssd: 0.3, peer: 0.8, s3: 2.5 },
  };
}

/** The workers of one simulation: the recorded world's, or `opts.workers` generated ones. */
export function makeWorkers(opts: SimOptions, workload: Workload, costRng: Prng): SimWorker[] {
  const world = opts.world;
  if (world) {
    if (world.workers.length < 1 || world.workers.length > 1024)
      throw new RangeError(`a recorded world needs 1..1024 workers, got ${world.workers.length}`);
    return world.workers.map(
      (w) =>
        new SimWorker(
          w.id,
          w.costs,
          { ...w.shape, fingerprint: workload.fingerprint, frameTokens: 8, maxQueuedJobs: 256 },
          workload.tenantChains,
          w.reported,
        ),
    );
  }
  const out: SimWorker[] = [];
  for (let i = 0; i < opts.workers; i++) {
    out.push(
      new SimWorker(
        `w${String(i).padStart(3, "0")}` as WorkerId,
        makeCosts(costRng),
        {
          fingerprint: workload.fingerprint,
          totalPages: opts.totalPages,
          pageTokens: 16,
          kvBytesPerToken: KV_BYTES_PER_TOKEN,
          maxContext: 8192,
          frameTokens: 8,
          maxQueuedJobs: 256,
          ssdTier: opts.ssdTier,
          ramChunks: Math.floor(opts.ramBytes / (opts.workload.chunkTokens * KV_BYTES_PER_TOKEN)),
        },
        workload.tenantChains,
      ),
    );
  }
  return out;
}
