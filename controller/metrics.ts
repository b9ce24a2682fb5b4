/**
 * A small Prometheus text-format registry. Memory is bounded whatever the
 * traffic: histograms have fixed buckets, and a labelled counter declares
 * every value each label may take, so its series are at most the product of
 * those sets — fixed when the counter is made, never grown by a client. A
 * value outside its declared set is a programming error (it throws), never a
 * series dropped silently.
 */

/** Most series one counter may declare (the product of its label sets). */
const MAX_SERIES = 4096;

type Labels = Readonly<Record<string, string>>;
/** Each label's allowed values. */
export type LabelSets = Readonly<Record<string, readonly string[]>>;
/** A label set drawn from declared sets: one allowed value per label. */
export type LabelsOf<S extends LabelSets> = { readonly [K in keyof S]: S[K][number] };

function labelKey(labels: Labels): string {
  return Object.keys(labels)
    .sort()
    .map((k) => `${k}="${labels[k]!.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")}"`)
    .join(",");
}

abstract class Metric {
  constructor(
    readonly name: string,
    readonly help: string,
  ) {}
  abstract render(): string[];
}

export class Counter<S extends LabelSets = Record<never, readonly string[]>> extends Metric {
  private readonly values = new Map<string, number>();
  private readonly allowed: ReadonlyMap<string, ReadonlySet<string>>;

  constructor(name: string, help: string, labels?: S) {
    super(name, help);
    const sets = Object.entries(labels ?? {});
    const series = sets.reduce((n, [, values]) => n * values.length, 1);
    if (series > MAX_SERIES)
      throw new RangeError(`${name}: ${series} label sets declared, over ${MAX_SERIES}`);
    this.allowed = new Map(sets.map(([k, values]) => [k, new Set(values)]));
  }

  inc(labels: LabelsOf<S> = {} as LabelsOf<S>, by = 1): void {
    const given = labels as Labels;
    const keys = Object.keys(given);
    if (keys.length !== this.allowed.size)
      throw new RangeError(
        `${this.name}: labels ${keys.join(",")} are not ${[...this.allowed.keys()].join(",")}`,
      );
    for (const k of keys)
      if (!this.allowed.get(k)?.has(given[k]!))
        throw new RangeError(
          `${this.name}: ${k}=${JSON.stringify(given[k]).slice(0, 64)} is not a declared value`,
        );
    const key = labelKey(given);
    this.values.set(key, (this.values.get(key) ?? 0) + by);
  }
  get(labels: LabelsOf<S> = {} as LabelsOf<S>): number {
    return this.values.get(labelKey(labels as Labels)) ?? 0;
  }
  render(): string[] {
    const out = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} counter`];
    if (this.values.size === 0 && this.allowed.size === 0) out.push(`${this.name} 0`);
    for (const [k, v] of this.values) out.push(`${this.name}${k ? `{${k}}` : ""} ${v}`);
    return out;
  }
}

/** A metric whose labelled values are read from their owner at each scrape. */
abstract class ReadMetric extends Metric {
  constructor(
    name: string,
    help: string,
    private readonly type: "counter" | "gauge",
    private readonly read: () => ReadonlyArray<readonly [Labels, number]>,
  ) {
    super(name, help);
  }
  render(): string[] {
    const out = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} ${this.type}`];
    // The owner's label values come from a fixed enum it defines (tiers, sources, outcomes).
    for (const [labels, v] of this.read()) {
      const k = labelKey(labels);
      out.push(`${this.name}${k ? `{${k}}` : ""} ${v}`);
    }
    return out;
  }
}

/**
 * A counter whose values its owner keeps (plain counters of a hub, a service,
 * a restorer) and the registry reads at each scrape. The owner's values only
 * grow; label sets come from a fixed enum the owner defines.
 */
export class CounterView extends ReadMetric {
  constructor(name: string, help: string, read: () => ReadonlyArray<readonly [Labels, number]>) {
    super(name, help, "counter", read);
  }
}

export class Gauge extends ReadMetric {
  constructor(name: string, help: string, read: () => ReadonlyArray<readonly [Labels, number]>) {
    super(name, help, "gauge", read);
  }
}

/** A histogram's state at one moment: Prometheus's cumulative `le` buckets. */
export interface HistogramSnapshot {
  /** Upper bounds, increasing, the last +Inf. */
  readonly bounds: readonly number[];
  /** Observations ≤ each bound (non-decreasing; the last is the count). */
  readonly cumulative: readonly number[];
}

export class Histogram extends Metric {
  private readonly counts: number[];
  private sum = 0;
  private count = 0;
  constructor(
    name: string,
    help: string,
    private readonly buckets: readonly number[],
  ) {
    super(name, help);
    for (let i = 1; i < buckets.length; i++) {
      if (!(buckets[i]! > buckets[i - 1]!)) throw new Error(`${name}: buckets must increase`);
    }
    this.counts = new Array(buckets.length).fill(0);
  }
  observe(v: number): void {
    this.sum += v;
    this.count += 1;
    for (let i = 0; i < this.buckets.length; i++) if (v <= this.buckets[i]!) this.counts[i]! += 1;
  }
  get observations(): number {
    return this.count;
  }
  /** Cumulative counts per bucket upper bound (the last bound is +Inf), for readers other than the scrape. */
  snapshot(): HistogramSnapshot {
    return { bounds: [...this.buckets, Number.POSITIVE_INFINITY], cumulative: [...this.counts, this.count] };
  }
  render(): string[] {
    const out = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} histogram`];
    for (let i = 0; i < this.buckets.length; i++) {
      out.push(`${this.name}_bucket{le="${this.buckets[i]}"} ${this.counts[i]}`);
    }
    out.push(
      `${this.name}_bucket{le="+Inf"} ${this.count}`,
      `${this.name}_sum ${this.sum}`,
      `${this.name}_count ${this.count}`,
    );
    return out;
  }
}

export class Registry {
  private readonly metrics: Metric[] = [];
  add<M extends Metric>(m: M): M {
    if (this.metrics.some((x) => x.name === m.name)) throw new Error(`metric ${m.name} registered twice`);
    this.metrics.push(m);
    return m;
  }
  /** The registered histogram of that name; throws when there is none (a renamed metric fails at start). */
  histogram(name: string): Histogram {
    const m = this.metrics.find((x) => x.name === name);
    if (!(m instanceof Histogram)) throw new Error(`no histogram ${name} is registered`);
    return m;
  }
  render(): string {
    return `${this.metrics.flatMap((m) => m.render()).join("\n")}\n`;
  }
}

/** Seconds buckets from 1 ms to ~60 s, roughly ×2 apart. */
export const LATENCY_BUCKETS_S = [
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
] as const;
