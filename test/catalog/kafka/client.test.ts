import { type LogEntry, logLevel } from "kafkajs";
import { describe, expect, it } from "vitest";
import { kafkajsLogLine } from "../../../catalog/kafka/client.ts";

/** The kafkajs log filter (catalog/kafka/client.ts), pure. */

const at = new Date("2026-01-02T03:04:05.000Z");
const entry = (message: string, extra: Record<string, unknown> = {}): LogEntry => ({
  namespace: "Connection",
  level: logLevel.ERROR,
  label: "ERROR",
  log: { timestamp: "ignored", logger: "kafkajs", message, ...extra },
});

describe("kafkajs log lines (pure)", () => {
  it("prints one JSON line with the time, level, namespace, message and the entry's fields", () => {
    const line = kafkajsLogLine(entry("Connection error", { broker: "127.0.0.1:9092" }), at);
    expect(line?.endsWith("\n")).toBe(true);
    expect(JSON.parse(line!)).toEqual({
      t: "2026-01-02T03:04:05.000Z",
      src: "kafkajs",
      level: logLevel.ERROR,
      ns: "Connection",
      msg: "Connection error",
      broker: "127.0.0.1:9092",
    });
  });

  it("drops CONCURRENT_TRANSACTIONS answers, in the message or the error, and keeps other errors", () => {
    const concurrent =
      "The producer attempted to update a transaction while another concurrent operation on the same transaction was ongoing";
    expect(
      kafkajsLogLine(entry("Response AddOffsetsToTxn(key: 25, version: 1)", { error: concurrent }), at),
    ).toBe(undefined);
    expect(kafkajsLogLine(entry(concurrent), at)).toBe(undefined);
    expect(
      kafkajsLogLine(entry("Response Produce", { error: "The group coordinator is not available" }), at),
    ).toMatch(/coordinator is not available/);
  });
});
