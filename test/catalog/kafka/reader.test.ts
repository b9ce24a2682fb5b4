import { afterAll, describe, expect, it } from "vitest";
import { collect, text, uniqueTopics } from "../log-helpers.ts";
import { echoThroughWriter, openLog } from "./helpers.ts";

/** The tx reader (catalog/kafka/reader.ts): logical offsets inside packed tx records. */

const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
});

describe("Kafka tx reader (real broker)", () => {
  it("a subscription from any logical offset finds it inside packed tx records (records hold up to 512 txs, far fewer partition offsets than txs)", async () => {
    const topics = uniqueTopics();
    const log = await openLog(cleanups, topics, { writerTx: { maxRecords: 4_000, maxBytes: 4 << 20 } });
    const n = 1_500;
    const txRecords = await echoThroughWriter(log, topics, n);
    // Packed: the last tx's record sits at a partition offset far below its logical offset.
    expect(txRecords[txRecords.length - 1]!.offset).toBeLessThan(n / 100);
    for (const from of [0, 511, 512, 513, 1_024, 1_200, n - 1]) {
      const got = await collect(log, from, n - from);
      expect(got.map((r) => r.offset)).toEqual(Array.from({ length: n - from }, (_, i) => from + i));
      expect(text(got[0]!.bytes)).toBe(`tx:p${from}`);
    }
  });
});
