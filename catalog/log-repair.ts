import { link, open, readFile, rename, rm } from "node:fs/promises";
import { dirname } from "node:path";
import {
  decodeCommit,
  InconsistentLogError,
  replayFile,
  scanFrames,
  TYPE_COMMIT,
  TYPE_PROPOSAL,
} from "./embedded-file.ts";

/**
 * Repairs an embedded log file that two processes appended to (what
 * InconsistentLogError reports), for `continuum catalog repair`. The caller
 * holds the log's lock: no process may write it meanwhile.
 *
 * What is kept: every frame before the first inconsistent commit (the last
 * consistent commit and the proposals after it), and every proposal frame
 * after it — each was acknowledged to its proposer once fsync'd, and a
 * proposal carries no offset, so it stays valid where it is; the writer
 * decides them again on the next start (a proposal already applied is
 * refused as a duplicate by its id). What is dropped: every commit frame
 * from the inconsistent one on (their transactions were decided against a
 * stale view; re-deciding the proposals replaces them) and a torn tail.
 *
 * The original file is kept beside the repaired one (`<file>.before-repair-<time>`).
 */
export interface RepairReport {
  readonly path: string;
  /** False when the file was consistent (only a torn tail, if any, was cut). */
  readonly repaired: boolean;
  /** Byte offset of the first inconsistent commit. */
  readonly inconsistentAt?: number;
  readonly bytesBefore: number;
  readonly bytesAfter: number;
  readonly kept: { readonly proposals: number; readonly tx: number; readonly rejections: number };
  /** Proposals after the inconsistency, kept for the writer to decide again. */
  readonly requeuedProposals: number;
  /** Proposals no kept commit consumed: what the next writer decides (the requeued ones among them). */
  readonly undecidedProposals: number;
  readonly dropped: {
    readonly commits: number;
    readonly tx: number;
    readonly rejections: number;
    /** Bytes of a torn or corrupt tail. */
    readonly tailBytes: number;
  };
  readonly backup?: string;
}

export async function repairLog(path: string, now: Date = new Date()): Promise<RepairReport> {
  const bytes = await readFile(path);
  let at: number | undefined;
  try {
    const ok = replayFile(bytes, path);
    if (ok.validEnd < bytes.length) await truncateFile(path, ok.validEnd);
    return {
      path,
      repaired: false,
      bytesBefore: bytes.length,
      bytesAfter: ok.validEnd,
      kept: { proposals: ok.proposals.length, tx: ok.tx.length, rejections: ok.rejections.length },
      requeuedProposals: 0,
      undecidedProposals: ok.proposals.length - ok.consumed,
      dropped: { commits: 0, tx: 0, rejections: 0, tailBytes: bytes.length - ok.validEnd },
    };
  } catch (err) {
    if (!(err instanceof InconsistentLogError)) throw err;
    at = err.at;
  }
  const prefix = bytes.subarray(0, at);
  const consistent = replayFile(prefix, path);
  const kept: Buffer[] = [prefix];
  const dropped = { commits: 0, tx: 0, rejections: 0, tailBytes: 0 };
  let requeued = 0;
  const rest = bytes.subarray(at);
  let scanned = 0;
  for (const f of scanFrames(rest)) {
    if (f.type === TYPE_PROPOSAL) {
      kept.push(rest.subarray(f.at, f.end));
      requeued++;
    } else if (f.type === TYPE_COMMIT) {
      const c = decodeCommit(f.payload);
      dropped.commits++;
      dropped.tx += c.tx.length;
      dropped.rejections += c.rejections.length;
    }
    scanned = f.end;
  }
  dropped.tailBytes = rest.length - scanned;
  const repaired = Buffer.concat(kept);
  // The result must replay cleanly, or nothing is replaced.
  replayFile(repaired, path);
  const tmp = `${path}.repair-${process.pid}`;
  const backup = `${path}.before-repair-${now.toISOString().replace(/[:.]/g, "-")}`;
  const out = await open(tmp, "w");
  try {
    await out.writeFile(repaired);
    await out.sync();
  } finally {
    await out.close();
  }
  try {
    await link(path, backup);
    await rename(tmp, path);
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
  await syncDir(dirname(path));
  return {
    path,
    repaired: true,
    inconsistentAt: at,
    bytesBefore: bytes.length,
    bytesAfter: repaired.length,
    kept: {
      proposals: consistent.proposals.length + requeued,
      tx: consistent.tx.length,
      rejections: consistent.rejections.length,
    },
    requeuedProposals: requeued,
    undecidedProposals: consistent.proposals.length + requeued - consistent.consumed,
    dropped,
    backup,
  };
}

async function truncateFile(path: string, size: number): Promise<void> {
  const f = await open(path, "r+");
  try {
    await f.truncate(size);
    await f.sync();
  } finally {
    await f.close();
  }
}

async function syncDir(dir: string): Promise<void> {
  const d = await open(dir, "r");
  try {
    await d.sync();
  } finally {
    await d.close();
  }
}
