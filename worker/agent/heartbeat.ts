import type { PagePool } from "../../schema/admission.ts";
import {
  type Heartbeat,
  MAX_RESIDENT_PREFIXES,
  type StoreTier,
  type WorkerStatus,
} from "../../schema/control.ts";
import {
  type ModelFingerprint,
  PageCount,
  type PrefixHash,
  TokenCount,
  type WorkerId,
} from "../../schema/ids.ts";
import type { WorkerRuntime } from "../runtime/runtime.ts";
import { type RunningAttempt, runtimeId } from "./attempt.ts";
import { heartbeatCosts, prefillProgress } from "./report.ts";
import type { ResidentLedger } from "./resident-ledger.ts";

/**
 * The real page pool for admission: what the pool may hand out net of what
 * accepted attempts reserved (conservative: an attempt the runtime already
 * admitted is counted in both until it ends), split into free pages and
 * cached pages it would evict, and the whole pages of `promptHashes` already
 * held (shared: adopted, not allocated).
 */
export function pagePool(
  runtime: WorkerRuntime,
  reservedPages: number,
  promptHashes: readonly PrefixHash[],
): PagePool {
  const pages = runtime.pages;
  const available = Math.max(0, pages.availablePages - reservedPages);
  const evictable = Math.min(pages.evictablePages, available);
  const hit = promptHashes.length > 0 ? pages.prefixHit(promptHashes) : { pages: 0, evictable: 0 };
  return {
    freePages: available - evictable,
    // Shared cached pages are adopted, not evicted: they are not counted twice.
    evictablePages: Math.max(0, evictable - hit.evictable),
    sharedPages: hit.pages,
  };
}

/** What a heartbeat states about the worker besides its live figures. */
export interface HeartbeatIdentity {
  readonly workerId: WorkerId;
  readonly epoch: number;
  readonly sequence: number;
  readonly fingerprint: ModelFingerprint;
  readonly maxContext: number;
  readonly pageTokens: number;
  readonly kvBytesPerToken: number;
  readonly durableTiers: readonly StoreTier[];
  readonly ready: boolean;
  readonly status?: () => WorkerStatus;
}

/** The worker's observation now: pages, resident prefixes, the queue still to prefill and measured costs. */
export function buildHeartbeat(
  runtime: WorkerRuntime,
  id: HeartbeatIdentity,
  reservedPages: number,
  running: Iterable<RunningAttempt>,
  ledger: ResidentLedger,
): Heartbeat {
  const pages = runtime.pages;
  const stats = runtime.stats();
  const pool = pagePool(runtime, reservedPages, []);
  const { queuedTokens, prefilling } = prefillProgress(
    running,
    (r) => runtime.prefilled(runtimeId(r.requestId, r.attempt)) ?? 0,
  );
  return {
    workerId: id.workerId,
    epoch: id.epoch,
    sequence: id.sequence,
    modelFingerprint: id.fingerprint,
    maxContext: TokenCount(id.maxContext),
    pageTokens: id.pageTokens,
    kvBytesPerToken: id.kvBytesPerToken,
    freePages: PageCount(pool.freePages),
    evictablePages: PageCount(pool.evictablePages),
    residentPrefixes: ledger.resident((hash) => pages.holdsPrefix(hash), MAX_RESIDENT_PREFIXES),
    durableTiers: [...id.durableTiers],
    ready: id.ready,
    queue: {
      queuedTokens: TokenCount(queuedTokens),
      queuedRequests: stats.waiting,
      runningRequests: stats.running,
      prefilling,
    },
    costs: heartbeatCosts(stats.calibration),
    ...(id.status ? { status: id.status() } : {}),
  };
}
