import { getEventListeners } from "node:events";
import { describe, expect, it } from "vitest";
import { CatalogDb } from "../../catalog/db.ts";
import type { LogRecord, TxLogReader, WriterCommit, WriterLease, WriterLog } from "../../catalog/log.ts";
import { EmbeddedLog } from "../../catalog/log-embedded.ts";
import { CatalogWriter } from "../../catalog/writer.ts";
import { sleep } from "../../schema/abort.ts";
import { createLogger } from "../../schema/log.ts";
import { bytes } from "./log-helpers.ts";

/**
 * The writer's retry loop against a log whose commits fail the way a full
 * disk fails them: the batch is decided (the handler runs), then the commit
 * throws. Only a commit that succeeded is progress; backoff and the failure
 * bound must hold across such tries.
 */

interface Attempt {
  readonly at: number;
  /** Abort listeners on the writer's stopping signal when it asked for the lease. */
  readonly listeners: number;
}

/** A log whose leases decide `succeedFirst` batches committed, then fail every commit. */
function failingLog(
  succeedFirst: number,
): TxLogReader & WriterLog & { readonly attempts: Attempt[]; readonly inner: Promise<EmbeddedLog> } {
  const inner = EmbeddedLog.open();
  const attempts: Attempt[] = [];
  let committedSoFar = 0;
  return {
    attempts,
    inner,
    subscribe: async (from, onBatch) => (await inner).subscribe(from, onBatch),
    endOffset: async () => (await inner).endOffset(),
    async acquireWriter(signal?: AbortSignal): Promise<WriterLease> {
      attempts.push({
        at: performance.now(),
        listeners: signal ? getEventListeners(signal, "abort").length : 0,
      });
      let commits = 0;
      return {
        txEnd: 0,
        proposalsOffset: 0,
        get commits() {
          return commits;
        },
        async run(handler: (p: readonly LogRecord[]) => Promise<WriterCommit> | WriterCommit) {
          for (;;) {
            await handler([{ offset: 0, bytes: bytes("not a proposal") }]);
            if (committedSoFar >= succeedFirst) throw new Error("embedded log write failed: ENOSPC");
            committedSoFar++;
            commits++;
          }
        },
        async stop() {},
      };
    },
  };
}

function writerOn(log: ReturnType<typeof failingLog>, maxConsecutiveFailures: number, lines: string[]) {
  return new CatalogWriter({
    log,
    newDb: () => CatalogDb.empty(),
    logger: createLogger({ level: "warn", write: (l) => lines.push(l) }),
    maxConsecutiveFailures,
  });
}

/** How run() ends: its error's message, "resolved", or that it still runs after 20 s (the failure bound here is ≤ 1.5 s). */
async function outcomeOf(writer: CatalogWriter<CatalogDb>): Promise<string> {
  const outcome = await Promise.race([
    writer.run().then(
      () => "resolved",
      (err: Error) => err.message,
    ),
    sleep(20_000).then(() => "still retrying after 20 s"),
  ]);
  await writer.stop();
  return outcome;
}

describe("catalog writer retries", () => {
  it("counts a decided but uncommitted batch as a failure: backs off, leaks no listener, gives up at the bound", async () => {
    const log = failingLog(0);
    const lines: string[] = [];
    const writer = writerOn(log, 5, lines);
    const outcome = await outcomeOf(writer);
    expect(outcome).toBe("embedded log write failed: ENOSPC");
    expect(log.attempts.length).toBe(5);
    // Backoff 100 ms · 2^(n−1) between tries: 100, 200, 400, 800.
    const gaps = log.attempts.slice(1).map((a, i) => a.at - log.attempts[i]!.at);
    for (const [i, min] of [100, 200, 400, 800].entries()) expect(gaps[i]).toBeGreaterThanOrEqual(min - 5);
    expect(log.attempts.map((a) => a.listeners)).toEqual([0, 0, 0, 0, 0]);
    const failures = lines.map((l) => JSON.parse(l)).filter((l) => l.event === "writer.lease_lost");
    expect(failures.map((l) => l.failures)).toEqual([1, 2, 3, 4, 5]);
    await (await log.inner).close();
  }, 30_000);

  it("a lease that committed restarts the count: the next loss backs off from the start", async () => {
    const log = failingLog(3);
    const lines: string[] = [];
    const writer = writerOn(log, 3, lines);
    const outcome = await outcomeOf(writer);
    expect(outcome).toBe("embedded log write failed: ENOSPC");
    // The first lease committed three batches before its loss (count 1), then two more losses reach the bound.
    const failures = lines.map((l) => JSON.parse(l)).filter((l) => l.event === "writer.lease_lost");
    expect(failures.map((l) => l.failures)).toEqual([1, 2, 3]);
    await (await log.inner).close();
  }, 30_000);
});
