import { describe, expect, it } from "vitest";
import { type Datom, TxMsg, type TxRecord } from "../../schema/catalog.ts";
import { encodeTx } from "../../schema/tx-encode.ts";
import { decodeMessage, encodeMessage, WireError } from "../../schema/wire.ts";
import { rng } from "../catalog/gen.ts";

/** The writer's tx encoder (schema/tx-encode.ts) writes exactly what encodeMessage(TxMsg, …) writes. */

const NUMBERS = [
  0,
  1,
  31,
  32,
  127,
  128,
  255,
  256,
  65_535,
  65_536,
  2 ** 32 - 1,
  2 ** 32,
  2 ** 53 - 1,
  -1,
  -32,
  -33,
  -128,
  -129,
  -32_768,
  -32_769,
  -(2 ** 31),
  -(2 ** 31) - 1,
  1.5,
  -0.25,
  -0,
  Number.NaN,
  Number.POSITIVE_INFINITY,
  Number.NEGATIVE_INFINITY,
  1e300,
  1_700_000_000_123,
];
const STRINGS = [
  "",
  "a",
  "x".repeat(31),
  "x".repeat(32),
  "x".repeat(255),
  "x".repeat(256),
  "x".repeat(65_535),
  "x".repeat(65_536),
  "é".repeat(20),
  "中".repeat(11),
  "中".repeat(100),
  "中".repeat(30_000),
  "😀".repeat(9),
  "a\ud800b",
  "\udc00",
  "ab\ud83d",
  "0123456789abcdef".repeat(4),
];
const ATTRS = ["chunk/node", "replica/verified-at", "model/name", "lease/epoch", "placement/desired"];

function randomTx(r: () => number, n: number): TxRecord {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
  const value = (): string | number | boolean => {
    const k = r();
    return k < 0.4 ? pick(NUMBERS) : k < 0.8 ? pick(STRINGS) : r() < 0.5;
  };
  const datoms: Datom[] = Array.from({ length: n }, () => [
    1 + Math.floor(r() * 2 ** (1 + Math.floor(r() * 29))),
    pick(ATTRS),
    value(),
    r() < 0.8,
  ]);
  return {
    txNo: 1 + Math.floor(r() * 2 ** Math.floor(r() * 40)),
    proposalId: pick(STRINGS),
    clientId: pick(["w0", "client-é", "x".repeat(40)]),
    time: pick(NUMBERS),
    datoms,
  };
}

describe("encodeTx", () => {
  it("writes the bytes encodeMessage writes, on 3,000 random txs, and earlier outputs stay intact", () => {
    const r = rng(5);
    const txs: TxRecord[] = [];
    const outs: Uint8Array[] = [];
    for (let i = 0; i < 3_000; i++) {
      const tx = randomTx(r, [0, 1, 2, 11, 15, 16, 17, 40][i % 8]!);
      txs.push(tx);
      outs.push(encodeTx(tx));
    }
    for (let i = 0; i < txs.length; i++) {
      expect(Buffer.from(outs[i]!).equals(Buffer.from(encodeMessage(TxMsg, txs[i]!)))).toBe(true);
    }
    expect(decodeMessage(TxMsg, outs[3]!)).toEqual(decodeMessage(TxMsg, encodeMessage(TxMsg, txs[3]!)));
  });

  it("array headers of 65,535 and 65,536 datoms match too", () => {
    for (const n of [65_535, 65_536]) {
      const datoms: Datom[] = Array.from({ length: n }, (_, i) => [i + 1, "chunk/start", i, true]);
      const tx: TxRecord = { txNo: 1, proposalId: "p", clientId: "c", time: 2, datoms };
      expect(Buffer.from(encodeTx(tx)).equals(Buffer.from(encodeMessage(TxMsg, tx)))).toBe(true);
    }
  });

  it("refuses a tx over the message limit with the same WireError, and keeps encoding afterwards", () => {
    const big: TxRecord = {
      txNo: 1,
      proposalId: "p",
      clientId: "c",
      time: 2,
      datoms: [[1, "model/name", "x".repeat(17 * 1024 * 1024), true]],
    };
    expect(() => encodeMessage(TxMsg, big)).toThrow(WireError);
    expect(() => encodeTx(big)).toThrow(/catalog\.tx: encoded message is \d+ bytes, over the 16777216 limit/);
    const small: TxRecord = {
      txNo: 2,
      proposalId: "q",
      clientId: "c",
      time: 3,
      datoms: [[1, "lease/epoch", 4, true]],
    };
    expect(Buffer.from(encodeTx(small)).equals(Buffer.from(encodeMessage(TxMsg, small)))).toBe(true);
  });
});
