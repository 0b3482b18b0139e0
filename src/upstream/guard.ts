import { randomUUID } from 'node:crypto';
import type { Clock } from '../clock.js';
import type { CredentialConfig, ProviderProtectionConfig } from '../config/types.js';
import type { Timers } from '../timers.js';
import type { UpstreamEvents } from './events.js';
import { AdmissionQueue, NO_PAYER } from './guard/admission-queue.js';
import { ANY, compileCap, type CallCap, type ProviderState, type StopState } from './guard/provider-state.js';
import { deadlineOf, floorOf, msLeft, secondsUntil, type Attempt, type Credential, type Layer, type RefusalReason, type UpstreamResult } from './upstream.js';

export interface GuardOptions {
  readonly upstream: string;
  readonly config: ProviderProtectionConfig & { readonly credentials: readonly CredentialConfig[]; readonly timeout_ms: number; readonly forbidden_retry_seconds?: number };
  readonly state: ProviderState;
  readonly clock: Clock;
  readonly timers: Timers;
  readonly events: UpstreamEvents;
  /** The queues kept across reloads; absent, the guard keeps one of its own. */
  readonly queues?: GuardQueues;
}

/** What an upstream's waiters are admitted under: the latest configuration's. */
interface Limits {
  readonly cap: CallCap;
  readonly localCap: CallCap;
  readonly state: ProviderState;
}

interface KeptQueue {
  readonly queue: AdmissionQueue;
  limits: Limits;
}

/**
 * Each upstream's admission queue, kept across reloads together with the limits its waiters ask
 * under. Calls that waited through a reload are admitted under the new configuration's cap,
 * quota and `max_concurrent` from the next ask on: a lowered cap must not wait for the old
 * queue to drain (at up to the old rate) before it holds. Kept per upstream name ever
 * configured in this process, which a reload can add to only by configuring it.
 */
export class GuardQueues {
  readonly #kept = new Map<string, KeptQueue>();

  /** The upstream's queue, now asking under `limits`; created on first use. */
  take(upstream: string, size: number, limits: Limits, clock: Clock, timers: Timers): KeptQueue {
    let kept = this.#kept.get(upstream);
    if (kept === undefined) {
      const entry: KeptQueue = {
        queue: new AdmissionQueue({ size, clock, timers, withdraw: (payer) => entry.limits.state.withdraw(upstream, payer.id) }),
        limits,
      };
      kept = entry;
      this.#kept.set(upstream, kept);
      return kept;
    }
    kept.limits = limits;
    kept.queue.resize(size);
    // The next waiter asks now under the new limits rather than at a wake-up the old ones set.
    kept.queue.wake();
    return kept;
  }
}

function isCapped(cap: CallCap): boolean {
  return cap.rate !== undefined || cap.quota !== undefined || cap.maxConcurrent !== undefined;
}

export interface Guard {
  readonly layer: Layer;
  /** Until when every credential is known to be stopped at `scope`, and why; undefined when not. */
  stoppedAt(scope: string): { untilMs: number; state: StopState } | undefined;
}

const REFUSAL: Readonly<Record<StopState, RefusalReason>> = {
  cooling_down: 'cooling_down',
  usage_capped: 'usage_capped',
  breaker_open: 'breaker_open',
  // Every credential is refused this endpoint: none can serve it, as when all were rejected.
  forbidden: 'no_credential',
};

/**
 * The layer closest to the wire, so that every real call (a retry, a switch of credential)
 * passes it: it picks the credential (round robin over those not stopped, or the client's own
 * key with pass-through auth), honours every stop the provider gave (shared with the fleet
 * through the state), starts no call with less than `MIN_CALL_MS` of the miss deadline left, and takes a place under the upstream's call cap, waiting in a bounded queue
 * shared fairly among the client keys whose misses wait (admission-queue.ts) when the cap is full. A call it refuses costs the provider nothing.
 */
export function createGuard(options: GuardOptions): Guard {
  const { upstream, config, state, clock, timers, events } = options;
  const credentials = new Map<string, Credential>(config.credentials.map((c) => [c.id, c]));
  const ids = config.credentials.map((c) => c.id);
  const cap: CallCap = compileCap(config);
  const localCap: CallCap = compileCap(config, config.redis_down_share);
  // The lease must outlive the call it guards: a timed-out call still holds its connection.
  const leaseMs = config.timeout_ms + 1000;
  const kept = (options.queues ?? new GuardQueues()).take(upstream, config.queue_size, { cap, localCap, state }, clock, timers);
  const queue = kept.queue;
  /**
   * Stops learned from the state that cover every credential: while one holds, a miss is refused
   * here, without asking Redis again. Only full-rotation answers are kept: with credentials left
   * out, "all stopped" says nothing about the others.
   */
  const known = new Map<string, { untilMs: number; state: StopState }>();
  let turn = 0;

  function stoppedAt(scope: string): { untilMs: number; state: StopState } | undefined {
    const stop = known.get(scope);
    return stop !== undefined && stop.untilMs > clock.now() ? stop : undefined;
  }

  function refuse(attempt: Attempt, reason: RefusalReason, retryAfterSeconds: number): UpstreamResult {
    events.refused(upstream, attempt.request.endpoint, reason);
    return { kind: 'refused', reason, retryAfterSeconds };
  }

  const layer: Layer = (next) => async (attempt) => {
    // Per endpoint also where the provider refuses single endpoints to a credential (x_v2).
    const scope = config.cooldown_scope === 'endpoint' || config.forbidden_retry_seconds !== undefined ? attempt.request.endpoint : ANY;
    // A client's own key (pass-through) is the only candidate; its stops are its own, so they
    // never stand for the whole rotation in `known`.
    const own = attempt.credential;
    const fullRotation = own === undefined && (attempt.avoid === undefined || attempt.avoid.length === 0);
    const stop = fullRotation ? stoppedAt(scope) : undefined;
    if (stop !== undefined) return refuse(attempt, REFUSAL[stop.state], secondsUntil(stop.untilMs, clock.now()));

    const start = turn++ % ids.length;
    const rotated = [...ids.slice(start), ...ids.slice(0, start)];
    const candidates = own !== undefined ? [own.id] : fullRotation ? rotated : rotated.filter((id) => !attempt.avoid!.includes(id));
    if (candidates.length === 0) return refuse(attempt, 'no_credential', 1);

    // No call without time to answer it: the queue waits only while a call could still follow.
    const floor = floorOf(attempt);
    const deadline = deadlineOf(attempt);
    if (msLeft(deadline) < floor) return refuse(attempt, 'no_time', 1);
    // Unique across the fleet: it is the call's member in the shared logs and lease set.
    const leaseId = randomUUID();
    const maxWaitMs = Math.min(config.queue_timeout_ms, msLeft(deadline) - floor);
    const payer = attempt.payer ?? NO_PAYER;
    let asked = kept.limits;
    const span = attempt.trace?.child('provider queue', 'internal', { 'perch.upstream': upstream });
    const { admission, waitedMs } = await queue.admit(
      payer,
      // Read at each ask: a call still waiting after a reload asks under the new limits. The
      // lease stays this guard's: it must outlive the call this configuration makes.
      (fair) => {
        asked = kept.limits;
        return asked.state.admit({ upstream, scope, candidates, cap: asked.cap, localCap: asked.localCap, leaseId, leaseMs, payer, ...fair });
      },
      maxWaitMs,
      attempt.batch === undefined ? undefined : () => attempt.batch!.queued(),
    );
    if (span !== undefined) {
      span.set('perch.queue.admission', admission.kind);
      span.set('perch.queue.waited_ms', waitedMs);
      span.end();
    }
    if (waitedMs > 0) events.queued(upstream, waitedMs / 1000);
    if (admission.kind === 'stopped') {
      if (fullRotation) known.set(scope, { untilMs: admission.untilMs, state: admission.state });
      return refuse(attempt, REFUSAL[admission.state], secondsUntil(admission.untilMs, clock.now()));
    }
    // A wait the deadline ended is still the cap's answer: its Retry-After tells the client when
    // a call would go.
    if (admission.kind === 'over_cap') return refuse(attempt, 'over_cap', Math.max(1, Math.ceil(admission.waitMs / 1000)));
    if (msLeft(deadline) < floor) {
      // Admitted too late to be answered: the place taken under the cap is given back uncalled.
      if (isCapped(asked.cap)) asked.state.finish(upstream, leaseId);
      queue.wake();
      return refuse(attempt, 'no_time', 1);
    }
    events.called(upstream, payer.label, config.price_per_call);
    try {
      const result = await next({ ...attempt, credential: own ?? credentials.get(admission.credential)! });
      return { ...result, credential: admission.credential };
    } finally {
      if (isCapped(asked.cap)) asked.state.finish(upstream, leaseId);
      queue.wake();
    }
  };

  return { layer, stoppedAt };
}
