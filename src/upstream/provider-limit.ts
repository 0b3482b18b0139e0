import { parseReset } from './retry-after.js';
import type { ProviderLimit } from './upstream.js';

type Headers = Readonly<Record<string, string | string[] | undefined>>;

/**
 * What a response says about the provider's own window, from whichever dialect it speaks:
 * X's `x-rate-limit-remaining` + `x-rate-limit-reset` (epoch seconds), the IETF draft's
 * `RateLimit: "policy";r=<remaining>;t=<seconds>` structured field, or its older
 * `RateLimit-Remaining` + `RateLimit-Reset` (seconds) pair. Undefined when it says nothing usable.
 */
export function providerLimit(headers: Headers, nowMs: number): ProviderLimit | undefined {
  const xRemaining = integer(first(headers['x-rate-limit-remaining']));
  const xReset = parseReset(first(headers['x-rate-limit-reset']));
  if (xRemaining !== undefined && xReset !== undefined) return { remaining: xRemaining, resetAtMs: xReset };

  const field = first(headers['ratelimit']);
  if (field !== undefined) {
    const r = integer(/(?:^|;)\s*r=([0-9]+)/.exec(field)?.[1]);
    const t = integer(/(?:^|;)\s*t=([0-9]+)/.exec(field)?.[1]);
    if (r !== undefined && t !== undefined) return { remaining: r, resetAtMs: nowMs + t * 1000 };
  }
  const remaining = integer(first(headers['ratelimit-remaining']));
  const reset = integer(first(headers['ratelimit-reset']));
  if (remaining !== undefined && reset !== undefined) return { remaining, resetAtMs: nowMs + reset * 1000 };
  return undefined;
}

function first(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

function integer(value: string | undefined): number | undefined {
  if (value === undefined || !/^\s*[0-9]{1,12}\s*$/.test(value)) return undefined;
  return Number(value);
}
