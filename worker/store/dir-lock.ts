import { closeSync, constants, mkdirSync, openSync, readFileSync, writeSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { lockFileExclusive } from "../../native/index.ts";

/**
 * One owner per data dir: an exclusive flock(2) on a lock file, held for
 * the process's life. The kernel releases it when the process dies — kill -9
 * included — so there is never a stale lock to clean up, and a second
 * process is refused at once, before it writes anything.
 *
 * Why flock through the native addon: Node has no flock or fcntl lock, and
 * the alternatives are weaker — a pid file goes stale on kill -9 (and pids
 * are reused); a child `flock` process holding the lock outlives a SIGKILLed
 * parent until it notices its closed stdin, and dies alone if it is killed;
 * POSIX fcntl locks drop whenever any descriptor of the file closes in the
 * process. flock belongs to the open file description, which the holder
 * keeps open until release; Node opens files close-on-exec, so child
 * processes never inherit it.
 *
 * The holder writes its pid (and what it runs) into the file after taking
 * the lock, for the refusal's message; the lock, not the file's content, is
 * the truth. The record has a fixed size and is overwritten in place, so a
 * restart on a full disk needs no new block to take the lock. The file is
 * never deleted (unlinking a lock file lets two processes each lock a
 * different file of the same name).
 */

export class DirLockedError extends Error {
  override readonly name = "DirLockedError";
  constructor(
    readonly path: string,
    /** The holder's pid as its lock file says, when it could be read. */
    readonly holderPid: number | undefined,
    message: string,
  ) {
    super(message);
  }
}

export interface FileLock {
  /** The lock file. */
  readonly path: string;
  /** Drops the lock (closes the descriptor). Idempotent. */
  release(): void;
}

interface Holder {
  readonly pid: number;
  readonly since: string;
  readonly command: string;
}

/** Size of the holder record: JSON padded with spaces. */
const RECORD_BYTES = 512;
/** Bound on re-reading a lock file whose holder has not written its pid yet (the window between flock and write). */
const HOLDER_READ_TRIES = 20;
const HOLDER_READ_PAUSE_MS = 10;

/**
 * Takes the exclusive lock of `lockPath` (created, with its directory, if
 * missing). `what` names the guarded thing in the refusal ("data dir X").
 * Throws DirLockedError naming the holder's pid when another process holds it.
 */
export function lockFile(lockPath: string, what: string): FileLock {
  const path = resolve(lockPath);
  mkdirSync(dirname(path), { recursive: true });
  const fd = openSync(path, constants.O_RDWR | constants.O_CREAT, 0o644);
  let locked = false;
  try {
    locked = lockFileExclusive(fd);
  } finally {
    if (!locked) closeSync(fd);
  }
  if (!locked) {
    const holder = readHolder(path);
    const who = holder
      ? `pid ${holder.pid} (${holder.command}, since ${holder.since})`
      : "another process (its pid is not in the lock file yet)";
    throw new DirLockedError(
      path,
      holder?.pid,
      `${what} is in use by ${who}: one process owns it at a time (lock ${path}); stop that process or use another directory`,
    );
  }
  const holder: Holder = {
    pid: process.pid,
    since: new Date().toISOString(),
    command: ["continuum", ...process.argv.slice(2)].join(" ").slice(0, 200),
  };
  const record = Buffer.alloc(RECORD_BYTES, " ");
  record.write(JSON.stringify(holder).slice(0, RECORD_BYTES - 1));
  record.write("\n", RECORD_BYTES - 1);
  try {
    writeSync(fd, record, 0, RECORD_BYTES, 0);
  } catch (err) {
    closeSync(fd);
    throw new Error(`cannot write the lock file ${path}: ${(err as Error).message}`);
  }
  let held = true;
  return {
    path,
    release() {
      if (!held) return;
      held = false;
      closeSync(fd);
    },
  };
}

/** Locks a data directory (its file `LOCK`), creating it if missing. */
export function lockDir(dir: string, what = `data dir ${resolve(dir)}`): FileLock {
  return lockFile(join(dir, "LOCK"), what);
}

function readHolder(path: string): Holder | undefined {
  for (let i = 0; i < HOLDER_READ_TRIES; i++) {
    try {
      const h = JSON.parse(readFileSync(path, "utf8").trim()) as Partial<Holder>;
      if (typeof h.pid === "number")
        return { pid: h.pid, since: String(h.since), command: String(h.command) };
    } catch {
      // empty (the holder has not written yet, or released) or being written
    }
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, HOLDER_READ_PAUSE_MS);
  }
  return undefined;
}
