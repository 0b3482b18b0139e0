/** Longest wait perch passes on; a provider asking for more is still retried within a day. */
const MAX_RETRY_AFTER_SECONDS = 86_400;

/**
 * Seconds a client should wait after an upstream 429, from the provider's `Retry-After`
 * (delay-seconds or HTTP-date, RFC 9110 10.2.3) or, failing that, `x-rate-limit-reset` (epoch
 * seconds, as the v1.1-era provider sends it). Always a whole number of at least 1, because the
 * interface promises clients a usable `Retry-After`.
 */
export function retryAfterSeconds(
  retryAfter: string | undefined,
  rateLimitReset: string | undefined,
  nowMs: number,
  fallbackSeconds: number,
): number {
  const seconds = parseRetryAfter(retryAfter, nowMs) ?? parseReset(rateLimitReset, nowMs) ?? fallbackSeconds;
  return Math.min(MAX_RETRY_AFTER_SECONDS, Math.max(1, Math.ceil(seconds)));
}

function parseRetryAfter(value: string | undefined, nowMs: number): number | undefined {
  if (value === undefined) return undefined;
  const trimmed = value.trim();
  if (/^[0-9]+$/.test(trimmed)) return Number(trimmed);
  const date = Date.parse(trimmed);
  return Number.isNaN(date) ? undefined : (date - nowMs) / 1000;
}

function parseReset(value: string | undefined, nowMs: number): number | undefined {
  if (value === undefined || !/^[0-9]{1,12}$/.test(value.trim())) return undefined;
  return Number(value.trim()) - nowMs / 1000;
}
