import { describe, expect, it } from "vitest";
import {
  concrete,
  dashboardTargets,
  exportedFamilies,
  metricFamily,
  promqlMetricNames,
} from "./dashboard.ts";

/**
 * The dashboard's shape and the PromQL reader the operations suite uses to
 * check every metric it names against what the servers export
 * (test/e2e/operations.test.ts runs its queries on a real Prometheus).
 */
describe("the Grafana dashboard", () => {
  it("reads metric names out of PromQL, not functions, labels, keywords or windows", () => {
    expect(
      promqlMetricNames(
        'histogram_quantile(0.99, sum by (le) (rate(continuum_ttft_seconds_bucket{job=~"$job"}[$__rate_interval])))',
      ),
    ).toEqual(["continuum_ttft_seconds_bucket"]);
    expect(
      promqlMetricNames(
        'sum by (source) (increase(a_total{x="y"}[5m])) / ignoring (source) group_left () sum(b:rec offset 5m) and on(job) up',
      ),
    ).toEqual(["a_total", "b:rec", "up"]);
    expect(metricFamily("continuum_ttft_seconds_bucket", new Set(["continuum_ttft_seconds"]))).toBe(
      "continuum_ttft_seconds",
    );
    expect(metricFamily("continuum_nope", new Set(["continuum_ttft_seconds"]))).toBeUndefined();
    expect([...exportedFamilies("# HELP a_total x\n# TYPE a_total counter\na_total 1\n")]).toEqual([
      "a_total",
    ]);
  });

  it("has a target with a unique refId and a PromQL expression on the job variable in every panel", () => {
    const targets = dashboardTargets();
    expect(targets.length).toBeGreaterThanOrEqual(12);
    const panels = new Map<string, string[]>();
    for (const t of targets) {
      expect(t.expr, t.panel).toContain('job=~"$job"');
      expect(promqlMetricNames(t.expr).length, t.expr).toBeGreaterThan(0);
      panels.set(t.panel, [...(panels.get(t.panel) ?? []), t.refId]);
    }
    for (const [panel, refs] of panels) expect(new Set(refs).size, panel).toBe(refs.length);
    expect(concrete(targets[0]!.expr, "fleet", "5m")).not.toMatch(/\$/);
  });
});
