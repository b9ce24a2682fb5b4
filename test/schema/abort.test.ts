import { getEventListeners } from "node:events";
import { describe, expect, it } from "vitest";
import { abortable, sleep } from "../../schema/abort.ts";

const listeners = (s: AbortSignal) => getEventListeners(s, "abort").length;

describe("sleep", () => {
  it("waits its time and leaves no listener on a long-lived signal, however many times it runs", async () => {
    const ac = new AbortController();
    const t0 = performance.now();
    for (let i = 0; i < 50; i++) await sleep(1, ac.signal);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(50);
    expect(listeners(ac.signal)).toBe(0);
  });

  it("ends at once on abort, and at once when the signal has already aborted", async () => {
    const ac = new AbortController();
    const waiting = sleep(60_000, ac.signal);
    expect(listeners(ac.signal)).toBe(1);
    ac.abort();
    await waiting;
    expect(listeners(ac.signal)).toBe(0);
    await sleep(60_000, ac.signal);
  });
});

describe("abortable", () => {
  it("passes the work's value or error through and removes its listener", async () => {
    const ac = new AbortController();
    for (let i = 0; i < 20; i++) expect(await abortable(Promise.resolve(i), ac.signal)).toBe(i);
    await expect(abortable(Promise.reject(new Error("boom")), ac.signal)).rejects.toThrow("boom");
    expect(listeners(ac.signal)).toBe(0);
  });

  it("rejects with the signal's reason when it aborts first, and at once when already aborted", async () => {
    const ac = new AbortController();
    const never = new Promise<number>(() => {});
    const waiting = abortable(never, ac.signal);
    ac.abort(new Error("stopping"));
    await expect(waiting).rejects.toThrow("stopping");
    expect(listeners(ac.signal)).toBe(0);
    await expect(abortable(never, ac.signal)).rejects.toThrow("stopping");
  });
});
