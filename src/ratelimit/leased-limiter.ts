import { randomUUID } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import type { Clock } from '../clock.js';
import type { NodeBreakers } from '../redis/node-breakers.js';
import type { Timers } from '../timers.js';
import type { RedisLimiter } from './redis-limiter.js';
import type { Plan, Verdict } from './token-bucket.js';

const MAX_KEYS = 100_000;

/**
 * How long leased tokens may be spent. Short, so that tokens an instance no longer needs (its
 * traffic went to other instances) are back in the shared bucket within a second; what that
 * costs is at least one Redis round trip a second per key an instance serves.
 */
export const LEASE_LIFE_MS = 1000;

/**
 * How long an instance counts, in the shared bucket, among those that lease from it after its
 * last lease (Redis time). Longer than a lease, so an instance between two leases still counts;
 * an instance that stops takes its entry out at once (`close`), and one that died leaves the
 * count within this time.
 */
export const REGISTRATION_MS = 3000;

/**
 * How long Redis keeps a lease's record (its reserve, see redis-limiter.ts) before reclaiming it:
 * the lease's life, plus time for its give-back to arrive. A dead instance's reserve is back in
 * the bucket this long after its last lease.
 */
export const RECORD_MS = LEASE_LIFE_MS + 2000;

interface Lease {
  /** Leased tokens not spent yet. */
  tokens: number;
  /**
   * Tokens of it Redis holds on record (its last quarter): spent only once this instance has sent
   * its next call for the key, so that what Redis reclaims should this instance die is never a
   * token it spent. 0 once a later call was answered.
   */
  reserve: number;
  /** Tokens this lease took from the shared bucket. */
  readonly taken: number;
  /** The shared bucket's tokens right after the lease, for the `RateLimit` header. */
  readonly shared: number;
  /** When its unspent tokens go back (clock ms): its life counted from when it was asked for. */
  readonly expiresAt: number;
  /** The lease taken ahead, spent once this one is spent or lapsed; it lapses on its own clock. */
  next?: Lease;
  /** Cancels the timer that gives the unspent tokens back at `expiresAt`. */
  cancel: () => void;
}

/** A lease down to a quarter (rounded up) takes the next one ahead: at once for a lease of 1-4. */
function lowWater(lease: Lease): boolean {
  return lease.tokens <= Math.ceil(lease.taken / 4);
}

/** One key's leases on this instance, for one compiled plan. */
interface KeyLeases {
  readonly plan: Plan;
  lease: Lease | undefined;
  /** Tokens the next lease asks for: adapts to what this instance spends (see `#lease`). */
  want: number;
  /** When this instance last leased for the key (clock ms): whether its registration may stand. */
  leasedAt: number;
  /** The lease Redis granted last, whose reserve its record holds. */
  newest: Lease | undefined;
}

/**
 * The shared buckets without a Redis round trip per request: an instance takes a lease of tokens
 * from the shared bucket at once and spends them locally, and takes the next lease in the
 * background when a quarter is left.
 *
 * Sizing. A lease asks for what this instance is likely to spend: the first asks for 1 token,
 * each next one (taken ahead, so a growing key's requests rarely wait for Redis) for twice what
 * the last one got, up to `plan.lease`; a lease that lapses with tokens unspent sets the next
 * one to what was spent of it. The shared bucket then grants at most `tokens / (2 n)` of what it
 * holds, `n` being the instances that lease from it (tracked in Redis, see redis-limiter.ts):
 * never less than one token to a request that needs one, and nothing to a lease taken ahead once
 * that share rounds to no token.
 *
 * Giving back. Unspent tokens go back to the shared bucket when their lease lapses,
 * `LEASE_LIFE_MS` after it was asked for, when the key's leases are dropped, and when the
 * instance stops (`close`): all of them, and the script clips the bucket at its capacity. That
 * is exact: below capacity the bucket refilled on its own meanwhile, and had it overflowed
 * without the lease it is at capacity either way.
 *
 * Dying. Redis records each instance's newest lease with its reserve (its last quarter, which
 * the instance spends only once its next call for the key is on its way) for `RECORD_MS`; an
 * instance killed without giving back leaves that record to lapse, and the next call that finds
 * it puts the reserve back. What is lost is the part of a dead instance's lease above its
 * reserve that it had not spent: less than a lease per key.
 *
 * Bounds, with `n` instances leasing from one bucket of capacity `C` refilling `r` a second:
 * - overspend: the bucket never holds more than `C` (refill and give-backs are clipped), so in
 *   any window a client gets at most what was on lease as it began more than its plan allows:
 *   tokens the bucket refilled for while they were out. Not only a second of refill: a lease that
 *   lapses after another lease drew a full bucket below `C` comes back unclipped;
 * - early refusal: a request is refused while other instances hold tokens it could have had. An
 *   instance holds at most two leases (the one it spends and the one taken ahead), each at most
 *   `min(plan.lease, C / (2 n))`, so the others hold at most `(n - 1) / n` of `C`, and hold no
 *   token more than `LEASE_LIFE_MS`; under even load the leases shrink with the bucket (each at
 *   most its share of what is left), so the fleet spends what it holds before the bucket runs
 *   dry, and the early refusals are a few tokens, not `n` leases (measured in
 *   test/rate-limit-lease.test.ts: 600 of 600 over 12 instances, 1000 of 1000 over 50).
 * Plans with `lease` 1 ask Redis for every request, exactly as without leases.
 */
export class LeasedLimiter {
  readonly #redis: RedisLimiter;
  readonly #clock: Clock;
  readonly #timers: Timers;
  /** Taking a lease ahead and giving tokens back ask the node's breaker first, and tell it how the call went. */
  readonly #breakers: NodeBreakers;
  /** This instance in the shared buckets' count of those that lease. */
  readonly #instance: string;
  /**
   * Bounded like the memory buckets, for pass-through keys (`auth.mode: upstream`) that are
   * whatever callers send: a key's leases dropped for room give their unspent tokens back.
   */
  readonly #keys = new LRUCache<string, KeyLeases>({
    max: MAX_KEYS,
    dispose: (leases, keyId, reason) => {
      if (reason === 'evict') this.#lapseAll(keyId, leases);
    },
  });
  /**
   * The lease being taken for a key, one at a time: the requests that need one wait for it
   * together. Settles true when Redis answered, false when the call failed (never rejects).
   */
  readonly #pending = new Map<string, Promise<boolean>>();

  constructor(redis: RedisLimiter, deps: { clock: Clock; timers: Timers; breakers: NodeBreakers; instance?: string }) {
    this.#redis = redis;
    this.#clock = deps.clock;
    this.#timers = deps.timers;
    this.#breakers = deps.breakers;
    this.#instance = deps.instance ?? randomUUID();
  }

  /** The Redis key of a key's bucket (which cluster node decides). */
  redisKey(keyId: string): string {
    return this.#redis.redisKey(keyId);
  }

  /** Spends from this instance's lease when it has what `cost` needs; undefined when Redis must be asked. */
  takeLocal(keyId: string, plan: Plan, cost: 0 | 1): Verdict | undefined {
    if (plan.lease <= 1) return undefined;
    const leases = this.#keys.get(keyId);
    if (leases === undefined || leases.plan !== plan) return undefined;
    const now = this.#clock.now();
    let lease: Lease | undefined;
    for (;;) {
      lease = leases.lease;
      if (lease === undefined) return undefined;
      if (lease.expiresAt <= now) this.#lapse(keyId, leases, lease);
      else if (lease.tokens >= cost) break;
      else if (lease.next === undefined) return undefined;
      leases.lease = lease.next;
    }
    // The reserve is spent only with a call on its way, whose answer replaces Redis's record; a
    // call that cannot go (the breaker is open) leaves it to come back at the lapse.
    if (lease.tokens - cost < lease.reserve && !this.#pending.has(keyId)) {
      this.#takeAhead(keyId, leases);
      if (!this.#pending.has(keyId)) return undefined;
    }
    lease.tokens -= cost;
    if (cost > 0 && lease.next === undefined && lowWater(lease)) this.#takeAhead(keyId, leases);
    const next = lease.next !== undefined && lease.next.expiresAt > now ? lease.next : undefined;
    // Tokens held here (both leases) plus the bucket's at the newest lease.
    return { plan, allowed: true, tokens: Math.min(plan.capacity, (next ?? lease).shared + lease.tokens + (next?.tokens ?? 0)) };
  }

  /**
   * The lease being taken for `keyId`, if any: true once Redis answered it, false when it
   * failed. A request that finds one waits for it rather than asking Redis itself, and one that
   * failed is counted once, by the request that took it, not again by each that waited.
   */
  leasing(keyId: string, plan: Plan, cost: 0 | 1): Promise<boolean> | undefined {
    return plan.lease <= 1 || cost === 0 ? undefined : this.#pending.get(keyId);
  }

  /** Asks Redis: a new lease for leased plans, one token otherwise. Rejects when Redis fails. */
  takeShared(keyId: string, plan: Plan, cost: 0 | 1): Promise<Verdict> {
    if (plan.lease <= 1 || cost === 0) return this.#redis.take(keyId, plan, cost);
    const leasing = this.#lease(keyId, plan);
    this.#track(keyId, leasing.then(() => true, () => false));
    return leasing;
  }

  /**
   * Gives every unspent token back and takes this instance out of the count of every bucket it
   * leased from within its registration, so the fleet's next leases are sized for one instance
   * fewer. Failures are not retried: the tokens then come back with the bucket's refill.
   */
  async close(): Promise<void> {
    const now = this.#clock.now();
    const calls: Promise<void>[] = [];
    for (const [keyId, leases] of this.#keys.entries()) {
      let back = 0;
      for (let lease = leases.lease; lease !== undefined; lease = lease.next) {
        lease.cancel();
        back += lease.tokens;
      }
      if (back > 0 || now - leases.leasedAt < REGISTRATION_MS) calls.push(this.#giveBack(keyId, leases.plan, back, true, true));
    }
    this.#keys.clear();
    await Promise.all(calls);
  }

  /**
   * A reload compiled `plans` (by name): each key's leases on a plan whose capacity it lowered go
   * back at once, clipped at the new capacity, so a reload that lowers a capacity leaves no
   * bucket above it (the script clips at the capacity it is given).
   */
  replan(plans: ReadonlyMap<string, Plan>): void {
    for (const [keyId, leases] of [...this.#keys.entries()]) {
      const plan = plans.get(leases.plan.name);
      // Other changes wait for the key's next request (`#leasesFor`), as any new plan does.
      if (plan === undefined || plan.capacity >= leases.plan.capacity) continue;
      this.#keys.delete(keyId);
      this.#lapseAll(keyId, leases, plan);
    }
  }

  async #lease(keyId: string, plan: Plan): Promise<Verdict> {
    const leases = this.#leasesFor(keyId, plan);
    const askedAt = this.#clock.now();
    const { taken, tokens, reserve } = await this.#redis.lease(keyId, plan, leases.want, 1, this.#instance, REGISTRATION_MS, RECORD_MS);
    if (this.#keys.get(keyId) !== leases) {
      // Dropped while Redis answered (evicted, or the plan changed): the request spends one, the rest goes back.
      if (taken > 1) void this.#giveBack(keyId, plan, taken - 1, true, false);
      return { plan, allowed: taken > 0, tokens };
    }
    this.#answered(leases);
    if (taken === 0) return { plan, allowed: false, tokens };
    leases.want = Math.min(plan.lease, 2 * taken);
    const lease = this.#newLease(keyId, leases, askedAt, taken, tokens, reserve, taken - 1);
    leases.lease = lease;
    // A small lease (while a key's leases grow) is at its low water at once: the next request
    // finds the next lease there rather than asking Redis itself.
    if (lowWater(lease)) this.#takeAhead(keyId, leases, true);
    return { plan, allowed: true, tokens: Math.min(plan.capacity, tokens + taken - 1) };
  }

  /**
   * The key's leases for `plan`; those of a plan a reload replaced give their tokens back, clipped
   * at the new plan's capacity (a reload that lowers it leaves no bucket above it).
   */
  #leasesFor(keyId: string, plan: Plan): KeyLeases {
    const current = this.#keys.get(keyId);
    if (current !== undefined && current.plan === plan) return current;
    if (current !== undefined) this.#lapseAll(keyId, current, plan);
    const fresh: KeyLeases = { plan, lease: undefined, want: 1, leasedAt: this.#clock.now(), newest: undefined };
    this.#keys.set(keyId, fresh);
    return fresh;
  }

  /** A call for the key was answered: Redis's record now holds no earlier lease's reserve. */
  #answered(leases: KeyLeases): void {
    for (let lease = leases.lease; lease !== undefined; lease = lease.next) lease.reserve = 0;
    leases.newest = undefined;
  }

  /**
   * `taken` tokens just leased (asked for at `askedAt`), `shared` left in the bucket, `tokens` of
   * them still to spend, `reserve` on Redis's record. Its life counts from when it was asked for,
   * before Redis granted it: this instance stops spending it before Redis could reclaim any of it.
   */
  #newLease(keyId: string, leases: KeyLeases, askedAt: number, taken: number, shared: number, reserve: number, tokens = taken): Lease {
    const now = this.#clock.now();
    leases.leasedAt = now;
    const life = Math.max(0, askedAt + LEASE_LIFE_MS - now);
    const lease: Lease = { tokens, taken, shared, reserve: Math.min(reserve, tokens), expiresAt: askedAt + LEASE_LIFE_MS, cancel: () => {} };
    leases.newest = lease;
    if (tokens > 0) lease.cancel = this.#timers.after(life, () => this.#lapse(keyId, leases, lease));
    return lease;
  }

  /**
   * Takes the next lease while this one still has a quarter left. Runs behind the request that
   * crossed the mark; requests that run out before it lands wait for it like for any lease
   * (`#pending`). A refused or failed lease leaves things as they were: the next request that
   * finds nothing left asks Redis itself, with the usual fallback. It asks for no token the
   * fleet's share does not leave (`need` 0), so at the bucket's end no instance holds one ahead.
   * `replacing`: called by the lease about to land, whose place in `#pending` it takes.
   */
  #takeAhead(keyId: string, leases: KeyLeases, replacing = false): void {
    if (!replacing && this.#pending.has(keyId)) return;
    const breaker = this.#breakers.for(this.#redis.redisKey(keyId));
    if (!breaker.allow()) return;
    const { plan } = leases;
    const askedAt = this.#clock.now();
    const leasing = this.#redis.lease(keyId, plan, leases.want, 0, this.#instance, REGISTRATION_MS, RECORD_MS).then(
      ({ taken, tokens, reserve }) => {
        breaker.success();
        if (this.#keys.get(keyId) !== leases) {
          if (taken > 0) void this.#giveBack(keyId, plan, taken, true, false);
          return true;
        }
        this.#answered(leases);
        // Redis answered, even with nothing: the requests that waited ask it themselves.
        if (taken === 0) return true;
        leases.want = Math.min(plan.lease, 2 * taken);
        const ahead = this.#newLease(keyId, leases, askedAt, taken, tokens, reserve);
        if (leases.lease === undefined) leases.lease = ahead;
        else {
          let last = leases.lease;
          while (last.next !== undefined) last = last.next;
          last.next = ahead;
        }
        return true;
      },
      () => {
        breaker.failure();
        return false;
      },
    );
    this.#track(keyId, leasing);
  }

  #track(keyId: string, leasing: Promise<boolean>): void {
    this.#pending.set(keyId, leasing);
    void leasing.then(() => {
      if (this.#pending.get(keyId) === leasing) this.#pending.delete(keyId);
    });
  }

  /**
   * A lease's time is up (or its key's leases are dropped): what it did not spend goes back, and
   * the next lease asks for what this one spent, at least one token.
   */
  #lapse(keyId: string, leases: KeyLeases, lease: Lease, plan = leases.plan): void {
    lease.cancel();
    if (lease.tokens <= 0) return;
    const back = lease.tokens;
    const reserve = lease.reserve;
    leases.want = Math.max(1, lease.taken - lease.tokens);
    lease.tokens = 0;
    lease.reserve = 0;
    // The newest lease: Redis's record is this lease's, and goes. (Were a later call on its way
    // and answered first, its record goes too: a record missing loses tokens only should this
    // instance die, one left in place would hand them out twice.)
    const newest = leases.newest === lease;
    if (newest) leases.newest = undefined;
    void this.#giveBack(keyId, plan, back, newest, false, newest ? reserve : 0);
  }

  /** Gives back every lease of the key, clipped at `plan`'s capacity (the new plan on a reload). */
  #lapseAll(keyId: string, leases: KeyLeases, plan = leases.plan): void {
    for (let lease = leases.lease; lease !== undefined; lease = lease.next) this.#lapse(keyId, leases, lease, plan);
    leases.lease = undefined;
  }

  /**
   * `recorded`: of `tokens`, those Redis holds on record (the newest lease's reserve). A give-back
   * the breaker keeps from Redis is not lost: it goes with the key's next call that Redis answers,
   * as what memory allowed does, and that call takes off the reserve should the record have lapsed
   * and been reclaimed meanwhile (see redis-limiter.ts).
   */
  #giveBack(keyId: string, plan: Plan, tokens: number, newest: boolean, leaving: boolean, recorded = 0): Promise<void> {
    const breaker = this.#breakers.for(this.#redis.redisKey(keyId));
    if (!breaker.allow()) {
      if (!leaving) this.#redis.credit(keyId, plan, tokens, recorded > 0);
      return Promise.resolve();
    }
    return this.#redis.giveBack(keyId, plan, tokens, this.#instance, newest, leaving).then(
      () => breaker.success(),
      () => breaker.failure(),
    );
  }
}
