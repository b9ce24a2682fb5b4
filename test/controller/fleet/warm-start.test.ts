import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readDecisions } from "../../../controller/replay/records.ts";
import type { LoadedModel } from "../../../worker/model/model-dir.ts";
import { promptOf } from "../../worker/restore/harness.ts";
import { tinyModel } from "../../worker/runtime/fixture.ts";
import { type InProcessFleet, startFleet } from "../fleet-harness.ts";

/**
 * The controller offers nothing to a worker that has not finished warming:
 * fw-1 is connected and heartbeating (its heartbeats say ready: false) while
 * fw-0 is warm. Every request goes to fw-0, and each decision records fw-1
 * as dropped for "warming"; once fw-1 says it is ready, it is ranked like
 * any other worker.
 */
let model: LoadedModel;
let cleanupModel: () => Promise<void>;
let fleet: InProcessFleet;

beforeAll(async () => {
  ({ model, cleanup: cleanupModel } = await tinyModel());
  fleet = await startFleet(model, { workers: 2, ready: (i) => i === 0 });
}, 120_000);

afterAll(async () => {
  await fleet?.close();
  await cleanupModel?.();
});

describe("warm start", () => {
  it("a worker that has not finished warming receives no offer", async () => {
    const [warm, warming] = fleet.workers;
    expect(fleet.service.workers().map((w) => [w.workerId, w.live, w.ready])).toEqual([
      ["fw-0", true, true],
      ["fw-1", true, false],
    ]);
    // Four at a time: with fw-1 ready, the bounded load and the queue term would spread them.
    for (let round = 0; round < 2; round++)
      await Promise.all([0, 1, 2, 3].map((i) => fleet.generate(promptOf(200, 10 * round + i), 2)));
    expect(warming!.agent.counters.offers).toBe(0);
    expect(warm!.agent.counters.accepted).toBe(8);
    await fleet.recorder.flush();
    const deadline = Date.now() + 30_000;
    while (readDecisions(fleet.replica.catalog).decisions.length < 8) {
      if (Date.now() > deadline) throw new Error("decisions not applied in 30 s");
      await new Promise((r) => setTimeout(r, 20));
    }
    for (const d of readDecisions(fleet.replica.catalog).decisions) {
      expect(d.worker).toBe("fw-0");
      expect(d.text.dropped).toContainEqual(expect.objectContaining({ workerId: "fw-1", reason: "warming" }));
    }

    warming!.agent.markReady();
    const until = Date.now() + 30_000;
    while (fleet.service.placeableWorkers().length < 2) {
      if (Date.now() > until) throw new Error("fw-1's ready heartbeat did not arrive");
      await new Promise((r) => setTimeout(r, 20));
    }
    // Ready now: it is a candidate like any other (whether it wins is the cost model's call).
    await fleet.generate(promptOf(200, 100), 2);
    await fleet.recorder.flush();
    const last = Date.now() + 30_000;
    while (readDecisions(fleet.replica.catalog).decisions.length < 9) {
      if (Date.now() > last) throw new Error("the ninth decision was not applied in 30 s");
      await new Promise((r) => setTimeout(r, 20));
    }
    const ninth = readDecisions(fleet.replica.catalog).decisions.at(-1)!;
    expect(ninth.text.ranked.some((c) => c.workerId === "fw-1")).toBe(true);
    expect(ninth.text.dropped.some((d) => d.reason === "warming")).toBe(false);
  });
});
