import { LRUCache } from 'lru-cache';
import type { Clock } from '../clock.js';

/** The wait after a key's first failed refresh; each further failure in a row doubles it. */
export const REFRESH_BACKOFF_FIRST_MS = 5000;
/** The longest wait between two refreshes of a key that keeps failing. */
export const REFRESH_BACKOFF_MAX_MS = 300_000;
/** Keys remembered at most: a record is about 200 bytes, so this bounds the map near 2 MB. */
const MAX_KEYS = 10_000;

/**
 * An answer about the request itself (a 400 on its cursor): every refresh would get it again,
 * so it ends stale serving and is what the key is answered with while the backoff lasts.
 */
export interface PermanentAnswer {
  readonly status: number;
  readonly body: Buffer;
}

/** A key whose refreshes fail: how many in a row, until when none starts, and a permanent answer. */
export interface Failing {
  readonly failures: number;
  readonly untilMs: number;
  readonly answer?: PermanentAnswer;
}

/**
 * Per key, how long a refresh that failed keeps the next one from starting. Without it every
 * request for a stale entry whose refresh fails (a provider rejecting a cursor, an outage)
 * started another refresh, back to back, on the provider's budget, for all of `stale_seconds`.
 * The wait doubles with each failure in a row, from `REFRESH_BACKOFF_FIRST_MS` up to
 * `REFRESH_BACKOFF_MAX_MS`, and a success forgets it: with a refresh failing for 10 minutes
 * under steady traffic, 7 calls (at 0, 5, 15, 35, 75, 155 and 315 s) instead of one per request.
 * Per instance: each instance of a fleet backs off on its own, so a fleet of N makes N times that.
 * No jitter: one key's refreshes on one instance are one at a time anyway (coalesced).
 *
 * Bounded like a cache: the least recently failed keys are forgotten first, and a key is forgotten
 * `REFRESH_BACKOFF_MAX_MS` after its wait ends, so a key failing again much later starts over.
 */
export class RefreshBackoff {
  readonly #clock: Clock;
  readonly #keys: LRUCache<string, Failing>;

  constructor(clock: Clock) {
    this.#clock = clock;
    this.#keys = new LRUCache<string, Failing>({ max: MAX_KEYS, perf: { now: () => clock.now() }, ttlResolution: 0, ttlAutopurge: false });
  }

  /** The key's failing record while its wait lasts; undefined when a refresh may start now. */
  waiting(key: string): Failing | undefined {
    const failing = this.#keys.get(key);
    return failing !== undefined && this.#clock.now() < failing.untilMs ? failing : undefined;
  }

  /** Whether the key's refreshes failed lately (its wait may be over): its next answer is recorded. */
  tracks(key: string): boolean {
    return this.#keys.has(key);
  }

  /** A refresh of `key` failed; `answer` when the provider's answer was about the request itself. */
  failed(key: string, answer?: PermanentAnswer): Failing {
    const failures = (this.#keys.get(key)?.failures ?? 0) + 1;
    const waitMs = Math.min(REFRESH_BACKOFF_MAX_MS, REFRESH_BACKOFF_FIRST_MS * 2 ** (failures - 1));
    const failing: Failing = { failures, untilMs: this.#clock.now() + waitMs, ...(answer === undefined ? {} : { answer }) };
    this.#keys.set(key, failing, { ttl: waitMs + REFRESH_BACKOFF_MAX_MS });
    return failing;
  }

  /** A refresh of `key` got an answer: its next failure starts from the first wait again. */
  succeeded(key: string): void {
    this.#keys.delete(key);
  }
}
