import { describe, expect, it } from "vitest";
import { Counter, Registry } from "../../controller/metrics.ts";

/**
 * The registry's bound on label sets is the counter's declaration: every
 * series it can ever hold is known when it is made, a value outside its
 * sets throws (a bug in our code, found by a test, never a series dropped
 * silently), and every declared series keeps counting however many others
 * were used first.
 */
function render(c: Counter<never>): string {
  const r = new Registry();
  r.add(c);
  return r.render();
}

describe("labelled counters", () => {
  it("count every declared label set, all of them, in any order of use", () => {
    const routes = Array.from({ length: 40 }, (_, i) => `GET /r${i}`);
    const statuses = ["200", "404", "500", "499", "other"] as const;
    const c = new Counter("t_total", "test", { route: routes, status: statuses });
    for (const route of routes) for (const status of statuses) c.inc({ route, status });
    c.inc({ route: "GET /r7", status: "200" }, 5);
    expect(c.get({ route: "GET /r7", status: "200" })).toBe(6);
    expect(c.get({ route: "GET /r39", status: "other" })).toBe(1);
    const text = render(c);
    expect(text.split("\n").filter((l) => l.startsWith("t_total{"))).toHaveLength(
      routes.length * statuses.length,
    );
  });

  it("refuse a value outside the declared sets, and a missing or extra label", () => {
    const c = new Counter("t_total", "test", { route: ["a", "b"] });
    expect(() => c.inc({ route: "/probe?x=1" } as never)).toThrow(/not a declared value/);
    expect(() => c.inc({} as never)).toThrow(/labels/);
    expect(() => c.inc({ route: "a", extra: "x" } as never)).toThrow(/labels/);
    expect(c.get({ route: "a" })).toBe(0);
  });

  it("refuse a declaration past the series bound", () => {
    const many = Array.from({ length: 100 }, (_, i) => String(i));
    expect(() => new Counter("t_total", "test", { a: many, b: many })).toThrow(/label sets declared/);
  });

  it("render an unlabelled counter as 0 before its first increment", () => {
    const c = new Counter("u_total", "test");
    expect(render(c)).toMatch(/^u_total 0$/m);
    c.inc({}, 3);
    expect(render(c)).toMatch(/^u_total 3$/m);
    expect(c.get()).toBe(3);
  });
});
