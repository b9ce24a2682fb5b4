import { readFileSync } from "node:fs";

/**
 * The Grafana dashboard (deploy/grafana/continuum-dashboard.json) as the
 * tests read it: every panel's PromQL, and the metric names each names.
 */

export const DASHBOARD_PATH = new URL("../../deploy/grafana/continuum-dashboard.json", import.meta.url);

export interface DashboardTarget {
  readonly panel: string;
  readonly refId: string;
  readonly expr: string;
}

interface Panel {
  readonly title: string;
  readonly targets?: readonly { refId: string; expr: string }[];
}

export function dashboardTargets(): DashboardTarget[] {
  const d = JSON.parse(readFileSync(DASHBOARD_PATH, "utf8")) as { panels: Panel[] };
  return d.panels.flatMap((p) =>
    (p.targets ?? []).map((t) => ({ panel: p.title, refId: t.refId, expr: t.expr })),
  );
}

/** The dashboard's Grafana variables replaced: `$job` by a matcher for `job`, `$__rate_interval` by `window`. */
export function concrete(expr: string, job: string, window: string): string {
  return expr.replaceAll('job=~"$job"', `job=~"${job}"`).replaceAll("$__rate_interval", window);
}

const KEYWORDS = new Set(["by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"]);
const OPERATORS = new Set(["and", "or", "unless"]);

/**
 * The metric names a PromQL expression selects (histogram series suffixes
 * _bucket/_sum/_count kept as written). Strings, label matchers, range and
 * grouping clauses are removed first; what is left that is an identifier not
 * called as a function, nor a keyword, is a metric name.
 */
export function promqlMetricNames(expr: string): string[] {
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, '""')
    .replace(/\{[^}]*\}/g, " ")
    .replace(/\[[^\]]*\]/g, " ")
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, " ");
  const names = new Set<string>();
  for (const m of bare.matchAll(/(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?/g)) {
    const word = m[0].replace(/\s*\($/, "");
    if (m[1] !== undefined || KEYWORDS.has(word) || OPERATORS.has(word)) continue;
    names.add(word);
  }
  return [...names].sort();
}

/** The family a series name belongs to on a /metrics page (a histogram's _bucket, _sum, _count are its own). */
export function metricFamily(name: string, families: ReadonlySet<string>): string | undefined {
  if (families.has(name)) return name;
  const base = name.replace(/_(bucket|sum|count)$/, "");
  return families.has(base) ? base : undefined;
}

/** The metric families a /metrics page declares (its `# TYPE` lines). */
export function exportedFamilies(metricsText: string): Set<string> {
  const out = new Set<string>();
  for (const line of metricsText.split("\n")) {
    const m = /^# TYPE (\S+) \S+$/.exec(line);
    if (m) out.add(m[1]!);
  }
  return out;
}
