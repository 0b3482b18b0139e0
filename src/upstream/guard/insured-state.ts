import type { Clock } from '../../clock.js';
import type { Logger } from '../../logging/logger.js';
import type { Breaker } from '../../redis/breaker.js';
import type { NodeBreakers } from '../../redis/node-breakers.js';
import { insured, SwitchLog } from '../../redis/insurance.js';
import { IN_FLIGHT_POLL_MS, type MemoryProviderState } from './memory-state.js';
import type { Admission, AdmitQuery, CallCap, HeldCall, OutcomeReport, OutcomeTotals, ProviderState, Spend, SpendQuery, Stop, StopState } from './provider-state.js';
import type { RedisProviderState } from './redis-state.js';

/**
 * The fleet's shared state while Redis answers, this instance's own while it does not. Without
 * Redis each instance keeps only its share of every cap (`redis_down_share`), never the whole
 * fleet's: "Redis down" must not mean "no limit". Stops are written to both, so what this
 * instance learned still holds through an outage. A breaker stops asking a Redis that keeps
 * failing, so an outage costs a miss nothing; the switch is logged once each way.
 *
 * The two sides count the same calls, so an outage spends no cap twice:
 * - every call Redis admits is recorded in memory too, so the fallback starts from what this
 *   instance spent in the window, not from zero;
 * - once this instance has counted without Redis (an admission asked of memory, or an answer
 *   whose lease Redis could not take), everything memory counts for that upstream (its calls in
 *   the windows and those in flight) is written back to Redis before Redis admits for it again,
 *   and also as soon as the connection is ready again, since a Redis that restarted lost all of
 *   it.
 * So in any window an instance's own calls stay under its share while Redis is away, and the
 * fleet spends at most `max(quota, Σ max(rᵢ, share × quota))`, rᵢ being what instance i had
 * spent through Redis in that window when Redis went away: the quota itself while no instance
 * had spent more than its share (`share` = 1 / instances, the calls spread over them), and at most
 * `(2 - share) × quota` when one instance had spent it all. The same holds for the rate
 * window and `max_concurrent`.
 */
export class InsuredProviderState implements ProviderState {
  readonly #redis: RedisProviderState;
  readonly #memory: MemoryProviderState;
  readonly #breakers: NodeBreakers;
  readonly #switches: SwitchLog;
  /** Upstreams whose count here Redis may lack, each with the generation of its latest change. */
  readonly #diverged = new Map<string, number>();
  #generation = 0;
  /** Write-backs under way: an admission meanwhile waits for it rather than write it all again. */
  readonly #writing = new Map<string, Promise<void>>();
  /** Each upstream's shared cap, whose windows give the written-back keys their expiry. */
  readonly #caps = new Map<string, CallCap>();
  /**
   * Leases answered while Redis could not take the release, per upstream, each until it would
   * end by itself: memory keeps no record of them once answered, the write-back releases them.
   */
  readonly #unreleased = new Map<string, Map<string, number>>();
  readonly #now: () => number;

  constructor(redis: RedisProviderState, memory: MemoryProviderState, breakers: NodeBreakers, logger: Logger, clock: Clock) {
    this.#redis = redis;
    this.#now = () => clock.now();
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
    this.#caps.set(query.upstream, query.cap);
    const breaker = this.#upstream(query.upstream);
    let failure: unknown;
    return insured(
      breaker,
      () => this.#sharedAdmit(free),
      () => {
        if (failure !== undefined && isTimeout(failure) && breaker.state === 'closed') return this.#unanswered(query);
        if (failure !== undefined) this.#switches.failed(failure);
        // Redis may come back without what this instance counts (restarted empty, or it missed
        // these calls): whatever memory decides now, it all goes back.
        this.#diverge(query.upstream);
        return this.#memory.admit({ ...free, cap: query.localCap });
      },
      { failed: (error) => (failure = error), recovered: () => this.#switches.recovered() },
    );
  }

  /**
   * An admission Redis did not answer in time, while its breaker still holds it healthy, is not
   * an outage: Redis may be answering late (a loaded machine, a stalled event loop), and the
   * script may well have run. Admitting from memory then adds this instance's share to what
   * Redis keeps admitting for the others, so the fleet's window gets more than the cap with
   * Redis up. The call waits and asks again instead; the place the script may have taken is given
   * back (the finish runs after it on the same connection), and a Redis that keeps timing out
   * opens the breaker, after which memory decides as in any outage.
   */
  #unanswered(query: AdmitQuery): Admission {
    this.#redis.finish(query.upstream, query.leaseId);
    return { kind: 'over_cap', waitMs: IN_FLIGHT_POLL_MS };
  }

  async #sharedAdmit(query: AdmitQuery): Promise<Admission> {
    const writing = this.#writeBack(query.upstream);
    if (writing !== undefined) await writing;
    const admission = await this.#redis.admit(query);
    if (admission.kind === 'admitted') this.#memory.record({ ...query, cap: query.localCap });
    return admission;
  }

  /** Writes back what memory counts for `upstream` if Redis may lack it; undefined if not. */
  #writeBack(upstream: string): Promise<void> | undefined {
    const generation = this.#diverged.get(upstream);
    if (generation === undefined) return undefined;
    let writing = this.#writing.get(upstream);
    if (writing === undefined) {
      const cap = this.#caps.get(upstream);
      const calls = this.#memory.held(upstream);
      const released = this.#released(upstream, calls);
      writing = (cap === undefined ? Promise.resolve() : this.#redis.writeBack(upstream, cap, [...calls, ...released]))
        .then(() => {
          const unreleased = this.#unreleased.get(upstream);
          for (const call of released) unreleased?.delete(call.id);
          // A change made while the write was on its way is written next time.
          if (this.#diverged.get(upstream) === generation) this.#diverged.delete(upstream);
        })
        .finally(() => this.#writing.delete(upstream));
      this.#writing.set(upstream, writing);
    }
    return writing;
  }

  /** The leases to release in Redis that memory no longer counts; those already ended are dropped. */
  #released(upstream: string, held: readonly HeldCall[]): HeldCall[] {
    const unreleased = this.#unreleased.get(upstream);
    if (unreleased === undefined) return [];
    const now = this.#now();
    const counted = new Set(held.map((call) => call.id));
    const released: HeldCall[] = [];
    for (const [id, end] of unreleased) {
      if (end <= now) unreleased.delete(id);
      else if (!counted.has(id)) released.push({ id, recent: undefined, quota: undefined, lease: undefined });
    }
    return released;
  }

  #diverge(upstream: string): void {
    this.#diverged.set(upstream, ++this.#generation);
  }

  /**
   * The connection to Redis is ready again: a Redis that restarted has lost every call, so each
   * upstream's count here goes back now, before other instances fill the windows again.
   */
  reconnected(): void {
    for (const upstream of this.#memory.upstreams()) {
      this.#diverge(upstream);
      void this.#insured(
        this.#upstream(upstream),
        () => this.#writeBack(upstream) ?? Promise.resolve(),
        () => undefined,
      );
    }
  }

  /** Budgets are the fleet's while Redis answers; while it does not, each instance counts its own. */
  spend(query: SpendQuery): Spend | Promise<Spend> {
    return this.#insured<Spend>(
      this.#budget(query),
      async () => ({ ...(await this.#redis.spend(query)), charged: 'shared' }),
      () => ({ ...this.#memory.spend(query), charged: 'local' }),
    );
  }

  /**
   * Back to the side that counted it: a call counted in memory and refunded to Redis would give
   * the fleet a call it never spent, and the reverse would give memory one for the next outage.
   * A refund Redis cannot take now is lost, which errs on the provider's side.
   */
  refund(query: SpendQuery, spent: Spend): void {
    if (spent.charged === 'local') this.#memory.refund(query);
    else if (this.#budget(query).state !== 'open') this.#redis.refund(query);
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

  /**
   * Released wherever Redis may take it, a half-open breaker's included: a skipped release holds
   * a fleet-wide slot until its lease ends. One Redis cannot take goes back with the write-back.
   */
  finish(upstream: string, leaseId: string): void {
    const { lease: leaseEnd, quotaName } = this.#memory.finish(upstream, leaseId);
    const missed = () => {
      if (leaseEnd !== undefined) {
        let unreleased = this.#unreleased.get(upstream);
        if (unreleased === undefined) this.#unreleased.set(upstream, (unreleased = new Map()));
        // Leases end in about the order they were taken: through a long outage this keeps only
        // those that could still hold a slot.
        const now = this.#now();
        for (const [id, end] of unreleased) {
          if (end > now) break;
          unreleased.delete(id);
        }
        unreleased.set(leaseId, leaseEnd);
      }
      this.#diverge(upstream);
    };
    if (this.#upstream(upstream).state === 'open') missed();
    else this.#redis.finish(upstream, leaseId, missed, quotaName);
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

/** ioredis's answer to a command whose reply did not come within `command_timeout_ms`. */
function isTimeout(error: unknown): boolean {
  return error instanceof Error && error.message === 'Command timed out';
}
