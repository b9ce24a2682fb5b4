import { statfsSync } from "node:fs";
import { resolve } from "node:path";
import type { Effect, Scope } from "effect";
import { Gauge, type Registry } from "../../controller/metrics.ts";
import type { Config } from "../../schema/config.ts";
import { resource } from "../../schema/scope.ts";
import { type FileLock, lockDir } from "../../worker/store/dir-lock.ts";
import type { S3Tier } from "../../worker/store/s3.ts";

/**
 * What every process that owns a data dir does first, and how its start-up
 * failures read: before anything is written, the data dir (and a chunk dir
 * configured outside it) is locked; a failure whose cause is a full disk
 * names the data dir and what to do.
 */

/** Locks `dirs` in order; on a refusal releases what it took and rethrows (DirLockedError names the holder). */
export function lockDirs(dirs: readonly string[]): FileLock[] {
  const held: FileLock[] = [];
  try {
    for (const d of new Set(dirs.map((x) => resolve(x)))) held.push(lockDir(d));
  } catch (err) {
    for (const l of held.reverse()) l.release();
    throw err;
  }
  return held;
}

/**
 * A role's first resource: `dirs` locked (one owner each) and `spaceDir`'s free
 * space checked, before anything is written there; the locks are released,
 * in reverse, when the role's scope closes. A failure reads as
 * explainStartupError(err, spaceDir) says.
 */
export function ownDataDirs(
  dirs: readonly string[],
  spaceDir: string,
): Effect.Effect<FileLock[], unknown, Scope.Scope> {
  return resource(
    () => {
      let locks: FileLock[] = [];
      try {
        locks = lockDirs(dirs);
        requireFreeSpace(spaceDir);
      } catch (err) {
        for (const l of locks.reverse()) l.release();
        throw explainStartupError(err, spaceDir);
      }
      return locks;
    },
    (locks) => {
      for (const l of locks.reverse()) l.release();
    },
  );
}

/** The directories `continuum serve` owns: the data dir, and store.dir.path when set. */
export function serveDirs(config: Pick<Config, "store">): string[] {
  const s = config.store;
  return s.dir.path ? [s.dataDir, s.dir.path] : [s.dataDir];
}

/**
 * Free space a data dir's file system must have at start-up (and below
 * which /metrics reports it degraded): room for the catalog log's appends
 * and a few chunk files of a small model. Starting with less would only
 * postpone the same failure to the first checkpoint or catalog commit.
 */
export const MIN_FREE_BYTES = 1 << 20;

/** Bytes available to this process on the file system of `dir`. */
export function freeBytes(dir: string): number {
  const s = statfsSync(dir);
  return s.bavail * s.bsize;
}

/** Fails start-up fast (DiskFullError) when `dir`'s file system has less than MIN_FREE_BYTES free. */
export function requireFreeSpace(dir: string): void {
  const free = freeBytes(dir);
  if (free >= MIN_FREE_BYTES) return;
  const e = new Error(
    `no space left on the file system of data dir ${dir}: ${free} bytes free, at least ${MIN_FREE_BYTES} needed to start; free space there and start again`,
  );
  e.name = "DiskFullError";
  throw e;
}

function isDiskFull(err: unknown): boolean {
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    if ((e as NodeJS.ErrnoException).code === "ENOSPC" || /\bENOSPC\b/.test(e.message)) return true;
  }
  return false;
}

/** A start-up error as the operator should read it: a full disk says so and names the data dir. */
export function explainStartupError(err: unknown, dataDir: string): unknown {
  if (!isDiskFull(err)) return err;
  const e = new Error(
    `no space left on the file system of data dir ${dataDir}: free space there and start again (${(err as Error).message})`,
    { cause: err },
  );
  e.name = "DiskFullError";
  return e;
}

/**
 * continuum_degraded{reason}: 1 while the process runs without something it
 * was configured with, read at each scrape; both recover by themselves.
 *   disk_full       the data dir's file system has less than MIN_FREE_BYTES
 *                   free: checkpoints and catalog commits fail meanwhile
 *   s3_unavailable  the S3 tier's last request (or the probe at open) found
 *                   it unreachable: no chunk is published meanwhile
 */
export function registerDegradedMetric(registry: Registry, dataDir: string, s3: S3Tier | undefined): void {
  const diskFull = () => {
    try {
      return freeBytes(dataDir) < MIN_FREE_BYTES ? 1 : 0;
    } catch {
      return 1;
    }
  };
  registry.add(
    new Gauge(
      "continuum_degraded",
      "1 while the process runs degraded, by reason (disk_full: the data dir has under 1 MiB free; s3_unavailable: S3 does not answer).",
      () => [
        [{ reason: "disk_full" }, diskFull()],
        [{ reason: "s3_unavailable" }, s3 !== undefined && !s3.answers() ? 1 : 0],
      ],
    ),
  );
}
