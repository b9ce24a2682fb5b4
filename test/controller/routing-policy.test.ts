import { describe, expect, it } from "vitest";
import { emptyView, type HeartbeatView, observe } from "../../controller/heartbeat-view.ts";
import {
  defaultRouterPolicy,
  type RouterPolicy,
  roundRobinChoice,
  roundRobinRouterPolicy,
  route,
} from "../../controller/router.ts";
import type { Heartbeat } from "../../schema/control.ts";
import { chain, heartbeat, request } from "./fixtures.ts";

/**
 * controller.routing: "ttft" sends a request to the worker that holds its
 * prefix; "round_robin" takes the live workers in turn whatever they hold,
 * each with its best candidate there (bench cluster's baseline).
 */
const c8 = chain(8);
const resident = (n: number) => c8.slice(0, n).map((b) => ({ nodeId: b.nodeId, tokens: b.tokens }));

function viewOf(...hbs: Heartbeat[]): HeartbeatView {
  let v = emptyView;
  for (const hb of hbs) v = observe(v, hb, 0).view;
  return v;
}

function routeAt(policy: RouterPolicy, turn: number, exclude: string[] = []) {
  const view = viewOf(heartbeat("a", { residentPrefixes: resident(8) }), heartbeat("b"), heartbeat("c"));
  return route({
    request: request(c8, 8 * 256 + 100),
    attempt: 1,
    view,
    nowMs: 0,
    catalog: { replicas: [] },
    outstanding: new Map(),
    exclude: new Set(exclude as never[]),
    policy: { ...policy, heartbeatTtlMs: 1000, residentFreshMs: 500 },
    turn,
  });
}

describe("routing policy switch", () => {
  it("ttft picks the worker holding the prefix on every turn", () => {
    for (let t = 0; t < 4; t++) {
      const d = routeAt(defaultRouterPolicy, t);
      expect(d.choice).toMatchObject({ workerId: "a", source: "resident" });
      expect(d.policy).toBe("ttft/v1");
    }
  });

  it("round_robin cycles the workers by id, each with its own best candidate, and records its name", () => {
    const picks = [0, 1, 2, 3, 4, 5].map((t) => routeAt(roundRobinRouterPolicy, t).choice);
    expect(picks.map((c) => c?.workerId)).toEqual(["a", "b", "c", "a", "b", "c"]);
    expect(picks[0]!.source).toBe("resident");
    expect(picks[1]!.source).toBe("recompute");
    expect(routeAt(roundRobinRouterPolicy, 0).policy).toBe("round_robin/v1");
    // The ranking itself is unchanged: the record still lists a's resident candidate first.
    expect(routeAt(roundRobinRouterPolicy, 1).ranked[0]).toMatchObject({ workerId: "a", source: "resident" });
  });

  it("round_robin skips an excluded worker (a failover attempt) and returns null with no candidate", () => {
    expect(routeAt(roundRobinRouterPolicy, 0, ["a"]).choice?.workerId).toBe("b");
    expect(roundRobinChoice([], 3)).toBeNull();
    expect(() => roundRobinChoice([], -1)).toThrow(/turn/);
  });
});
