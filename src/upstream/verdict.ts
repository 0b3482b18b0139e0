import type { UpstreamResult } from './upstream.js';

/** How a result weighs on the breaker and the throttle: the provider failed, it answered, or it says nothing. */
export type Verdict = 'failure' | 'success' | 'neutral';

/** The layer that weighs a result. */
export type Judge = 'breaker' | 'throttle';

/**
 * Whether the provider itself is unwell, one rule for every layer that judges its health. A
 * 401/403 is a credential the pool takes out (or an endpoint it stops asking on it), a 429 a stop the guard honours, a refusal a call
 * never made, a timeout the miss deadline imposed a cut of the request's own time, a mapping gap
 * one answer's missing piece: none says the upstream is down.
 *
 * The one case the two judges weigh apart: a batch X refused whole (400) before any call of two
 * or more items of its split was answered. It may be X refusing every call (a field it dropped), which the single
 * lookups' 400s would show the breaker as failures: the breaker counts it as one. The throttle
 * counts it neither way, or the split's own calls, which find the items at fault, would be shed.
 *
 * `verifying`: the call verifies a client's key (pass-through auth), a key anyone can make up,
 * whatever its length or bytes. Only the provider's own faults count then (a 5xx, a reset, a
 * timeout): any other answer (a 400 from a front that refuses a 9 KB header, a 401, an odd body)
 * is about the key, or made-up keys could open the breaker and shed calls for every client.
 */
export function verdictOf(result: UpstreamResult, judge: Judge, verifying = false): Verdict {
  if (verifying && result.kind === 'failed') return result.failure === 'status_5xx' || result.failure === 'connection' ? 'failure' : 'neutral';
  switch (result.kind) {
    case 'ok':
    case 'not_found':
      return 'success';
    case 'bad_request':
      if (result.batch !== undefined && !result.batch.proven) return judge === 'breaker' ? 'failure' : 'neutral';
      return 'success';
    case 'timeout':
      // The miss deadline cut the exchange short: the upstream never had its `timeout_ms`.
      return result.deadline === true ? 'neutral' : 'failure';
    case 'failed':
      return result.failure === 'unauthorized' || result.failure === 'forbidden' || result.failure === 'mapping_gap' ? 'neutral' : 'failure';
    case 'rate_limited':
    case 'refused':
      return 'neutral';
  }
}
