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

/**
 * A counter for the per-request path. prom-client hashes and validates the label object on every
 * `inc`, bound child or not; this one hands out a series object once per label combination and
 * counting is then one addition. The registry reads it at scrape time like any other metric.
 */
export class FastCounter implements Exposed {
  readonly type = 'counter';
  readonly aggregator = 'sum' as const;
  readonly #series = new Map<string, { labels: Labels; value: number }>();

  constructor(
    readonly name: string,
    readonly help: string,
    registry: Registry,
  ) {
    registry.registerMetric(this as never);
  }

  /** The series for `labels`, found by `key` (a string naming the same label values). */
  series(key: string, labels: Labels): { value: number } {
    let series = this.#series.get(key);
    if (series === undefined) {
      series = { labels, value: 0 };
      this.#series.set(key, series);
    }
    return series;
  }

  async get(): Promise<Exposition> {
    const values = [...this.#series.values()].map(({ labels, value }) => ({ labels, value }));
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
  readonly #series = new Map<string, HistogramSeries>();

  constructor(
    readonly name: string,
    readonly help: string,
    buckets: readonly number[],
    registry: Registry,
  ) {
    this.#buckets = buckets;
    registry.registerMetric(this as never);
  }

  series(key: string, labels: Labels): HistogramSeries {
    let series = this.#series.get(key);
    if (series === undefined) {
      series = { labels, counts: new Array<number>(this.#buckets.length + 1).fill(0), sum: 0, count: 0 };
      this.#series.set(key, series);
    }
    return series;
  }

  observe(series: HistogramSeries, value: number): void {
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
