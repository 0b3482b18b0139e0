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
  const capped = cap.rate !== undefined || cap.quota !== undefined || cap.maxConcurrent !== undefined;
  const queue = new AdmissionQueue({ size: config.queue_size, clock, timers, withdraw: (payer) => state.withdraw(upstream, payer.id) });
  // The lease must outlive the call it guards: a timed-out call still holds its connection.
  const leaseMs = config.timeout_ms + 1000;
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
    const span = attempt.trace?.child('provider queue', 'internal', { 'perch.upstream': upstream });
    const { admission, waitedMs } = await queue.admit(
      payer,
      (fair) => state.admit({ upstream, scope, candidates, cap, localCap, leaseId, leaseMs, payer, ...fair }),
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
      if (capped) state.finish(upstream, leaseId);
      queue.wake();
      return refuse(attempt, 'no_time', 1);
    }
    events.called(upstream, payer.label, config.price_per_call);
    try {
      const result = await next({ ...attempt, credential: own ?? credentials.get(admission.credential)! });
      return { ...result, credential: admission.credential };
    } finally {
      if (capped) state.finish(upstream, leaseId);
      queue.wake();
    }
  };

  return { layer, stoppedAt };
}
