import type { Logger } from '../logging/logger.js';
import { insured, NodeSwitchLogs, type InsuranceHooks } from '../redis/insurance.js';
import type { Breaker } from '../redis/breaker.js';
import type { NodeBreakers } from '../redis/node-breakers.js';
import type { MemoryLimiter } from './memory-limiter.js';
import type { LeasedLimiter } from './leased-limiter.js';
import type { Plan, Verdict } from './token-bucket.js';

/**
 * Redis decides while it answers; when a command fails or times out, this instance's memory
 * buckets decide instead, so Redis trouble never fails a request. Each memory bucket carries on
 * from the shared bucket as Redis last reported it to this instance, and what it allows is taken
 * off the shared bucket by the key's next call that Redis answers (redis-limiter.ts), so across
 * an outage a client gets at most N times what was left across N instances, not N more buckets:
 * a looser limit for a while beats refusing or erroring every request.
 * The switch is logged once per change of state, not once per request, whoever's failures
 * opened the breaker. A breaker stops asking a Redis that keeps failing: a frozen one would
 * otherwise cost every request a full command timeout, and while the breaker is open the memory buckets answer synchronously. With a cluster
 * each node has its own breaker: keys on healthy nodes stay shared while one node is down.
 * Tokens leased from Redis before it failed are still spent first (see LeasedLimiter).
 */
export class InsuredLimiter {
  readonly #redis: LeasedLimiter;
  readonly #insurance: MemoryLimiter;
  readonly #breakers: NodeBreakers;
  /** One switch per node (see NodeSwitchLogs). */
  readonly #switches: NodeSwitchLogs;

  constructor(redis: LeasedLimiter, insurance: MemoryLimiter, breakers: NodeBreakers, logger: Logger) {
    this.#redis = redis;
    this.#insurance = insurance;
    this.#breakers = breakers;
    this.#switches = new NodeSwitchLogs(logger, {
      down: 'rate limits: Redis failed, falling back to per-instance memory buckets',
      up: 'rate limits: Redis answers again, buckets are shared again',
    });
  }

  /**
   * The switch hears of a breaker that skipped Redis too: the breaker is the node's, so another
   * key's failures or the cache tier's on the same node may have opened it, and the buckets are in
   * memory from then on all the same (seed 5 of the fleet: 1.4 s of them, with no line saying so).
   */
  #hooks(breaker: Breaker): InsuranceHooks {
    const switches = this.#switches.for(breaker);
    return {
      failed: (error) => switches.failed(error),
      recovered: () => switches.recovered(),
      skipped: () => switches.failed(new Error('circuit breaker open')),
    };
  }

  take(keyId: string, plan: Plan, cost: 0 | 1): Verdict | Promise<Verdict> {
    // Tokens already leased are this instance's to spend: no Redis, no breaker, no await.
    const local = this.#redis.takeLocal(keyId, plan, cost);
    if (local !== undefined) return local;
    // A lease on its way serves this request too (or, if it brought nothing, the request asks
    // again). If it fails, the request that took it has told the breaker; the ones that waited
    // for it go to memory without telling it again.
    const leasing = this.#redis.leasing(keyId, plan, cost);
    if (leasing !== undefined) return leasing.then((leased) => (leased ? this.take(keyId, plan, cost) : this.#insurance.take(keyId, plan, cost)));
    const breaker = this.#breakers.for(this.#redis.redisKey(keyId));
    return insured(
      breaker,
      () => this.#redis.takeShared(keyId, plan, cost),
      () => this.#insurance.take(keyId, plan, cost),
      this.#hooks(breaker),
    );
  }

  /** See `LeasedLimiter.replan`. */
  replan(plans: ReadonlyMap<string, Plan>): void {
    this.#redis.replan(plans);
  }

  /** Gives the leased tokens back to Redis; see `LeasedLimiter.close`. */
  close(): Promise<void> {
    return this.#redis.close();
  }
}
