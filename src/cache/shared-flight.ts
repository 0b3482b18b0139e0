import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { GuardedRedis } from '../redis/guarded-redis.js';
import { by, GONE, LATE } from '../timers.js';
import type { CacheEntry } from './entry.js';
import type { Generation } from './generation.js';
import type { TieredCache } from './tiered-cache.js';

/** How often an instance waiting on another's fetch looks for the result. */
const POLL_MS = 15;
/**
 * The lease's time past the leader's deadline: after the upstream answers, the leader still
 * stores the entry in Redis before it releases, and a waiting instance must find the entry, not
 * a lapsed lease.
 */
const LEASE_MARGIN_MS = 1000;

// SET NX PX that returns the holder's value (SET's NX and GET together need Redis 7.0). A
// handed-off 404 answers only the instances that waited for it: on a first attempt (ARGV[3] 1)
// it counts as free, so it never answers a request that came after it, as a cache would.
// KEYS[1] lease; ARGV token, PX, first attempt (1 or 0), the hand-off's prefix.
const CLAIM_SCRIPT = `local held = redis.call('get', KEYS[1])
if held and not (ARGV[3] == '1' and string.sub(held, 1, 4) == ARGV[4]) then return held end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false`;
// Deletes the lease only if it is still ours: after it expired another instance may hold it.
const RELEASE_SCRIPT = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
// Hands an answer nothing stores (a 404 under `not_found: 0`) to the instances waiting on the
// lease, in place of the lease, for a moment only: long enough for their next look, too short
// to be a cache. ARGV[1] token, ARGV[2] the answer, ARGV[3] how long.
const HAND_OFF_SCRIPT = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) else return 0 end";
/** The value of a lease that became a handed-off 404: the prefix, then its body. */
const HANDED_404 = '404\n';
/** How long a handed-off answer waits for the instances that waited on the lease: a few polls. */
const HAND_OFF_MS = 5 * POLL_MS;

/** What to do about a miss every instance may be having at once. */
export type Claim =
  | { readonly kind: 'entry'; readonly entry: CacheEntry }
  | { readonly kind: 'answer'; readonly status: 404; readonly body: Buffer }
  /** Every client of the flight left while it waited: nobody is left to fetch for. */
  | { readonly kind: 'left' }
  /** `release`: with the leader's 404 when nothing stored it, handed to the waiting instances. */
  | { readonly kind: 'fetch'; readonly release: (unstored404?: Buffer) => void };

/**
 * Coalescing across instances: the first instance to miss a key takes a lease in Redis
 * (SET NX PX) and fetches; the others poll for the entry it stores. The lease lasts the leader's
 * whole deadline (`server.miss_deadline_ms`: the call cap's queue, retries, credential switches
 * and failover all fit in it) plus a margin to store the entry, so it never expires under a live
 * holder, and a crashed holder delays the others only until it expires. A 404 nothing stores
 * (`not_found: 0`, known only once the provider answered) is handed to the instances waiting,
 * in place of the lease, so they answer with the leader rather than each in turn after it. The deadline is the one
 * in force when the lease is taken, so a reload that changes it applies to the next miss. Without
 * Redis (or with Redis failing) every instance fetches.
 */
export class SharedFlights {
  readonly #guard: GuardedRedis;
  readonly #cache: TieredCache;
  readonly #prefix: string;

  constructor(guard: GuardedRedis, cache: TieredCache, prefix: string) {
    this.#guard = guard;
    this.#cache = cache;
    this.#prefix = prefix;
  }

  /**
   * `generation`: the purge generation of `key` the flight began in. The lease is per
   * generation: once a purge is applied, a new flight takes a lease of its own at once instead
   * of waiting on one begun before the purge, whose answer will not be stored.
   * `deadlineMs`: how long the leader may work on the miss (`server.miss_deadline_ms`).
   * `until`: the caller's own deadline (on `performance.now()`), past which it waits no more.
   * `stop`: aborted when nobody waits for the flight any more; it then waits no more either, not
   * even for a Redis call under way, and takes no lease, as its call would be for nobody.
   */
  async claim(key: string, generation: Generation, deadlineMs: number, until = Infinity, stop?: AbortSignal): Promise<Claim> {
    const leaseMs = deadlineMs + LEASE_MARGIN_MS;
    const lockKey = `${this.#prefix}lock:${generation.all}.${generation.scope}:${key}`;
    const token = randomUUID();
    const deadline = Math.min(performance.now() + leaseMs + POLL_MS, until);
    for (let attempt = 0; ; attempt++) {
      const release = (unstored404?: Buffer) => this.#release(lockKey, token, unstored404);
      // The holder's value comes back when the lease is taken, null when it was free and is ours.
      const first = attempt === 0 ? 1 : 0;
      const asked = this.#guard.run('lease', lockKey, (client) => client.eval(CLAIM_SCRIPT, 1, lockKey, token, leaseMs, first, HANDED_404) as Promise<string | null>);
      const held = await by(asked, deadline, stop);
      // Past the deadline with the ask unanswered (a stalled Redis): the lease may still be
      // taken when Redis resumes, so it is given back after it, on the same connection.
      if (held === LATE) {
        release();
        return { kind: 'fetch', release: () => {} };
      }
      // Unanswered too (GONE), the ask may still take the lease: given back the same way.
      if (held === GONE || stop?.aborted === true) {
        if (typeof held !== 'string') release();
        return { kind: 'left' };
      }
      // undefined: Redis did not answer, so nobody can be waited for. The SET may still run
      // later (a stalled Redis works through its queue when it resumes); releasing with our token
      // afterwards, on the same connection and so in order, keeps it from orphaning the key.
      if (held === undefined) return { kind: 'fetch', release };
      if (typeof held === 'string' && held.startsWith(HANDED_404)) return { kind: 'answer', status: 404, body: Buffer.from(held.slice(HANDED_404.length)) };
      if (held === null) {
        // Another instance may have stored and released between our last look and the lease,
        // even on the first attempt: one more read costs far less than a second upstream call.
        const found = await by(this.#cache.remote(key), deadline, stop);
        if (found === GONE) {
          release();
          return { kind: 'left' };
        }
        if (found === LATE || found?.fresh !== true) return { kind: 'fetch', release };
        release();
        return { kind: 'entry', entry: found.entry };
      }
      if (performance.now() >= deadline) return { kind: 'fetch', release: () => {} };
      await sleep(POLL_MS);
      const found = await by(this.#cache.remote(key), deadline, stop);
      if (found === LATE) return { kind: 'fetch', release: () => {} };
      if (found === GONE) return { kind: 'left' };
      if (found?.fresh === true) return { kind: 'entry', entry: found.entry };
    }
  }

  #release(lockKey: string, token: string, unstored404: Buffer | undefined): void {
    if (unstored404 === undefined) this.#guard.fire('release', (client) => client.eval(RELEASE_SCRIPT, 1, lockKey, token));
    else this.#guard.fire('release', (client) => client.eval(HAND_OFF_SCRIPT, 1, lockKey, token, HANDED_404 + unstored404.toString('utf8'), HAND_OFF_MS));
  }
}

