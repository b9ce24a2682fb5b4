import { Packr } from "msgpackr";
import { describe, expect, it } from "vitest";
import {
  AcceptMessage,
  controllerToWorker,
  HeartbeatMessage,
  MAX_PREFILLING_ATTEMPTS,
  MAX_TOKENS_PER_FRAME,
  MAX_TOP_LOGPROBS,
  maxScoredPromptTokens,
  OfferMessage,
  TokensMessage,
  workerToController,
} from "../../schema/control.ts";
import { encodeMessage, MAX_MESSAGE_BYTES, WIRE_VERSION, WireError } from "../../schema/wire.ts";
import { FP, heartbeat, rid, wid } from "../controller/fixtures.ts";

const plain = new Packr({ useRecords: false, mapsAsObjects: true });

describe("control-plane messages", () => {
  it("round-trip a heartbeat and an offer through their channels", () => {
    const hb = heartbeat("w1", { residentPrefixes: [{ nodeId: FP as never, tokens: 256 as never }] });
    expect(workerToController.decode(encodeMessage(HeartbeatMessage, hb))).toEqual({
      kind: "control.heartbeat",
      message: hb,
    });
    const offer = {
      requestId: rid("r1"),
      attempt: 2,
      workerId: wid("w1"),
      modelFingerprint: FP,
      prompt: [1, 2, 3],
      maxTokens: 16 as never,
      cacheSalt: "",
      sampling: { temperature: 0.7, stop: ["\n"] },
      plan: { source: "resident" as const, cachedTokens: 0 as never, predictedTtftMs: 12.5 },
    };
    expect(controllerToWorker.decode(encodeMessage(OfferMessage, offer)).message).toEqual(offer);
  });

  it("rejects attempt 0, bad ids, negative pages and unknown kinds, naming the field", () => {
    const bad = (body: object) => plain.pack({ v: WIRE_VERSION, kind: "control.accept", ...body });
    const ok = { requestId: "r1", attempt: 1, workerId: "w1", epoch: 1, reservedPages: 3 };
    expect(workerToController.decode(bad(ok)).message).toEqual(ok);
    expect(() => workerToController.decode(bad({ ...ok, attempt: 0 }))).toThrow(/attempt/);
    expect(() => workerToController.decode(bad({ ...ok, workerId: "has space" }))).toThrow(/workerId/);
    expect(() => workerToController.decode(bad({ ...ok, reservedPages: -1 }))).toThrow(/reservedPages/);
    expect(() => controllerToWorker.decode(encodeMessage(AcceptMessage, ok as never))).toThrow(
      /unknown message kind "control.accept"/,
    );
    const hb = plain.pack({
      v: WIRE_VERSION,
      kind: "control.heartbeat",
      ...heartbeat("w1"),
      modelFingerprint: "xyz",
    });
    expect(() => workerToController.decode(hb)).toThrow(WireError);
    expect(() => workerToController.decode(hb)).toThrow(/modelFingerprint/);
  });

  it("a heartbeat's per-attempt progress list is bounded: at the bound it decodes, one past it is refused naming the field", () => {
    const entries = (n: number) =>
      Array.from({ length: n }, (_, i) => ({ requestId: `r${i}`, attempt: 1, remainingTokens: 16 }));
    const hb = (n: number) =>
      plain.pack({
        v: WIRE_VERSION,
        kind: "control.heartbeat",
        ...heartbeat("w1", {
          queue: {
            queuedTokens: 0 as never,
            queuedRequests: 0,
            runningRequests: 0,
            prefilling: entries(n) as never,
          },
        }),
      });
    const at = workerToController.decode(hb(MAX_PREFILLING_ATTEMPTS)).message as unknown as {
      queue: { prefilling: unknown[] };
    };
    expect(at.queue.prefilling).toHaveLength(MAX_PREFILLING_ATTEMPTS);
    expect(() => workerToController.decode(hb(MAX_PREFILLING_ATTEMPTS + 1))).toThrow(/prefilling/);
  });

  it("a tokens frame with the most prompt scores the front door admits still fits one message", () => {
    // Worst case per entry: ids past 2^16 (uint32), ranks too, logprobs that need a float64.
    const entry = (top: number, i: number) => ({
      token: 100_000 + i,
      logprob: -1.2345678901234567 - i,
      rank: 100_000 + i,
      top: Array.from({ length: top }, (_, k) => [200_000 + k, -0.1234567890123 - k] as const),
    });
    for (const top of [0, MAX_TOP_LOGPROBS]) {
      const n = maxScoredPromptTokens(top);
      const frame = {
        requestId: rid("r1"),
        attempt: 1,
        workerId: wid("w1"),
        index: 0,
        tokens: Array.from({ length: MAX_TOKENS_PER_FRAME }, (_, i) => 100_000 + i),
        logprobs: Array.from({ length: MAX_TOKENS_PER_FRAME }, (_, i) => entry(MAX_TOP_LOGPROBS, i)),
        promptLogprobs: Array.from({ length: n }, (_, i) => entry(top, i)),
      };
      const bytes = encodeMessage(TokensMessage, frame as never);
      expect(bytes.length).toBeLessThanOrEqual(MAX_MESSAGE_BYTES);
      // The bound is not loose by much: the scores fill most of the message.
      expect(bytes.length).toBeGreaterThan(0.8 * MAX_MESSAGE_BYTES);
    }
  });
});
