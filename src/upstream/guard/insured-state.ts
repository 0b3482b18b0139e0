import type { Logger } from '../../logging/logger.js';
import type { Breaker } from '../../redis/breaker.js';
import type { NodeBreakers } from '../../redis/node-breakers.js';
import { insured, SwitchLog } from '../../redis/insurance.js';
import type { MemoryProviderState } from './memory-state.js';
import type { Admission, AdmitQuery, OutcomeReport, OutcomeTotals, ProviderState, Spend, SpendQuery, Stop, StopState } from './provider-state.js';
import type { RedisProviderState } from './redis-state.js';

/**
 * The fleet's shared state while Redis answers, this instance's own while it does not. Without
 * Redis each instance keeps only its share of every cap (`redis_down_share`), never the whole
 * fleet's: "Redis down" must not mean "no limit". Stops are written to both, so what this
 * instance learned still holds through an outage. A breaker stops asking a Redis that keeps
 * failing, so an outage costs a miss nothing; the switch is logged once each way.
 */
export class InsuredProviderState implements ProviderState {
  readonly #redis: RedisProviderState;
  readonly #memory: MemoryProviderState;
  readonly #breakers: NodeBreakers;
  readonly #switches: SwitchLog;

  constructor(redis: RedisProviderState, memory: MemoryProviderState, breakers: NodeBreakers, logger: Logger) {
    this.#redis = redis;
    this.#memory = memory;
    this.#breakers = breakers;
    this.#switches = new SwitchLog(logger, {
      down: 'provider guard: Redis failed, each instance keeps its share of every cap (redis_down_share)',
      up: 'provider guard: Redis answers again, caps and stops are shared again',
    });
  }

  admit(query: AdmitQuery): Admission | Promise<Admission> {
    // A stop this instance recorded holds at once: the shared record may still be on its way to
    // Redis, and calls admitted there meanwhile would reach a provider that already said stop.
    const local = this.#memory.unstopped(query);
    if (local.candidates.length === 0 && local.earliest !== undefined) return { kind: 'stopped', ...local.earliest };
    const free = local.candidates.length === query.candidates.length ? query : { ...query, candidates: local.candidates };
    return this.#insured(
      this.#upstream(query.upstream),
      () => this.#redis.admit(free),
      () => this.#memory.admit({ ...free, cap: query.localCap }),
    );
  }

  /** Budgets are the fleet's while Redis answers; while it does not, each instance counts its own. */
  spend(query: SpendQuery): Spend | Promise<Spend> {
    return this.#insured(
      this.#budget(query),
      () => this.#redis.spend(query),
      () => this.#memory.spend(query),
    );
  }

  refund(query: SpendQuery): void {
    this.#memory.refund(query);
    if (this.#budget(query).state === 'closed') this.#redis.refund(query);
  }

  /** The throttle goes on with this instance's own counts while Redis is away. */
  exchange(report: OutcomeReport): OutcomeTotals | undefined | Promise<OutcomeTotals | undefined> {
    return this.#insured<OutcomeTotals | undefined>(
      this.#upstream(report.upstream),
      () => this.#redis.exchange(report),
      () => undefined,
    );
  }

  /** Redis's answer while its breaker lets it be asked and it answers; this instance's otherwise. */
  #insured<T>(breaker: Breaker, shared: () => Promise<T>, local: () => T): T | Promise<T> {
    return insured(breaker, shared, local, this.#switches);
  }

  /** The breaker of the node holding an upstream's keys (one for a single Redis). */
  #upstream(upstream: string): Breaker {
    return this.#breakers.for(this.#redis.upstreamKey(upstream));
  }

  #budget(query: SpendQuery): Breaker {
    return this.#breakers.for(this.#redis.budgetKey(query));
  }

  finish(upstream: string, leaseId: string): void {
    this.#memory.finish(upstream, leaseId);
    if (this.#upstream(upstream).state === 'closed') this.#redis.finish(upstream, leaseId);
  }

  withdraw(upstream: string, payer: string): void {
    if (this.#upstream(upstream).state === 'closed') this.#redis.withdraw(upstream, payer);
  }

  async stop(stop: Stop): Promise<void> {
    this.#memory.stop(stop);
    if (this.#upstream(stop.upstream).state === 'closed') await this.#redis.stop(stop);
  }

  async lift(upstream: string, credential: string, scope: string, state: StopState): Promise<void> {
    this.#memory.lift(upstream, credential, scope, state);
    if (this.#upstream(upstream).state === 'closed') await this.#redis.lift(upstream, credential, scope, state);
  }

  /** Fleet-wide while Redis answers; while it does not, each instance takes its own turns. */
  claim(upstream: string, what: string, ttlMs: number): boolean | Promise<boolean> {
    return this.#insured(
      this.#upstream(upstream),
      () => this.#redis.claim(upstream, what, ttlMs),
      () => this.#memory.claim(upstream, what, ttlMs),
    );
  }

  async close(): Promise<void> {}
}
