import { describe, expect, it } from "vitest";
import { backoffMs, retry, totalBackoffMs } from "../../schema/retry.ts";

class Transient extends Error {}

describe("backoffMs", () => {
  it("doubles from the base after each failure and never passes the cap", () => {
    const b = { baseMs: 100, capMs: 5_000 };
    expect([1, 2, 3, 4, 5, 6, 7, 30].map((n) => backoffMs(b, n))).toEqual([
      100, 200, 400, 800, 1600, 3200, 5000, 5000,
    ]);
    expect(() => backoffMs(b, 0)).toThrow(RangeError);
  });

  it("totals the waits between a policy's attempts", () => {
    expect(totalBackoffMs({ maxAttempts: 4, baseMs: 10, capMs: 25 })).toBe(10 + 20 + 25);
    expect(totalBackoffMs({ maxAttempts: 1, baseMs: 10, capMs: 25 })).toBe(0);
  });
});

describe("retry", () => {
  const policy = { maxAttempts: 4, baseMs: 1, capMs: 2 };

  it("retries a retryable error with the policy's waits, then returns the value", async () => {
    const waits: [number, number][] = [];
    let calls = 0;
    const v = await retry(
      async (n) => {
        calls++;
        if (n < 3) throw new Transient(`attempt ${n}`);
        return n;
      },
      { policy, retryable: (e) => e instanceof Transient, onRetry: (n, ms) => waits.push([n, ms]) },
    );
    expect(v).toBe(3);
    expect(calls).toBe(3);
    expect(waits).toEqual([
      [1, 1],
      [2, 2],
    ]);
  });

  it("runs at most maxAttempts times; the last error goes through `exhausted`", async () => {
    let calls = 0;
    const run = retry(
      async () => {
        calls++;
        throw new Transient("still down");
      },
      {
        policy,
        retryable: () => true,
        exhausted: (last, attempts) => new Error(`gave up after ${attempts}: ${(last as Error).message}`),
      },
    );
    await expect(run).rejects.toThrow("gave up after 4: still down");
    expect(calls).toBe(4);
  });

  it("throws an error it may not retry at once, as it is", async () => {
    const fatal = new Error("bad request");
    let calls = 0;
    const run = retry(
      async () => {
        calls++;
        throw fatal;
      },
      { policy, retryable: (e) => e instanceof Transient, exhausted: () => new Error("not this") },
    );
    await expect(run).rejects.toBe(fatal);
    expect(calls).toBe(1);
  });

  it("an aborted signal cuts the wait short", async () => {
    const ac = new AbortController();
    ac.abort();
    const t0 = performance.now();
    let calls = 0;
    const run = retry(
      async () => {
        calls++;
        throw new Transient("down");
      },
      { policy: { maxAttempts: 3, baseMs: 60_000, capMs: 60_000 }, retryable: () => true, signal: ac.signal },
    );
    await expect(run).rejects.toThrow("down");
    expect(calls).toBe(3);
    expect(performance.now() - t0).toBeLessThan(30_000);
  });

  it("refuses a policy without an attempt", async () => {
    await expect(
      retry(async () => 1, { policy: { maxAttempts: 0, baseMs: 1, capMs: 1 }, retryable: () => true }),
    ).rejects.toThrow(RangeError);
  });
});
