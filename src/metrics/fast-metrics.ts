import type { Registry } from 'prom-client';

type Labels = Readonly<Record<string, string>>;

interface Sample {
  readonly labels: Labels;
  readonly value: number;
  readonly metricName?: string;
}

/** What prom-client's registry reads from a metric at scrape time. */
interface Exposed {
  readonly name: string;
  readonly help: string;
  readonly type: 'counter' | 'histogram';
  readonly aggregator: 'sum';
  get(): Promise<Exposition>;
  reset(): void;
}

interface Exposition {
  readonly name: string;
  readonly help: string;
  readonly type: string;
  readonly aggregator: 'sum';
  readonly values: readonly Sample[];
}

/** A label value as the request path has it: a status code stays a number until a series is made. */
type LabelValue = string | number;

/**
 * Series found by their label values through one nested Map per label, so the request path
 * builds no composed key string and no label object: the labels are written out once, when a
 * combination is first seen. Up to three labels, the most any per-request metric has.
 */
class SeriesTable<S> {
  readonly #root = new Map<LabelValue, unknown>();
  readonly #all: S[] = [];
  readonly #labelNames: readonly string[];
  readonly #create: (labels: Labels) => S;

  constructor(labelNames: readonly string[], create: (labels: Labels) => S) {
    if (labelNames.length < 1 || labelNames.length > 3) throw new Error('a fast metric has one to three labels');
    this.#labelNames = labelNames;
    this.#create = create;
  }

  at(a: LabelValue, b?: LabelValue, c?: LabelValue): S {
    let level = this.#root;
    const depth = this.#labelNames.length;
    if (depth > 1) level = (level.get(a) as Map<LabelValue, unknown> | undefined) ?? this.#branch(level, a);
    if (depth > 2) level = (level.get(b!) as Map<LabelValue, unknown> | undefined) ?? this.#branch(level, b!);
    const last = depth === 1 ? a : depth === 2 ? b! : c!;
    return (level.get(last) as S | undefined) ?? this.#leaf(level, last, [a, b, c]);
  }

  values(): readonly S[] {
    return this.#all;
  }

  clear(): void {
    this.#root.clear();
    this.#all.length = 0;
  }

  #branch(level: Map<LabelValue, unknown>, value: LabelValue): Map<LabelValue, unknown> {
    const next = new Map<LabelValue, unknown>();
    level.set(value, next);
    return next;
  }

  #leaf(level: Map<LabelValue, unknown>, value: LabelValue, values: readonly (LabelValue | undefined)[]): S {
    const labels = Object.fromEntries(this.#labelNames.map((name, i) => [name, String(values[i])]));
    const series = this.#create(labels);
    level.set(value, series);
    this.#all.push(series);
    return series;
  }
}

/**
 * A counter for the per-request path. prom-client hashes and validates the label object on every
 * `inc`, bound child or not; this one finds its series by the label values (SeriesTable) and
 * counting is then one addition. The registry reads it at scrape time like any other metric.
 */
export class FastCounter implements Exposed {
  readonly type = 'counter';
  readonly aggregator = 'sum' as const;
  readonly #series: SeriesTable<{ readonly labels: Labels; value: number }>;

  constructor(
    readonly name: string,
    readonly help: string,
    labelNames: readonly string[],
    registry: Registry,
  ) {
    this.#series = new SeriesTable(labelNames, (labels) => ({ labels, value: 0 }));
    registry.registerMetric(this as never);
  }

  /** Adds one to the series of these label values, in the order of the label names. */
  inc(a: LabelValue, b?: LabelValue, c?: LabelValue): void {
    this.#series.at(a, b, c).value++;
  }

  async get(): Promise<Exposition> {
    const values = this.#series.values().map(({ labels, value }) => ({ labels, value }));
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }

  reset(): void {
    this.#series.clear();
  }
}

/** A series of a FastHistogram: counts per bucket (not cumulative), sum and count. */
export interface HistogramSeries {
  readonly labels: Labels;
  readonly counts: number[];
  sum: number;
  count: number;
}

/** A histogram with the same reason for being as FastCounter. */
export class FastHistogram implements Exposed {
  readonly type = 'histogram';
  readonly aggregator = 'sum' as const;
  readonly #buckets: readonly number[];
  readonly #series: SeriesTable<HistogramSeries>;

  constructor(
    readonly name: string,
    readonly help: string,
    labelNames: readonly string[],
    buckets: readonly number[],
    registry: Registry,
  ) {
    this.#buckets = buckets;
    this.#series = new SeriesTable(labelNames, (labels) => ({ labels, counts: new Array<number>(buckets.length + 1).fill(0), sum: 0, count: 0 }));
    registry.registerMetric(this as never);
  }

  /** Records `value` in the series of these label values, in the order of the label names. */
  observe(value: number, a: LabelValue, b?: LabelValue, c?: LabelValue): void {
    const series = this.#series.at(a, b, c);
    let i = 0;
    while (i < this.#buckets.length && value > this.#buckets[i]!) i++;
    series.counts[i]!++;
    series.sum += value;
    series.count++;
  }

  async get(): Promise<Exposition> {
    const values: Sample[] = [];
    for (const { labels, counts, sum, count } of this.#series.values()) {
      let cumulative = 0;
      this.#buckets.forEach((le, i) => {
        cumulative += counts[i]!;
        values.push({ labels: { le: String(le), ...labels }, value: cumulative, metricName: `${this.name}_bucket` });
      });
      values.push({ labels: { le: '+Inf', ...labels }, value: count, metricName: `${this.name}_bucket` });
      values.push({ labels, value: sum, metricName: `${this.name}_sum` });
      values.push({ labels, value: count, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }

  reset(): void {
    this.#series.clear();
  }
}
