import { describe, expect, it } from "vitest";
import {
  disconnect,
  emptyView,
  expire,
  isLive,
  liveWorkers,
  observe,
} from "../../controller/heartbeat-view.ts";
import { heartbeat, wid } from "./fixtures.ts";

describe("heartbeat view", () => {
  it("keeps the newest (epoch, sequence) and drops older or equal versions", () => {
    let v = observe(emptyView, heartbeat("a", { epoch: 1, sequence: 5, freePages: 10 as never }), 0).view;
    const older = observe(v, heartbeat("a", { epoch: 1, sequence: 4, freePages: 99 as never }), 1);
    expect(older.outcome).toBe("stale");
    expect(older.view).toBe(v);
    const same = observe(v, heartbeat("a", { epoch: 1, sequence: 5, freePages: 98 as never }), 1);
    expect(same.outcome).toBe("stale");
    // A new process (epoch 2) restarts its sequence and still wins.
    const restarted = observe(v, heartbeat("a", { epoch: 2, sequence: 0, freePages: 7 as never }), 2);
    expect(restarted.outcome).toBe("accepted");
    v = restarted.view;
    expect(liveWorkers(v, 2, 100)[0]!.heartbeat.freePages).toBe(7);
    expect(observe(v, heartbeat("a", { epoch: 1, sequence: 99 }), 3).outcome).toBe("stale");
  });

  it("expires an observation older than the TTL against the logical now", () => {
    const v = observe(emptyView, heartbeat("a"), 1000).view;
    expect(isLive(v, wid("a"), 1300, 300)).toBe(true);
    expect(expire(v, 1300, 300).expired).toEqual([]);
    const r = expire(v, 1301, 300);
    expect(r.expired).toEqual(["a"]);
    expect(isLive(r.view, wid("a"), 1301, 300)).toBe(false);
    expect(liveWorkers(r.view, 1301, 300)).toEqual([]);
  });

  it("drops a worker's view on connection loss and never lets an old frame resurrect it", () => {
    let v = observe(emptyView, heartbeat("a", { sequence: 3 }), 0).view;
    v = observe(v, heartbeat("b"), 0).view;
    v = disconnect(v, wid("a"));
    expect(liveWorkers(v, 1, 1000).map((l) => l.heartbeat.workerId)).toEqual(["b"]);
    // A delayed frame of the dead connection (older version) stays dropped.
    expect(observe(v, heartbeat("a", { sequence: 2 }), 2).outcome).toBe("stale");
    // A newer one (the worker reconnected) brings it back.
    expect(observe(v, heartbeat("a", { sequence: 4 }), 2).outcome).toBe("accepted");
  });
});
