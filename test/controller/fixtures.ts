import { createHash } from "node:crypto";
import type { ChainBoundary, RouteRequest } from "../../controller/candidates.ts";
import type { Heartbeat } from "../../schema/control.ts";
import type { ModelFingerprint, NodeId, RequestId, TokenCount, WorkerId } from "../../schema/ids.ts";

export const FP = createHash("sha256").update("test-model").digest("hex") as ModelFingerprint;
export const OTHER_FP = createHash("sha256").update("other-model").digest("hex") as ModelFingerprint;

export const wid = (s: string) => s as WorkerId;
export const rid = (s: string) => s as RequestId;

/** A chain of `n` chunks of 256 tokens with synthetic node ids. */
export function chain(n: number, tag = "t"): ChainBoundary[] {
  return Array.from({ length: n }, (_, i) => ({
    nodeId: createHash("sha256").update(`${tag}/${i}`).digest("hex") as NodeId,
    tokens: ((i + 1) * 256) as TokenCount,
  }));
}

export function request(c: ChainBoundary[], promptTokens: number, maxTokens = 32): RouteRequest {
  return {
    requestId: rid("r1"),
    modelFingerprint: FP,
    chain: c,
    promptTokens: promptTokens as TokenCount,
    maxTokens: maxTokens as TokenCount,
  };
}

export function heartbeat(workerId: string, over: Partial<Heartbeat> = {}): Heartbeat {
  return {
    workerId: wid(workerId),
    epoch: 1,
    sequence: 1,
    modelFingerprint: FP,
    maxContext: 8192 as TokenCount,
    pageTokens: 16,
    kvBytesPerToken: 128 * 1024,
    freePages: 2000 as never,
    evictablePages: 0 as never,
    residentPrefixes: [],
    durableTiers: ["ram", "s3"],
    ready: true,
    queue: { queuedTokens: 0 as TokenCount, queuedRequests: 0, runningRequests: 0 },
    costs: {
      prefillPerTokenMs: 0.15,
      firstTokenMs: 20,
      uploadMsPerMiB: 0.04,
      restoreMsPerMiB: { ram: 0.05, ssd: 0.3, peer: 0.8, s3: 2.5 },
      samples: 10,
    },
    ...over,
  };
}
