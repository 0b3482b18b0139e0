import type { HeaderList } from '../server/respond.js';
import { secondsToFull, secondsToNextToken, wholeTokens, type Verdict } from './token-bucket.js';

/**
 * Appends the IETF httpapi-ratelimit-headers draft fields for a verdict, and `Retry-After` when
 * it refused the request. The policy value is the plan's prebuilt string; only `RateLimit` is
 * formatted per response.
 */
export function pushRateLimitHeaders(headers: HeaderList, verdict: Verdict): void {
  const { plan } = verdict;
  headers.push(
    'ratelimit-policy',
    plan.policyHeader,
    'ratelimit',
    `"${plan.name}";r=${wholeTokens(verdict)};t=${secondsToFull(verdict)}`,
  );
  if (!verdict.allowed) headers.push('retry-after', secondsToNextToken(verdict));
}
