import { describe, expect, it } from "vitest";
import { MAX_PREFILLING_ATTEMPTS } from "../../../schema/control.ts";
import { RequestId } from "../../../schema/ids.ts";
import { prefillProgress } from "../../../worker/agent/heartbeat.ts";

const attempt = (
  i: number,
  queuedTokens: number,
  promptLength: number,
  firstTokenAt: number | null = null,
) => ({
  requestId: RequestId(`r${i}`),
  attempt: 1,
  queuedTokens,
  prompt: new Array(promptLength).fill(0),
  firstTokenAt,
});

describe("prefillProgress", () => {
  it("counts what is still to prefill: the accepted estimate less what the forward has done, never below 0", () => {
    const done = new Map([
      ["r0", 0],
      ["r1", 90],
      ["r2", 200],
    ]);
    const p = prefillProgress(
      [attempt(0, 64, 100), attempt(1, 100, 100), attempt(2, 100, 100), attempt(3, 50, 100, 7)],
      (a) => done.get(a.requestId) ?? 0,
    );
    // r0: min(64, 100 − 0) = 64; r1: min(100, 10) = 10; r2: 0; r3 has its first token: left out.
    expect(p.prefilling.map((x) => x.remainingTokens)).toEqual([64, 10, 0]);
    expect(p.queuedTokens).toBe(74);
  });

  it("lists at most MAX_PREFILLING_ATTEMPTS attempts but counts every one's tokens", () => {
    const n = MAX_PREFILLING_ATTEMPTS + 5;
    const p = prefillProgress(
      Array.from({ length: n }, (_, i) => attempt(i, 2, 10)),
      () => 0,
    );
    expect(p.prefilling).toHaveLength(MAX_PREFILLING_ATTEMPTS);
    expect(p.queuedTokens).toBe(2 * n);
  });
});
