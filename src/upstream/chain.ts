import type { Dispatcher } from 'undici';
import type { Clock } from '../clock.js';
import type { UpstreamConfig } from '../config/types.js';
import type { Logger } from '../logging/logger.js';
import type { Timers } from '../timers.js';
import { createBatching, isBatchable } from './batch.js';
import { createBreaker } from './breaker.js';
import { createBudget } from './budget.js';
import type { BudgetBook } from './budget-book.js';
import { createCredentialPool } from './credential-pool.js';
import { NO_EVENTS, type BreakerState, type CredentialState, type UpstreamEvents } from './events.js';
import { createFixtureUpstream } from './fixture/fixture-upstream.js';
import { createGuard, type GuardQueues } from './guard.js';
import { X_SHARED_WINDOWS } from './x-v2/replies-source.js';
import { keyStopsBySecret } from './guard/credential-keyed-state.js';
import { ANY, type ProviderState, type StopState } from './guard/provider-state.js';
import { forwardClientKey } from './client-key.js';
import { answerKnown } from './known-answer.js';
import { createRetry } from './retry.js';
import { createThrottle } from './throttle.js';
import { traceAttempts } from './trace-attempt.js';
import { compose, type Call, type Layer, type Provider } from './upstream.js';
import { createV1Upstream } from './v1-upstream.js';
import { createXV2Upstream } from './x-v2-upstream.js';

/** Whether perch would call an upstream now, and if not, why. */
export interface UpstreamStatus {
  readonly state: 'ok' | StopState | 'no_credential';
  /** When a stop ends (epoch ms), for `state` other than ok and no_credential. */
  readonly untilMs?: number;
  readonly breaker: BreakerState;
  /** The share of calls the adaptive throttle sheds now (0 when it is off). */
  readonly throttle: number;
  readonly credentials: Record<string, { state: CredentialState; untilMs?: number }>;
}

/** One configured upstream: its layers composed, how it stands, and how to release it. */
export interface BuiltUpstream {
  readonly call: Call;
  /** The answer perch makes itself to a request this provider cannot match (known-answer.ts); absent: it has none. */
  readonly known?: Provider['known'];
  /** See `Provider.tellsUserContext`. */
  readonly tellsUserContext?: boolean;
  status(): UpstreamStatus;
  close(): Promise<void>;
}

export interface ChainOptions {
  readonly clock: Clock;
  readonly timers: Timers;
  readonly logger: Logger;
  readonly state: ProviderState;
  readonly dispatcher?: Dispatcher;
  readonly metrics?: UpstreamEvents;
  /** The throttle's shedding draw, [0, 1); default Math.random. */
  readonly random?: () => number;
  /** This instance's record of each key's provider-call budget. */
  readonly budgets?: BudgetBook;
  /** The guards' admission queues, kept across reloads so waiters are admitted under the new caps. */
  readonly queues?: GuardQueues;
}

/**
 * The layers of an upstream, outermost first: known answers -> client key (pass-through auth
 * only) -> (x_v2 batch lookups: each miss's budget -> batching) -> breaker -> throttle -> retry
 * -> credential pool -> budget -> guard -> attempt span -> the provider's dialect (`v1` or
 * `x_v2`: the layers are the same). The guard sits closest to the wire because every real call,
 * retries and credential switches included, must pass the cap and the provider's stops; the
 * budget sits on it so that every real call, and only a real call, counts against the paying
 * key's `provider_calls`. A request the provider cannot match is answered above everything, as
 * it is no call at all. Batching sits above every guard, so that a batch call is one call to
 * each of them: one verdict, one retry, one place under the cap. The breaker sits next so that
 * an upstream known to be down costs nothing, and the throttle under it so that its probe is
 * never shed, and above the retries so that a shed request is not retried. The fixture needs
 * none of it: it is code in this process, with no account to protect.
 */
export function buildUpstream(name: string, config: UpstreamConfig, options: ChainOptions): BuiltUpstream {
  if (config.kind === 'fixture') {
    const fixture = createFixtureUpstream(name);
    return { call: fixture.call, status: () => ({ state: 'ok', breaker: 'closed', throttle: 0, credentials: {} }), close: fixture.close };
  }
  const { clock, timers, logger, state } = options;
  const events = options.metrics ?? NO_EVENTS;
  const wire = { clock, dispatcher: options.dispatcher };
  const provider = config.kind === 'x_v2' ? createXV2Upstream(name, config, wire) : createV1Upstream(name, config, wire);
  // A Redis that fails to take the news must not become an unhandled rejection: this instance's
  // breaker still holds, only the fleet does not hear of it.
  function settle(done: void | Promise<void>): void {
    if (done instanceof Promise) done.catch((error: unknown) => logger.warn({ upstream: name, err: error }, 'could not share the breaker state'));
  }
  const throttle = createThrottle({ upstream: name, config: config.throttle, clock, events, share: state, random: options.random });
  const breaker = createBreaker({
    upstream: name,
    config: config.breaker,
    clock,
    logger,
    events,
    share: {
      opened: (untilMs) => settle(state.stop({ upstream: name, credential: ANY, scope: ANY, untilMs, state: 'breaker_open' })),
      closed: () => {
        // The outage's failures say nothing of the provider that just answered the probe.
        throttle.reset();
        settle(state.lift(name, ANY, ANY, 'breaker_open'));
      },
    },
  });
  // Stops are per credential secret: a rotated secret under the same id starts clean.
  const stops = keyStopsBySecret(state, config.credentials, config.kind === 'x_v2' ? X_SHARED_WINDOWS : {});
  const pool = createCredentialPool({ upstream: name, config, state: stops, clock, logger, events });
  // Every series exists from the start (a reload starts credentials afresh, as revocations do).
  for (const credential of config.credentials) events.credentialState(name, credential.id, 'active');
  events.breakerState(name, 'closed');
  const guard = createGuard({ upstream: name, config, state: stops, clock, timers, events, ...(options.queues === undefined ? {} : { queues: options.queues }) });
  const budget = { upstream: name, state, clock, events, book: options.budgets, share: config.redis_down_share };
  const batching = config.kind === 'x_v2' && config.batch.enabled;
  // Batched misses are charged one each above the batch layer, as X bills them (per item read,
  // retries of the call billing nothing more); the call carries no budget down (batch.ts).
  const batched: Layer[] = batching
    ? [
        createBudget({ ...budget, charges: isBatchable }),
        createBatching({ upstream: name, config: config.batch, queueTimeoutMs: config.queue_timeout_ms, queueSize: config.queue_size, price: config.price_per_call, timers, events, logger }),
      ]
    : [];
  const call = compose(
    [
      answerKnown(provider.known),
      forwardClientKey(config.kind),
      ...batched,
      breaker.layer,
      throttle.layer,
      createRetry({ upstream: name, config, clock, timers, events }),
      pool.layer,
      createBudget(budget),
      guard.layer,
      traceAttempts({ upstream: name, url: config.url, propagate: config.propagate_trace }),
    ],
    provider.call,
  );

  function status(): UpstreamStatus {
    const credentials = pool.standing();
    const breakerState = breaker.state();
    const shed = throttle.rejectProbability();
    const standings = Object.values(credentials);
    if (standings.every((s) => s.state === 'revoked')) {
      // Until the first recheck is due: then one call tries a credential again.
      const recheck = Math.min(...standings.map((s) => s.untilMs ?? Number.POSITIVE_INFINITY));
      return { state: 'no_credential', ...(Number.isFinite(recheck) ? { untilMs: recheck } : {}), breaker: breakerState, throttle: shed, credentials };
    }
    if (breakerState === 'open') return { state: 'breaker_open', breaker: breakerState, throttle: shed, credentials };
    const stop = guard.stoppedAt(ANY);
    if (stop !== undefined) return { state: stop.state, untilMs: stop.untilMs, breaker: breakerState, throttle: shed, credentials };
    const usable = standings.filter((s) => s.state === 'active');
    if (usable.length === 0) {
      const ends = standings.filter((s) => s.untilMs !== undefined).map((s) => s.untilMs!);
      const capped = standings.every((s) => s.state === 'usage_capped' || s.state === 'revoked');
      return { state: capped ? 'usage_capped' : 'cooling_down', untilMs: Math.min(...ends), breaker: breakerState, throttle: shed, credentials };
    }
    return { state: 'ok', breaker: breakerState, throttle: shed, credentials };
  }

  return {
    call,
    status,
    close: provider.close,
    ...(provider.known === undefined ? {} : { known: provider.known }),
    ...(provider.tellsUserContext === true ? { tellsUserContext: true } : {}),
  };
}
