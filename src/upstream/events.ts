import type { EndpointName } from '../endpoints.js';
import type { RefusalReason, UpstreamResult } from './upstream.js';

/** A credential's standing, as the pool sees it. */
export type CredentialState = 'active' | 'cooling_down' | 'usage_capped' | 'revoked';

/** An upstream breaker's state. */
export type BreakerState = 'closed' | 'open' | 'half_open';

/** How a revoked credential's recheck went: an answer restored it, a 401/403 kept it out, or no answer came. */
export type RecheckResult = 'restored' | 'rejected' | 'no_answer';

/** What the retry layer did about a failed attempt that could have been retried. */
export type RetryDecision = 'retried' | 'budget_exhausted' | 'no_time' | 'exhausted';

/**
 * What the upstream layers report as they work, for metrics. One object per perch instance
 * (PerchMetrics implements it), passed down by the upstream set; the layers never know about
 * Prometheus. Label values are closed sets or configured names only.
 */
export interface UpstreamEvents {
  /** A call perch did not make, and why. */
  refused(upstream: string, route: EndpointName, reason: RefusalReason): void;
  /**
   * A real call to the provider, for a client key's miss (`keyId`, its metrics label; `''` for
   * perch's own), and what the upstream's `price_per_call` says it costs (absent: no price).
   */
  called(upstream: string, keyId: string, price: number | undefined): void;
  /**
   * One batch call of `keyIds.length` items (their keys' metrics labels, `''` for perch's own;
   * the lead's first) on the wire for its misses (a split's calls are not counted again): its
   * size, and a call saved for each item that rode along. Each item is billed, as `called`, once,
   * when it first goes on the wire, whatever retries and splits follow.
   */
  batched(upstream: string, route: EndpointName, keyIds: readonly string[]): void;
  /** A call that waited in the cap's queue, for how long (admitted or not). */
  queued(upstream: string, seconds: number): void;
  /** A credential changed standing. */
  credentialState(upstream: string, credential: string, state: CredentialState): void;
  /** One recheck call of a revoked credential, and how it went. */
  credentialRecheck(upstream: string, credential: string, result: RecheckResult): void;
  /** A breaker changed state. */
  breakerState(upstream: string, state: BreakerState): void;
  /** One decision of the retry layer. */
  retry(upstream: string, route: EndpointName, decision: RetryDecision): void;
  /** A request left this upstream for the next of its route, and why (a result kind or failure). */
  failover(upstream: string, route: EndpointName, reason: string): void;
  /**
   * One exchange with the provider, timed: the upstream set reports each with the miss it
   * answered; the batch layer a call no waiting miss took the answer of (batch.ts).
   */
  upstream(upstream: string, route: EndpointName, result: UpstreamResult, seconds: number): void;
}

/** Events nobody listens to, for tools and tests that need none. */
export const NO_EVENTS: UpstreamEvents = {
  refused: () => {},
  called: () => {},
  batched: () => {},
  queued: () => {},
  credentialState: () => {},
  credentialRecheck: () => {},
  breakerState: () => {},
  retry: () => {},
  failover: () => {},
  upstream: () => {},
};
