import { kernels } from "../native/index.ts";
import { percentile } from "./contract.ts";

/**
 * Host memory bandwidth, measured the same way by every benchmark that
 * compares itself with it (decode, kernels), on the kernel thread pool (all
 * cores), over BANDWIDTH_BYTES — larger than any last-level cache here, so
 * it measures DRAM, not cache:
 *
 * - memcpy_gb_per_s: bytes COPIED per second by a multi-threaded memcpy
 *   (each byte counted once; the memory traffic is about twice that: one
 *   read plus one write). This is the yardstick of issue 3's attention goal.
 * - read_gb_per_s: bytes READ per second by a multi-threaded streaming sum.
 *   A workload that only reads — batch-1 decode streaming weights, decode
 *   attention streaming K/V — can approach this figure and no more, so it is
 *   the honest ceiling for them; issue 5's decode goal uses it.
 *
 * Each figure is the median over its samples; callers interleave samples
 * with their own timings so both see the same machine load.
 */
export const BANDWIDTH_BYTES = 512 * 2 ** 20;

export interface Bandwidth {
  readonly memcpy_gb_per_s: number;
  readonly read_gb_per_s: number;
}

export class BandwidthProbe {
  private readonly src: Uint8Array;
  private readonly dst: Uint8Array;
  private readonly copySeconds: number[] = [];
  private readonly readSeconds: number[] = [];

  constructor(readonly bytes: number = BANDWIDTH_BYTES) {
    if (!Number.isInteger(bytes) || bytes < 2 ** 20 || bytes % 8 !== 0)
      throw new RangeError(`bandwidth buffer must be a whole number of 8-byte words >= 1 MiB, got ${bytes}`);
    this.src = new Uint8Array(bytes).fill(1);
    this.dst = new Uint8Array(bytes);
    // Touch every page once so no sample pays for page faults.
    kernels.memcpy(this.dst, this.src);
    kernels.memread(this.src);
  }

  /** One timed copy and one timed read. */
  sample(): void {
    let t0 = performance.now();
    kernels.memcpy(this.dst, this.src);
    this.copySeconds.push((performance.now() - t0) / 1000);
    t0 = performance.now();
    kernels.memread(this.src);
    this.readSeconds.push((performance.now() - t0) / 1000);
  }

  /** Medians over the samples taken so far (at least one). */
  result(): Bandwidth {
    if (this.copySeconds.length === 0) throw new Error("BandwidthProbe.result: no samples taken");
    return {
      memcpy_gb_per_s: this.bytes / percentile(this.copySeconds, 50) / 1e9,
      read_gb_per_s: this.bytes / percentile(this.readSeconds, 50) / 1e9,
    };
  }
}
