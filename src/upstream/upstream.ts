import type { EndpointRequest } from '../endpoints.js';

/**
 * What one upstream answered, already reduced to what perch acts on. Upstream bodies other
 * than a validated success never travel further than this: errors carry a reason for the log
 * and nothing the client will see.
 */
export type UpstreamResult =
  /** 2xx with a JSON body of the endpoint's shape; `body` is the exact bytes received. */
  | { readonly kind: 'ok'; readonly body: Buffer }
  /** The user or tweet does not exist (upstream 404). Cacheable. */
  | { readonly kind: 'not_found' }
  /** The upstream rejected the request's cursor (upstream 400 on a request with a cursor). */
  | { readonly kind: 'bad_request'; readonly reason: string }
  /** Upstream 429: its quota is spent; `retryAfterSeconds` is whole seconds, at least 1. */
  | { readonly kind: 'rate_limited'; readonly retryAfterSeconds: number }
  /** Anything perch cannot serve: 5xx, refused or reset connection, bad body, 401/403. */
  | { readonly kind: 'failed'; readonly failure: UpstreamFailure; readonly reason: string }
  /** No complete answer within the upstream's `timeout_ms`. */
  | { readonly kind: 'timeout'; readonly reason: string };

/**
 * Why an upstream exchange failed, a closed set so logs and metrics can count them.
 * `unauthorized` is the provider rejecting perch's own credential (401/403): an operator problem,
 * logged as an error, never reported to the client as an invalid key.
 */
export type UpstreamFailure = 'status_5xx' | 'connection' | 'bad_body' | 'unauthorized' | 'unexpected_status';

export interface Upstream {
  /** The name under `upstreams` in the config. */
  readonly name: string;
  /** Never rejects: every failure is a result. */
  fetch(request: EndpointRequest): Promise<UpstreamResult>;
  /** Releases connections; pending fetches settle. */
  close(): Promise<void>;
}
