import { Packr } from "msgpackr";
import { describe, expect, it } from "vitest";
import {
  AcceptMessage,
  controllerToWorker,
  HeartbeatMessage,
  OfferMessage,
  workerToController,
} from "../../schema/control.ts";
import { encodeMessage, WIRE_VERSION, WireError } from "../../schema/wire.ts";
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
});
