import type { PagePool } from "../../schema/admission.ts";
import {
  type CalibratedCosts,
  type Heartbeat,
  MAX_PREFILLING_ATTEMPTS,
  MAX_RESIDENT_PREFIXES,
  type PrefillProgress,
  type StoreTier,
  type WorkerStatus,
} from "../../schema/control.ts";
import {
  type ModelFingerprint,
  PageCount,
  type PrefixHash,
  type RequestId,
  TokenCount,
  type WorkerId,
} from "../../schema/ids.ts";
import type { Calibration } from "../calibration/calibration.ts";
import type { WorkerRuntime } from "../runtime/runtime.ts";
import { type RunningAttempt, runtimeId } from "./attempt.ts";
import type { ResidentLedger } from "./resident-ledger.ts";

const MIB = 1024 * 1024;

/** An accepted attempt as the heartbeat sees it. */
export interface PrefillingAttempt {
  readonly requestId: RequestId;
  readonly attempt: number;
  /** Prompt tokens the offer said were still to prefill when it was accepted. */
  readonly queuedTokens: number;
  readonly prompt: readonly unknown[];
  /** null until its first token. */
  readonly firstTokenAt: number | null;
}

/**
 * Tokens still to prefill, in all and per attempt (the list bounded by
 * MAX_PREFILLING_ATTEMPTS; the total counts every attempt). Still to
 * prefill: the accepted estimate, less what the runtime has put through the
 * forward since (`prefilled`).
 */
export function prefillProgress<A extends PrefillingAttempt>(
  attempts: Iterable<A>,
  prefilled: (a: A) => number,
): { queuedTokens: number; prefilling: PrefillProgress[] } {
  let queuedTokens = 0;
  const prefilling: PrefillProgress[] = [];
  for (const a of attempts) {
    if (a.firstTokenAt !== null) continue;
    const remaining = Math.max(0, Math.min(a.queuedTokens, a.prompt.length - prefilled(a)));
    queuedTokens += remaining;
    if (prefilling.length < MAX_PREFILLING_ATTEMPTS)
      prefilling.push({ requestId: a.requestId, attempt: a.attempt, remainingTokens: TokenCount(remaining) });
  }
  return { queuedTokens, prefilling };
}

/** The heartbeat's costs from the worker's calibration (per-byte restore costs as ms per MiB). */
export function heartbeatCosts(c: Calibration): CalibratedCosts {
  return {
    prefillPerTokenMs: c.prefillPerTokenMs.value,
    firstTokenMs: c.firstTokenMs.value,
    // The CPU engine's pages live in host memory: restored bytes need no upload.
    uploadMsPerMiB: 0,
    restoreMsPerMiB: {
      ram: c.restorePerByteMs.ram.value * MIB,
      ssd: c.restorePerByteMs.ssd.value * MIB,
      peer: c.restorePerByteMs.peer.value * MIB,
      s3: c.restorePerByteMs.s3.value * MIB,
    },
    samples: c.prefillPerTokenMs.samples + c.firstTokenMs.samples,
  };
}

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
      batching: {
        stepTokens: TokenCount(stats.batching.stepTokens),
        prefillTile: TokenCount(stats.batching.prefillTile),
      },
    },
    costs: heartbeatCosts(stats.calibration),
    ...(id.status ? { status: id.status() } : {}),
  };
}
