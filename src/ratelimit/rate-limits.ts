import type { Client } from '../auth/key-store.js';
import type { Clock } from '../clock.js';
import type { AuthConfig, Config, RateLimitPlan } from '../config/types.js';
import type { Logger } from '../logging/logger.js';
import type { RedisConnection } from '../redis/guarded-redis.js';
import type { Timers } from '../timers.js';
import { InsuredLimiter } from './insured-limiter.js';
import { LeasedLimiter } from './leased-limiter.js';
import { MemoryLimiter } from './memory-limiter.js';
import { RedisLimiter } from './redis-limiter.js';
import { compilePlan, type BucketLimiter, type Plan, type Verdict } from './token-bucket.js';

/**
 * The buckets of pass-through verification: every key the provider has not accepted yet shares
 * the first, and those of one client source each share one more (`perch:unverified:<source>`);
 * keys it accepted share the last, and each key has one more per endpoint
 * (`perch:accepted:<key id>:<endpoint>`). No key's id can be one: configured ids have no colon,
 * and a forwarded key's id is `client:` and hex digits.
 */
const UNVERIFIED_ID = 'perch:unverified';
const ACCEPTED_ID = 'perch:accepted';

/** The verification buckets' plans of one `auth` section. */
interface VerificationPlans {
  readonly all: Plan;
  readonly perSource: Plan;
  readonly accepted: Plan;
  readonly perKey: Plan;
}

/**
 * The per-key token buckets of one perch instance. Buckets live in memory when no Redis is
 * configured, else in `rate_limits_redis` (or `cache.redis`) with memory as insurance.
 */
export class RateLimits {
  /**
   * Keyed by the frozen plan object, so a SIGHUP reload (a new config object) gets its plans
   * compiled on first use, and each plan is compiled once, not per request.
   */
  readonly #plans = new WeakMap<RateLimitPlan, Plan>();
  /** The verification buckets' plans, per (frozen) `auth` section. */
  readonly #verification = new WeakMap<AuthConfig, VerificationPlans>();
  readonly #limiter: BucketLimiter;
  readonly #shared: InsuredLimiter | undefined;
  /** `server.*` takes a restart, so the dialects of the first config hold for every plan. */
  readonly #headers: Parameters<typeof compilePlan>[2];

  /**
   * `redis`: the connection of `rate_limits_redis`, else of `cache.redis` (the composition root
   * decides, opens and closes it); absent: the buckets live in this instance's memory.
   */
  constructor(config: Config, deps: { clock: Clock; timers: Timers; logger: Logger; redis?: RedisConnection }) {
    this.#headers = { dialects: config.server.rate_limit_headers, clock: deps.clock };
    if (deps.redis === undefined) {
      this.#limiter = new MemoryLimiter(deps.clock);
      this.#shared = undefined;
      return;
    }
    const memory = new MemoryLimiter(deps.clock, { insurance: true });
    const { settings, guard } = deps.redis;
    const redis = new RedisLimiter(guard.client, {
      prefix: settings.prefix,
      commandTimeoutMs: settings.command_timeout_ms,
      insurance: memory,
    });
    const leased = new LeasedLimiter(redis, { clock: deps.clock, timers: deps.timers, breakers: guard.breakers });
    this.#shared = new InsuredLimiter(leased, memory, guard.breakers, deps.logger);
    this.#limiter = this.#shared;
  }

  /** Before the Redis connection closes: leased tokens not spent go back to the shared buckets. */
  close(): Promise<void> {
    return this.#shared?.close() ?? Promise.resolve();
  }

  /**
   * After a reload to `config`: leases taken under a plan it changed go back at once, clipped at
   * the new capacity.
   */
  reload(config: Config): void {
    if (this.#shared === undefined) return;
    const plans = new Map<string, Plan>();
    for (const name of Object.keys(config.rate_limits)) plans.set(name, this.#compiled(name, config.rate_limits[name]!));
    this.#shared.replan(plans);
  }

  /**
   * The client's plan in `config`, which must be the configuration the client was authenticated
   * against (validation guarantees every key names one of its plans).
   */
  plan(config: Config, client: Client): Plan {
    return this.#compiled(client.plan, config.rate_limits[client.plan]!);
  }

  #compiled(name: string, raw: RateLimitPlan): Plan {
    let plan = this.#plans.get(raw);
    if (plan === undefined) {
      plan = compilePlan(name, raw, this.#headers);
      this.#plans.set(raw, plan);
    }
    return plan;
  }

  /**
   * Takes `cost` tokens (0 looks without spending) from the client's bucket. Synchronous with
   * the memory store, a promise with Redis; never rejects because of Redis.
   */
  take(client: Client, plan: Plan, cost: 0 | 1): Verdict | Promise<Verdict> {
    return this.#limiter.take(client.id, plan, cost);
  }

  /**
   * Takes a turn for one verifying call of pass-through auth, in Redis across the fleet like any
   * key's bucket: undefined when the call may go, else the seconds until one may. Keys the
   * provider has not accepted (`unknown`) share `auth.verify_rate_per_second` and `verify_burst`,
   * so a flood of made-up keys costs the provider a fixed rate of calls whatever the number of
   * keys, and those of one client source take at most `verify_source_share` of it, so one source
   * cannot take every turn from the new keys of others. Keys it accepted (`known`: a stale
   * acceptance renewed, another endpoint checked) draw on a budget of their own
   * (`revalidate_rate_per_second`, `revalidate_burst`), which no made-up key can touch, and one
   * such key takes at most one of its turns per endpoint (`subject`: the key's id and the
   * endpoint) each tenth of `verify_ttl_seconds`: a call that renews nothing (the provider down,
   * or stopping the key) cannot let one accepted key take the turns of all the others.
   */
  async verificationTurn(config: Config, line: 'known' | 'unknown', source: string, subject: string): Promise<number | undefined> {
    const plans = this.#verificationPlans(config.auth);
    if (line === 'known') {
      const own = waitOf(await this.#limiter.take(`${ACCEPTED_ID}:${subject}`, plans.perKey, 1), plans.perKey);
      if (own !== undefined) return own;
      return waitOf(await this.#limiter.take(ACCEPTED_ID, plans.accepted, 1), plans.accepted);
    }
    const own = waitOf(await this.#limiter.take(`${UNVERIFIED_ID}:${source}`, plans.perSource, 1), plans.perSource);
    if (own !== undefined) return own;
    return waitOf(await this.#limiter.take(UNVERIFIED_ID, plans.all, 1), plans.all);
  }

  #verificationPlans(auth: AuthConfig): VerificationPlans {
    let plans = this.#verification.get(auth);
    if (plans === undefined) {
      const plan = (name: string, capacity: number, refill: number) => compilePlan(name, { capacity, refill_per_second: refill, cost_of_hit: 1, provider_weight: 1 }, this.#headers);
      const share = auth.verify_source_share;
      plans = {
        all: plan('verify', auth.verify_burst, auth.verify_rate_per_second),
        perSource: plan('verify-source', Math.max(1, Math.ceil(share * auth.verify_burst)), share * auth.verify_rate_per_second),
        accepted: plan('revalidate', auth.revalidate_burst, auth.revalidate_rate_per_second),
        perKey: plan('revalidate-key', 1, 10 / auth.verify_ttl_seconds),
      };
      this.#verification.set(auth, plans);
    }
    return plans;
  }
}

/** Undefined when the bucket gave its token, else whole seconds until it has one again (at least 1). */
function waitOf(verdict: Verdict, plan: Plan): number | undefined {
  return verdict.allowed ? undefined : Math.max(1, Math.ceil((1 - verdict.tokens) / plan.refillPerSecond));
}
