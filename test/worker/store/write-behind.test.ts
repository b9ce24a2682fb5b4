import { describe, expect, it } from "vitest";
import { VerifiedChunk } from "../../../worker/store/chunk.ts";
import { StoreClosedError, WriteBehindTimeoutError } from "../../../worker/store/errors.ts";
import { type Reservation, WriteBehindQueue } from "../../../worker/store/write-behind.ts";
import { chunkOf, recorder } from "./fixtures.ts";

/** Uploads that finish only when the test says so: the queue's logic, step by step. */
function gatedUploads() {
  const gates = new Map<string, { resolve: () => void; reject: (e: Error) => void }>();
  const started: string[] = [];
  return {
    started,
    upload: (c: VerifiedChunk) =>
      new Promise<void>((resolve, reject) => {
        started.push(c.id);
        gates.set(c.id, { resolve, reject });
      }),
    finish: (id: string) => gates.get(id)!.resolve(),
    fail: (id: string, e: Error) => gates.get(id)!.reject(e),
  };
}

const verified = (size: number, seed: string) => {
  const c = chunkOf(size, seed);
  return VerifiedChunk.check(c.id, c.bytes, c.meta, { tier: "store", maxObjectBytes: 1 << 30 });
};

const tick = () => new Promise((r) => setTimeout(r, 0));

function reservation(r: Reservation | { refused: string }): Reservation {
  if ("refused" in r) throw new Error(`unexpected refusal: ${r.refused}`);
  return r;
}

describe("write-behind queue", () => {
  it("refuses optional work at once when full, by jobs and by bytes; depth never passes capacity", async () => {
    const g = gatedUploads();
    const q = new WriteBehindQueue({
      capacity: 2,
      maxBytes: 1000,
      concurrency: 1,
      requiredWaitMs: 1000,
      upload: g.upload,
      report: () => {},
    });
    const a = verified(600, "a");
    void reservation(await q.reserve(600, "optional")).commit(a);
    // 600 + 500 > 1000 bytes: refused though a job slot is free.
    expect(await q.reserve(500, "optional")).toEqual({
      refused: expect.stringMatching(/full \(1\/2 jobs, 600 bytes\)/),
    });
    void reservation(await q.reserve(400, "optional")).commit(verified(400, "b"));
    expect(await q.reserve(1, "optional")).toHaveProperty("refused");
    expect(q.stats()).toMatchObject({ depth: 2, bytes: 1000, uploading: 1, refused: 2 });
    g.finish(a.id);
    await tick();
    expect(q.stats()).toMatchObject({ depth: 1, bytes: 400, uploaded: 1 });
  });

  it("a single job larger than maxBytes runs alone rather than never", async () => {
    const g = gatedUploads();
    const q = new WriteBehindQueue({
      capacity: 4,
      maxBytes: 100,
      concurrency: 1,
      requiredWaitMs: 1000,
      upload: g.upload,
      report: () => {},
    });
    const big = verified(500, "big");
    const durable = reservation(await q.reserve(500, "optional")).commit(big);
    expect(await q.reserve(1, "optional")).toHaveProperty("refused");
    g.finish(big.id);
    await durable;
  });

  it("required writes wait in FIFO order and time out with a clear error", async () => {
    const g = gatedUploads();
    const q = new WriteBehindQueue({
      capacity: 1,
      maxBytes: 1 << 20,
      concurrency: 1,
      requiredWaitMs: 50,
      upload: g.upload,
      report: () => {},
    });
    const a = verified(10, "a");
    void reservation(await q.reserve(10, "required")).commit(a);
    const err = await q.reserve(10, "required").catch((e) => e);
    expect(err).toBeInstanceOf(WriteBehindTimeoutError);
    expect(err.message).toMatch(/stayed full \(1\/1 jobs\) for 50 ms/);
    expect(q.stats()).toMatchObject({ waiting: 0, timedOut: 1, depth: 1 });

    const q2 = new WriteBehindQueue({
      capacity: 1,
      maxBytes: 1 << 20,
      concurrency: 1,
      requiredWaitMs: 60_000,
      upload: g.upload,
      report: () => {},
    });
    const x = verified(10, "x");
    void reservation(await q2.reserve(10, "required")).commit(x);
    const order: string[] = [];
    const w1 = q2.reserve(10, "required").then((r) => {
      order.push("first");
      return r;
    });
    const w2 = q2.reserve(10, "required").then((r) => {
      order.push("second");
      return r;
    });
    // An optional write does not overtake waiting required ones.
    expect(await q2.reserve(10, "optional")).toHaveProperty("refused");
    g.finish(x.id);
    const r1 = reservation(await w1);
    expect(order).toEqual(["first"]);
    r1.release();
    reservation(await w2).release();
    expect(order).toEqual(["first", "second"]);
    expect(q2.stats()).toMatchObject({ depth: 0, bytes: 0 });
  });

  it("shares one job between puts of the same chunk, reports failures, and drain lists them", async () => {
    const g = gatedUploads();
    const rec = recorder();
    const q = new WriteBehindQueue({
      capacity: 4,
      maxBytes: 1 << 20,
      concurrency: 2,
      requiredWaitMs: 1000,
      upload: g.upload,
      report: rec.report,
    });
    const a = verified(10, "a");
    const b = verified(10, "b");
    const d1 = reservation(await q.reserve(10, "optional")).commit(a);
    const d2 = reservation(await q.reserve(10, "optional")).commit(a);
    expect(q.pendingFor(a.id)).toBe(d1);
    expect(d2).toBe(d1);
    void reservation(await q.reserve(10, "optional")).commit(b);
    expect(g.started).toEqual([a.id, b.id]);
    const drained = q.drain();
    g.finish(a.id);
    g.fail(b.id, new Error("boom"));
    expect(await drained).toEqual({ uploaded: 1, failed: [{ id: b.id, error: "boom" }] });
    expect(rec.events).toEqual([{ kind: "write-behind-failed", id: b.id, error: "boom" }]);
    expect(q.stats()).toMatchObject({ depth: 0, uploaded: 1, failed: 1 });
  });

  it("cancel drops a queued job; close fails waiters and finishes accepted jobs", async () => {
    const g = gatedUploads();
    const q = new WriteBehindQueue({
      capacity: 2,
      maxBytes: 1 << 20,
      concurrency: 1,
      requiredWaitMs: 60_000,
      upload: g.upload,
      report: () => {},
    });
    const a = verified(10, "a");
    const b = verified(10, "b");
    void reservation(await q.reserve(10, "required")).commit(a);
    const db = reservation(await q.reserve(10, "required")).commit(b);
    expect(q.cancel(b.id)).toBe(true);
    await expect(db).rejects.toThrow(/cancelled/);
    expect(q.cancel(a.id)).toBe(false); // already uploading
    void reservation(await q.reserve(10, "required")).commit(verified(10, "c"));
    const waiter = q.reserve(10, "required");
    const closing = q.close();
    await expect(waiter).rejects.toThrow(StoreClosedError);
    await expect(q.reserve(1, "optional")).rejects.toThrow(StoreClosedError);
    g.finish(a.id);
    await tick();
    g.finish(g.started[1]!);
    expect(await closing).toEqual({ uploaded: 2, failed: [] });
  });
});
