/**
 * Time source for everything that reasons about time (cache ages, TTLs, token buckets). Injected
 * so tests move time forward instead of sleeping.
 */
export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
}

export const systemClock: Clock = { now: Date.now };
