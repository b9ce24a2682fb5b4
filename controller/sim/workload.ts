import { createHash } from "node:crypto";
import type { ModelFingerprint, NodeId, RequestId, TokenCount } from "../../schema/ids.ts";
import type { ChainBoundary } from "../candidates.ts";
import type { Prng } from "./prng.ts";

/**
 * A multi-tenant shared-prefix workload: each tenant has a system prompt of
 * whole chunks that all its requests share; each request adds a private
 * suffix (never reused, so it is not part of the routable chain) and asks for
 * a number of generated tokens. Tenant popularity is skewed (tenant k drawn
 * with weight 1/(k+1)), so one prefix is hot.
 */
export interface WorkloadShape {
  readonly tenants: number;
  readonly chunkTokens: number;
  /** Shared chunks per tenant are drawn in [min, max]. */
  readonly sharedChunks: readonly [number, number];
  readonly suffixTokens: readonly [number, number];
  readonly maxTokens: readonly [number, number];
  /** Mean gap between arrivals (exponential), in ms. */
  readonly meanGapMs: number;
}

export interface SimRequest {
  readonly requestId: RequestId;
  readonly tenant: number;
  readonly arrivalMs: number;
  readonly chain: readonly ChainBoundary[];
  readonly promptTokens: TokenCount;
  readonly maxTokens: TokenCount;
}

export interface Workload {
  readonly fingerprint: ModelFingerprint;
  /** Each tenant's shared chain. */
  readonly tenantChains: readonly (readonly ChainBoundary[])[];
  readonly requests: readonly SimRequest[];
}

function synthId(...parts: (string | number)[]): string {
  return createHash("sha256").update(parts.join("|")).digest("hex");
}

export function makeWorkload(rng: Prng, seed: number, count: number, shape: WorkloadShape): Workload {
  const fingerprint = synthId("sim-model", seed) as ModelFingerprint;
  const tenantChains: ChainBoundary[][] = [];
  for (let t = 0; t < shape.tenants; t++) {
    const n = rng.int(shape.sharedChunks[0], shape.sharedChunks[1]);
    const chain: ChainBoundary[] = [];
    for (let i = 0; i < n; i++) {
      chain.push({
        nodeId: synthId("sim-node", seed, t, i) as NodeId,
        tokens: ((i + 1) * shape.chunkTokens) as TokenCount,
      });
    }
    tenantChains.push(chain);
  }
  // Zipf(1) weights over tenants: w_k = 1/(k+1).
  let totalWeight = 0;
  for (let t = 0; t < shape.tenants; t++) totalWeight += 1 / (t + 1);
  const requests: SimRequest[] = [];
  let now = 0;
  for (let i = 0; i < count; i++) {
    now += rng.exponential(shape.meanGapMs);
    let pick = rng.float() * totalWeight;
    let tenant = 0;
    while (tenant < shape.tenants - 1 && pick >= 1 / (tenant + 1)) {
      pick -= 1 / (tenant + 1);
      tenant++;
    }
    const chain = tenantChains[tenant]!;
    const shared = chain.length === 0 ? 0 : chain[chain.length - 1]!.tokens;
    requests.push({
      requestId: `req-${i}` as RequestId,
      tenant,
      arrivalMs: Math.round(now),
      chain,
      promptTokens: (shared + rng.int(shape.suffixTokens[0], shape.suffixTokens[1])) as TokenCount,
      maxTokens: rng.int(shape.maxTokens[0], shape.maxTokens[1]) as TokenCount,
    });
  }
  return { fingerprint, tenantChains, requests };
}
