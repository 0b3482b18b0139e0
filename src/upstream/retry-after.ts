import { parseImfFixdate } from '../http-date.js';

/** Longest wait perch honours; a provider asking for more is still asked again within a day. */
export const MAX_RETRY_AFTER_SECONDS = 86_400;

/**
 * When the provider may be called again after it said "stop", on the clock: from its
 * `Retry-After` (delay-seconds or IMF-fixdate, RFC 9110 10.2.3) or, failing that,
 * `x-rate-limit-reset` (epoch seconds, as X's API sends it), else `fallbackSeconds` from now.
 * At least one second and at most a day ahead, so a wrong header neither hammers the provider
 * nor locks it out for good.
 */
export function rateLimitUntil(
  retryAfter: string | undefined,
  rateLimitReset: string | undefined,
  nowMs: number,
  fallbackSeconds: number,
): number {
  const until = parseRetryAfter(retryAfter, nowMs) ?? parseReset(rateLimitReset) ?? nowMs + fallbackSeconds * 1000;
  return Math.min(nowMs + MAX_RETRY_AFTER_SECONDS * 1000, Math.max(nowMs + 1000, until));
}

/**
 * Delay-seconds or an IMF-fixdate only. `Date.parse` reads far more than HTTP dates: "1.5", "-1"
 * and "+60" came out as dates in the past, each a 1 s stop that hid a valid `x-rate-limit-reset`
 * beside it (issue 50). Anything else is no Retry-After at all.
 */
function parseRetryAfter(value: string | undefined, nowMs: number): number | undefined {
  if (value === undefined) return undefined;
  const trimmed = value.trim();
  if (/^[0-9]{1,10}$/.test(trimmed)) return nowMs + Number(trimmed) * 1000;
  return parseImfFixdate(trimmed);
}

/** Epoch seconds to epoch ms; undefined unless the value is a plain integer. */
export function parseReset(value: string | undefined): number | undefined {
  if (value === undefined || !/^[0-9]{1,12}$/.test(value.trim())) return undefined;
  return Number(value.trim()) * 1000;
}
