import type { Dispatcher } from 'undici';
import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { EndpointName, EndpointRequest } from '../endpoints.js';
import type { PerchMetrics } from '../observability/metrics.js';
import { createFixtureUpstream } from './fixture/fixture-upstream.js';
import type { Upstream, UpstreamResult } from './upstream.js';
import { createV1Upstream } from './v1-upstream.js';

/** The answer that decided a request, with who gave it and how long the exchange took. */
export interface RoutedResult {
  readonly result: UpstreamResult;
  readonly upstream: string;
  readonly ms: number;
}

export interface UpstreamSetOptions {
  readonly clock: Clock;
  /** Per-upstream dispatcher override, by upstream name (tests inject faults this way). */
  readonly dispatchers?: Readonly<Record<string, Dispatcher>>;
  /** Told about every exchange, failover attempts included. */
  readonly metrics?: Pick<PerchMetrics, 'upstream'>;
}

/**
 * The configured upstreams and the per-endpoint order to try them in. A request moves to the
 * next upstream when the current one cannot answer at all (timeout, refused connection, 5xx,
 * unusable body, rejected credentials); an answer about the request itself (found, not found,
 * bad cursor, quota spent) is final, because another provider would say the same or spend quota.
 */
export class UpstreamSet {
  readonly #upstreams: ReadonlyMap<string, Upstream>;
  readonly #routes: Config['routes'];
  readonly #metrics: UpstreamSetOptions['metrics'];
  /** Upstreams whose latest exchange got no usable answer: what readiness reports. */
  readonly #failing = new Set<string>();
  #inFlight = 0;
  #drained: (() => void) | undefined;

  constructor(config: Config, options: UpstreamSetOptions) {
    const upstreams = new Map<string, Upstream>();
    for (const [name, upstream] of Object.entries(config.upstreams)) {
      upstreams.set(
        name,
        upstream.kind === 'fixture'
          ? createFixtureUpstream(name)
          : createV1Upstream(name, upstream, { clock: options.clock, dispatcher: options.dispatchers?.[name] }),
      );
    }
    this.#upstreams = upstreams;
    this.#routes = config.routes;
    this.#metrics = options.metrics;
  }

  async fetch(request: EndpointRequest): Promise<RoutedResult> {
    this.#inFlight++;
    try {
      let last: RoutedResult | undefined;
      for (const name of this.#routes[request.endpoint]) {
        const upstream = this.#upstreams.get(name)!;
        const started = performance.now();
        const result = await upstream.fetch(request);
        last = { result, upstream: name, ms: performance.now() - started };
        this.#metrics?.upstream(name, request.endpoint, result, last.ms / 1000);
        if (result.kind !== 'failed' && result.kind !== 'timeout') {
          this.#failing.delete(name);
          return last;
        }
        this.#failing.add(name);
      }
      // Validation guarantees every route names at least one upstream.
      return last!;
    } finally {
      if (--this.#inFlight === 0) this.#drained?.();
    }
  }

  /**
   * The upstreams of an endpoint's route whose latest exchange answered (or that have not been
   * tried yet). Empty means the endpoint can only fail until one recovers.
   */
  usable(endpoint: EndpointName): string[] {
    return this.#routes[endpoint].filter((name) => !this.#failing.has(name));
  }

  /**
   * Waits for fetches already started (a failover may still need the next upstream of the list),
   * then releases every connection. After a reload the old set is closed this way while the new
   * one already serves.
   */
  async close(): Promise<void> {
    if (this.#inFlight > 0) await new Promise<void>((resolve) => (this.#drained = resolve));
    await Promise.all([...this.#upstreams.values()].map((u) => u.close()));
  }
}
