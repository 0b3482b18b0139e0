import { randomUUID } from 'node:crypto';
import type { Clock } from '../../clock.js';
import type { Logger } from '../../logging/logger.js';
import type { Timers } from '../../timers.js';
import { BREAKER_COOL_DOWN_MS, type Breaker } from '../../redis/breaker.js';
import type { NodeBreakers } from '../../redis/node-breakers.js';
import { insured, NodeSwitchLogs } from '../../redis/insurance.js';
import { MAX_RECONNECT_DELAY_MS } from '../../redis/redis-client.js';
import { IN_FLIGHT_POLL_MS, type MemoryProviderState } from './memory-state.js';
import { localBudget, type Admission, type AdmitQuery, type CallCap, type HeldCall, type OutcomeReport, type OutcomeTotals, type ProviderState, type Spend, type SpendQuery, type Stop, type StopState } from './provider-state.js';
import type { RedisProviderState } from './redis-state.js';

/** How many times more a call that may not wait asks a Redis that answered it too late: once, so
 * that one call alone never moves the breaker to open, and memory admit it, for a held reply. */
const UNANSWERED_REASKS = 1;

/** How often what Redis is owed is tried again while nothing else sends it. */
const RETRY_MS = 1000;

/**
 * How much later than the first instance back another may reach a Redis that restarted: its
 * breaker, opened by the outage, probes after its cool-down; its client tries to connect again
 * this often at most; its write-back is retried this often. Until then its calls, counted on its
 * own within its share, are missing from Redis however short a part's window is: an instance
 * that took the whole rate a second after coming back let the provider see the rate and that
 * instance's share in a second (6 calls under a cap of 4, share 0.5, the other back 2.5 s later).
 */
const RECONNECT_LAG_MS = BREAKER_COOL_DOWN_MS + MAX_RECONNECT_DELAY_MS + RETRY_MS;

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
 * A Redis that restarted empty (a generation key of the upstream missing or changed after a
 * reconnection) admits for this instance only within its share of each part of the cap for that
 * part's window, as an outage does: the other instances' calls are back only once each of them
 * has reconnected, or once they have aged out of the window.
 * Stops go back the same way: every stop memory still holds for the upstream is written with
 * its end before the calls, so one learned while Redis was away, or lost by a restart, holds
 * for the fleet again once Redis returns.
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
  /** One switch per node (see NodeSwitchLogs). */
  readonly #switches: NodeSwitchLogs;
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
  /** The generation of each upstream's keys last seen in Redis, and its check on this connection. */
  readonly #generations = new Map<string, string>();
  readonly #checked = new Map<string, Promise<void>>();
  /** Upstreams whose Redis came back empty, each since when its windows may lack others' calls. */
  readonly #freshSince = new Map<string, number>();
  /** The latest admission asked within the share, per upstream: the next waits for it. */
  readonly #turns = new Map<string, Promise<void>>();
  /** Calls charged to budgets here that Redis has not counted yet, by budget key. */
  readonly #unsent = new Map<string, { query: SpendQuery; calls: number }>();

  /** Retries what Redis is owed while nothing else would send it; absent, nothing retries. */
  readonly #timers: Timers | undefined;
  #retrying = false;
  #cancelRetry: (() => void) | undefined;

  constructor(redis: RedisProviderState, memory: MemoryProviderState, breakers: NodeBreakers, logger: Logger, clock: Clock, timers?: Timers) {
    this.#redis = redis;
    this.#timers = timers;
    this.#now = () => clock.now();
    this.#memory = memory;
    this.#breakers = breakers;
    this.#switches = new NodeSwitchLogs(logger, {
      down: 'provider guard: Redis failed, each instance keeps its share of every cap (redis_down_share)',
      up: 'provider guard: Redis answers again, caps and stops are shared again',
    });
  }

  admit(query: AdmitQuery): Admission | Promise<Admission> {
    return this.#admit(query, UNANSWERED_REASKS);
  }

  #admit(query: AdmitQuery, reasks: number): Admission | Promise<Admission> {
    // A stop this instance recorded holds at once: the shared record may still be on its way to
    // Redis, and calls admitted there meanwhile would reach a provider that already said stop.
    const local = this.#memory.unstopped(query);
    if (local.candidates.length === 0 && local.earliest !== undefined) return { kind: 'stopped', ...local.earliest };
    const free = local.candidates.length === query.candidates.length ? query : { ...query, candidates: local.candidates };
    this.#caps.set(query.upstream, query.cap);
    const breaker = this.#upstream(query.upstream);
    let failure: unknown;
    let unanswered = false;
    const admission = insured(
      breaker,
      () => this.#sharedAdmit(free),
      () => {
        if (failure !== undefined && isTimeout(failure) && breaker.state === 'closed') {
          unanswered = true;
          return this.#unanswered(query);
        }
        if (failure !== undefined) this.#switches.for(breaker).failed(failure);
        // Redis may come back without what this instance counts (restarted empty, or it missed
        // these calls): whatever memory decides now, it all goes back.
        this.#diverge(query.upstream);
        return this.#memory.admit({ ...free, cap: query.localCap });
      },
      { failed: (error) => (failure = error), recovered: () => this.#switches.for(breaker).recovered() },
    );
    if (!(admission instanceof Promise)) return admission;
    return admission.then((answer) => {
      // A call that may not wait (queue_timeout_ms 0) would be refused for Redis's slowness, not
      // for the cap: it asks again at once, after the finish of the late ask, a few times. Each
      // unanswered ask moves the breaker, so a Redis that keeps timing out still opens it.
      if (unanswered && query.waits === false && reasks > 0) return this.#admit(query, reasks - 1);
      this.#writeBackOthers(query.upstream);
      this.#writeBackOtherSpends();
      return answer;
    });
  }

  /**
   * After an admission asked Redis: what other upstreams owe it goes back too, though their own
   * calls may not ask it (a stop learned while it was away refuses them here, without asking).
   */
  #writeBackOthers(asked?: string): void {
    for (const upstream of this.#diverged.keys()) {
      if (upstream === asked || this.#writing.has(upstream)) continue;
      void this.#insured(this.#upstream(upstream), () => this.#writeBack(upstream) ?? Promise.resolve(), () => undefined);
    }
  }

  /**
   * An admission Redis did not answer in time, while its breaker still holds it healthy, is not
   * an outage: Redis may be answering late (a loaded machine, a stalled event loop), and the
   * script may well have run. Admitting from memory then adds this instance's share to what
   * Redis keeps admitting for the others, so the fleet's window gets more than the cap with
   * Redis up. The call waits and asks again instead (one that may not wait asks again at once,
   * `UNANSWERED_REASKS` times at most); the place the script may have taken is given back (the
   * finish runs after it on the same connection, before any ask again), and a Redis that keeps
   * timing out opens the breaker, after which memory decides as in any outage.
   */
  #unanswered(query: AdmitQuery): Admission {
    this.#redis.finish(query.upstream, query.leaseId);
    return { kind: 'over_cap', waitMs: IN_FLIGHT_POLL_MS };
  }

  async #sharedAdmit(query: AdmitQuery): Promise<Admission> {
    await this.#check(query.upstream);
    // Again while memory admitted more during the write: a half-open breaker's probe is on its
    // way here, and the calls memory admits meanwhile must be in Redis before it admits.
    for (let writing = this.#writeBack(query.upstream); writing !== undefined; writing = this.#writeBack(query.upstream)) await writing;
    const since = this.#freshSince.get(query.upstream);
    if (since !== undefined) {
      // A share of 1 (the default) is the whole cap: nothing to keep to, no turns to take.
      if (missingParts(query, this.#now() - since) === undefined) this.#freshSince.delete(query.upstream);
      else if (!sameCap(query.cap, query.localCap)) return this.#inTurn(query.upstream, () => this.#admitWithinShare(query));
    }
    return this.#admitShared(query);
  }

  async #admitShared(query: AdmitQuery): Promise<Admission> {
    const admission = await this.#redis.admit(query);
    if (admission.kind === 'admitted') this.#memory.record({ ...query, cap: query.localCap });
    return admission;
  }

  /**
   * Redis came back without the fleet's counts, and others may not have written theirs back
   * yet: this instance keeps to its share, as while Redis was away, until they have aged out.
   * One admission at a time (`#inTurn`): memory counts a call only once Redis has admitted it,
   * so misses asking together would each find the share free and all be admitted.
   */
  async #admitWithinShare(query: AdmitQuery): Promise<Admission> {
    const since = this.#freshSince.get(query.upstream);
    const share = since === undefined ? undefined : missingParts(query, this.#now() - since);
    if (share !== undefined) {
      const waitMs = this.#memory.waitMs({ ...query, cap: share });
      if (waitMs > 0) return { kind: 'over_cap', waitMs };
    }
    return this.#admitShared(query);
  }

  /** Runs `work` after the upstream's earlier turns have ended, however they ended. */
  #inTurn<T>(upstream: string, work: () => Promise<T>): Promise<T> {
    const previous = this.#turns.get(upstream) ?? Promise.resolve();
    const turn = previous.then(work);
    const done = turn.then(
      () => undefined,
      () => undefined,
    );
    this.#turns.set(upstream, done);
    void done.then(() => {
      if (this.#turns.get(upstream) === done) this.#turns.delete(upstream);
    });
    return turn;
  }

  /**
   * Learns the generation of `upstream`'s keys once per connection. One this instance did not
   * know, or one it had to set itself after a reconnection, is a Redis that came back empty: the
   * other instances' calls in the windows are missing until each of them writes back, so until
   * they have aged out of each part of the cap (`missingParts`), this instance admits through
   * Redis only within its own share of that part (`redis_down_share`), counting its calls before
   * the restart. An instance that meets the generation for the first time (it started, or never
   * asked for the upstream, since the restart) cannot tell a restart from a fleet's first start:
   * while the generation is younger than a part's window it keeps to its share of that part too,
   * with nothing of its own to count.
   */
  #check(upstream: string): Promise<void> {
    let checking = this.#checked.get(upstream);
    if (checking === undefined) {
      checking = this.#redis.generation(upstream, randomUUID()).then(
        ({ generation, fresh, ageMs }) => {
          const known = this.#generations.get(upstream);
          let since: number | undefined;
          if (known === undefined) since = this.#now() - ageMs;
          else if (fresh || known !== generation) since = this.#now();
          if (since !== undefined) this.#freshSince.set(upstream, Math.max(since, this.#freshSince.get(upstream) ?? -Infinity));
          this.#generations.set(upstream, generation);
        },
        (error: unknown) => {
          this.#checked.delete(upstream);
          throw error;
        },
      );
      this.#checked.set(upstream, checking);
    }
    return checking;
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
      // Stops first, with the end the provider gave: a Redis that restarted, or never heard of
      // a stop learned while it was away, must hold it for every instance before it admits.
      // The stop script keeps the longer of two, so writing one Redis has changes nothing.
      const stops = this.#memory.stopsOf(upstream);
      writing = Promise.all(stops.map((stop) => this.#redis.stop(stop)))
        .then(() => (cap === undefined ? undefined : this.#redis.writeBack(upstream, cap, [...calls, ...released])))
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
    this.#retryLater();
  }

  /**
   * While Redis is owed calls, stops or spends, tries to send them every `RETRY_MS`. A Redis
   * that was frozen and thaws gives no new connection to send them on, and an instance whose
   * misses its own stop refuses (or that serves only hits) would not ask Redis again: the other
   * instances would call through the stop, or charge the key again, meanwhile. Each try is
   * an ask of the breaker: none while it is open, the probe once it may be half-open.
   */
  #retryLater(): void {
    if (this.#timers === undefined || this.#retrying) return;
    this.#retrying = true;
    this.#cancelRetry = this.#timers.after(RETRY_MS, () => {
      this.#retrying = false;
      this.#cancelRetry = undefined;
      if (this.#diverged.size === 0 && this.#unsent.size === 0) return;
      this.#writeBackOthers();
      this.#writeBackOtherSpends();
      this.#retryLater();
    });
  }

  /**
   * The connection to Redis is ready again: a Redis that restarted has lost every call, so each
   * upstream's count here goes back now, before other instances fill the windows again.
   */
  reconnected(): void {
    this.#checked.clear();
    // Every window this instance knows of goes back, with nothing to add if nothing was charged
    // here meanwhile: a Redis that restarted empty gets at least what this instance knew.
    for (const query of this.#memory.budgetWindows()) {
      const key = this.#redis.budgetKey(query);
      if (!this.#unsent.has(key)) this.#unsent.set(key, { query, calls: 0 });
    }
    for (const [key, pending] of this.#unsent) {
      void this.#insured(
        this.#budget(pending.query),
        () => this.#writeBackSpends(key),
        () => undefined,
      );
    }
    for (const upstream of this.#memory.upstreams()) {
      this.#diverge(upstream);
      void this.#insured(
        this.#upstream(upstream),
        async () => {
          if (this.#caps.has(upstream)) await this.#check(upstream);
          await this.#writeBack(upstream);
        },
        () => undefined,
      );
    }
  }

  /**
   * Budgets are the fleet's while Redis answers; while it does not, each instance charges a key
   * only within its share of the limit (`redis_down_share`, its own charges through Redis in the
   * window counted), and never past what Redis last said the key had spent plus what it charged
   * since. Calls charged here go back to Redis before it charges the key again, and as soon as
   * the connection is ready again; every charge and write-back also raises Redis's count to what
   * this instance knows the window spent, which a Redis that restarted empty has lost.
   */
  spend(query: SpendQuery): Spend | Promise<Spend> {
    return this.#insured<Spend>(
      this.#budget(query),
      async () => {
        const key = this.#redis.budgetKey(query);
        await this.#writeBackSpends(key);
        const spent = await this.#redis.spend(query, this.#memory.budgetUsed(query));
        this.#memory.noteShared(query, spent.used, spent.allowed);
        this.#writeBackOtherSpends(key);
        return { ...spent, charged: 'shared' };
      },
      () => {
        const spent = this.#memory.spend(query, localBudget(query));
        if (spent.allowed) {
          const key = this.#redis.budgetKey(query);
          const pending = this.#unsent.get(key);
          if (pending === undefined || pending.query.startMs !== query.startMs) this.#unsent.set(key, { query, calls: 1 });
          else pending.calls++;
          this.#retryLater();
        }
        return { ...spent, charged: 'local' };
      },
    );
  }

  /**
   * After Redis answered again: the other keys' charges made here go back too. A Redis that was
   * frozen, not restarted, gives no new connection to write them back on, and a key this
   * instance charges no more would otherwise keep them here while other instances charge it.
   */
  #writeBackOtherSpends(asked?: string): void {
    for (const [key, pending] of this.#unsent) {
      if (key === asked) continue;
      void this.#insured(
        this.#budget(pending.query),
        () => this.#writeBackSpends(key),
        () => undefined,
      );
    }
  }

  /** Adds the calls charged to a budget here to its count in Redis; each is sent once. */
  async #writeBackSpends(key: string): Promise<void> {
    const pending = this.#unsent.get(key);
    if (pending === undefined) return;
    this.#unsent.delete(key);
    if (pending.query.endMs <= this.#now()) return;
    try {
      const used = await this.#redis.addSpends(pending.query, pending.calls, this.#memory.budgetUsed(pending.query));
      this.#memory.noteShared(pending.query, used);
    } catch (error) {
      // Not sent: kept for the next try, with any charged meanwhile.
      const now = this.#unsent.get(key);
      this.#unsent.set(key, { query: pending.query, calls: pending.calls + (now?.calls ?? 0) });
      this.#retryLater();
      throw error;
    }
  }

  /**
   * Back to the side that counted it: a call counted in memory and refunded to Redis would give
   * the fleet a call it never spent, and the reverse would give memory one for the next outage
   * (but for this instance's own charges, which its share counts). A refund Redis takes leaves
   * memory's count too: the next charge raises Redis's count to memory's, and would take the call
   * back. A refund Redis cannot take now is lost, from both, which errs on the provider's side.
   */
  refund(query: SpendQuery, spent: Spend): void {
    if (spent.charged === 'local') {
      this.#memory.refund(query);
      const key = this.#redis.budgetKey(query);
      const pending = this.#unsent.get(key);
      if (pending !== undefined && --pending.calls <= 0) this.#unsent.delete(key);
    } else if (this.#budget(query).state !== 'open') {
      this.#memory.refund(query);
      this.#redis.refund(query);
    }
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
    return insured(breaker, shared, local, this.#switches.for(breaker));
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

  /** A stop Redis cannot take now goes back with the upstream's write-back when it can. */
  async stop(stop: Stop): Promise<void> {
    this.#memory.stop(stop);
    if (this.#upstream(stop.upstream).state !== 'closed') return this.#diverge(stop.upstream);
    try {
      await this.#redis.stop(stop);
    } catch (error) {
      this.#diverge(stop.upstream);
      throw error;
    }
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

  async close(): Promise<void> {
    this.#cancelRetry?.();
  }
}

/**
 * The parts of this instance's share that still bind `ageMs` after Redis lost the fleet's counts
 * (undefined once none does): each part of the cap counts only the calls of its own window, so
 * the others' calls missing from Redis have aged out of the rate window after a second and out of
 * `max_concurrent` after a lease, while the quota's window may last a day; but none binds less
 * than `RECONNECT_LAG_MS`, while the others may still be coming back with calls of their own.
 */
function missingParts(query: AdmitQuery, ageMs: number): CallCap | undefined {
  const { cap, localCap } = query;
  const binds = (windowMs: number) => ageMs < Math.max(windowMs, RECONNECT_LAG_MS);
  const parts: { -readonly [K in keyof CallCap]: CallCap[K] } = {};
  if (cap.rate !== undefined && binds(cap.rate.windowMs)) parts.rate = localCap.rate;
  if (cap.quota !== undefined && binds(cap.quota.windowMs)) parts.quota = localCap.quota;
  if (cap.maxConcurrent !== undefined && binds(query.leaseMs)) parts.maxConcurrent = localCap.maxConcurrent;
  return Object.keys(parts).length === 0 ? undefined : parts;
}

/** Whether two caps admit alike: a `redis_down_share` of 1 compiles the shared cap again. */
function sameCap(a: CallCap, b: CallCap): boolean {
  return (
    a.rate?.perSecond === b.rate?.perSecond &&
    a.rate?.burst === b.rate?.burst &&
    a.rate?.windowLimit === b.rate?.windowLimit &&
    a.quota?.requests === b.quota?.requests &&
    a.maxConcurrent === b.maxConcurrent
  );
}

/** ioredis's answer to a command whose reply did not come within `command_timeout_ms`. */
function isTimeout(error: unknown): boolean {
  return error instanceof Error && error.message === 'Command timed out';
}
