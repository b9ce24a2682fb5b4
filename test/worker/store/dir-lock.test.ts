import { type ChildProcess, spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { DirLockedError, lockDir } from "../../../worker/store/dir-lock.ts";

const dirs: string[] = [];
const children: ChildProcess[] = [];
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

async function freshDir(): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), "continuum-lock-"));
  dirs.push(d);
  return d;
}

/** A real process holding the lock of `dir`; resolves once it holds it. */
async function holder(dir: string): Promise<ChildProcess> {
  const child = spawn(process.execPath, ["--import", "tsx", "test/worker/store/hold-lock.ts", dir], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  let err = "";
  child.stderr!.on("data", (d) => (err += String(d)));
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (d) => String(d).includes("locked") && resolve());
    child.once("exit", (code) => reject(new Error(`holder exited with ${code}: ${err}`)));
  });
  return child;
}

function refusal(dir: string): DirLockedError {
  try {
    lockDir(dir).release();
  } catch (err) {
    if (err instanceof DirLockedError) return err;
    throw err;
  }
  throw new Error(`${dir} was not locked`);
}

describe("data dir lock", () => {
  it("refuses a second lock, even in the same process, naming the holder's pid; a release frees it", async () => {
    const dir = await freshDir();
    const lock = lockDir(dir);
    const e = refusal(dir);
    expect(e.holderPid).toBe(process.pid);
    expect(e.message).toMatch(new RegExp(`data dir .* is in use by pid ${process.pid} \\(continuum`));
    lock.release();
    lock.release();
    lockDir(dir).release();
  });

  it("a second process is refused while the first lives, and kill -9 of the first leaves no stale lock", async () => {
    const dir = await freshDir();
    const child = await holder(dir);
    expect(refusal(dir).holderPid).toBe(child.pid);
    const gone = new Promise((r) => child.once("exit", r));
    child.kill("SIGKILL");
    await gone;
    // At once: the kernel dropped the lock with the process.
    const lock = lockDir(dir);
    lock.release();
  });

  it("a child process of the holder does not inherit the lock", async () => {
    const dir = await freshDir();
    const lock = lockDir(dir);
    const sleeper = spawn("sleep", ["30"], { stdio: "ignore" });
    children.push(sleeper);
    lock.release();
    lockDir(dir).release();
    sleeper.kill("SIGKILL");
  });
});
