import { afterEach, describe, expect, it } from "vitest";
import {
  JobError,
  PoolFullError,
  ThreadFailedError,
  ThreadPool,
} from "../../../controller/api/thread-pool.ts";

/**
 * The tokenizer thread pool's bounds with real threads (a module that
 * sleeps, fails or exits on request): `threads` jobs run, `maxQueued` wait,
 * one more is refused at once; a job's own error is a JobError; a thread
 * that dies fails its job and is replaced.
 */

type Job = { sleepMs?: number; fail?: string; crash?: boolean };
const pools: ThreadPool<Job, number>[] = [];
afterEach(async () => {
  for (const p of pools.splice(0)) await p.close();
});

function pool(threads: number, maxQueued: number): ThreadPool<Job, number> {
  const p = new ThreadPool<Job, number>({
    entry: new URL("./sleep-thread.ts", import.meta.url),
    data: null,
    threads,
    maxQueued,
    name: "test pool",
  });
  pools.push(p);
  return p;
}

describe("ThreadPool", () => {
  it("runs jobs on threads and refuses one past the running and waiting bound", async () => {
    const p = pool(1, 1);
    const running = p.run({ sleepMs: 3_000 });
    const waiting = p.run({ sleepMs: 0 });
    expect(p.depth).toBe(2);
    await expect(p.run({ sleepMs: 0 })).rejects.toBeInstanceOf(PoolFullError);
    expect(await running).toBe(3_000);
    expect(await waiting).toBe(0);
    expect(p.depth).toBe(0);
  }, 60_000);

  it("reports a job's own failure as a JobError and keeps the thread", async () => {
    const p = pool(1, 4);
    await expect(p.run({ fail: "bad input" })).rejects.toThrow(JobError);
    expect(await p.run({ sleepMs: 1 })).toBe(1);
  }, 60_000);

  it("fails the job of a thread that dies and starts a new thread for the next", async () => {
    const p = pool(1, 4);
    const crashed = p.run({ crash: true });
    const next = p.run({ sleepMs: 2 });
    await expect(crashed).rejects.toBeInstanceOf(ThreadFailedError);
    expect(await next).toBe(2);
  }, 60_000);

  it("fails waiting jobs when closed", async () => {
    const p = pool(1, 4);
    const running = p.run({ sleepMs: 500 });
    const waiting = p.run({ sleepMs: 0 });
    // Both expectations are attached before close() rejects the jobs (else: unhandled rejections).
    const failed = [running, waiting].map((job) => expect(job).rejects.toBeInstanceOf(ThreadFailedError));
    await p.close();
    await Promise.all(failed);
  }, 60_000);
});
