import type { HeaderList } from '../header-list.js';
import type { BudgetStanding } from '../upstream/budget-book.js';
import { secondsToFull, secondsToNextToken, wholeTokens, type Verdict } from './token-bucket.js';

/**
 * Appends the rate-limit fields of the plan's dialects for a verdict, and `Retry-After` when it
 * refused the request. The IETF httpapi-ratelimit-headers draft fields: the policy value is the
 * plan's prebuilt string; only `RateLimit` is formatted per response. Twitter's `x-rate-limit-*`
 * fields carry the same numbers: the plan's size, the whole tokens left, and the moment (epoch
 * seconds, rounded up) the bucket is full again, which is what Twitter/X client libraries wait for.
 */
export function pushRateLimitHeaders(headers: HeaderList, verdict: Verdict, provider?: BudgetStanding): void {
  const { plan } = verdict;
  const remaining = wholeTokens(verdict);
  const toFull = secondsToFull(verdict);
  if (plan.ietf && provider === undefined) headers.push('ratelimit-policy', plan.policyHeader, 'ratelimit', `"${plan.name}";r=${remaining};t=${toFull}`);
  // A plan with provider_calls: its budget is a second policy, "provider", in the same fields.
  else if (plan.ietf) {
    headers.push(
      'ratelimit-policy',
      `${plan.policyHeader}, "provider";q=${provider!.limit};w=${provider!.windowSeconds}`,
      'ratelimit',
      `"${plan.name}";r=${remaining};t=${toFull}, "provider";r=${provider!.remaining};t=${provider!.resetSeconds}`,
    );
  }
  if (plan.xRateLimit !== undefined) {
    const reset = Math.ceil(plan.xRateLimit.clock.now() / 1000) + toFull;
    headers.push('x-rate-limit-limit', plan.capacity, 'x-rate-limit-remaining', remaining, 'x-rate-limit-reset', reset);
  }
  if (!verdict.allowed) headers.push('retry-after', secondsToNextToken(verdict));
}
