import type { Dispatcher } from 'undici';
import type { Clock } from '../clock.js';
import type { Config } from '../config/types.js';
import type { EndpointRequest } from '../endpoints.js';
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
  }

  async fetch(request: EndpointRequest): Promise<RoutedResult> {
    let last: RoutedResult | undefined;
    for (const name of this.#routes[request.endpoint]) {
      const upstream = this.#upstreams.get(name)!;
      const started = performance.now();
      const result = await upstream.fetch(request);
      last = { result, upstream: name, ms: performance.now() - started };
      if (result.kind !== 'failed' && result.kind !== 'timeout') return last;
    }
    // Validation guarantees every route names at least one upstream.
    return last!;
  }

  async close(): Promise<void> {
    await Promise.all([...this.#upstreams.values()].map((u) => u.close()));
  }
}
