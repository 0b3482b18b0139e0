import type { Clock } from '../clock.js';
import type { CredentialConfig, ProviderProtectionConfig } from '../config/types.js';
import type { Logger } from '../logging/logger.js';
import type { CredentialState, UpstreamEvents } from './events.js';
import { ANY, type ProviderState, type Stop } from './guard/provider-state.js';
import type { Attempt, Layer, UpstreamResult } from './upstream.js';

/** The longest wait between two rechecks of a credential the provider keeps rejecting. */
const MAX_RECHECK_WAIT_MS = 3_600_000;

export interface CredentialPoolOptions {
  readonly upstream: string;
  readonly config: Pick<ProviderProtectionConfig, 'cooldown_scope' | 'rate_limit_reserve' | 'usage_cap_seconds' | 'credential_recheck_seconds'> & {
    readonly credentials: readonly CredentialConfig[];
    /** x_v2: how long an endpoint the provider refused to a credential stays stopped for it. */
    readonly forbidden_retry_seconds?: number;
  };
  readonly state: ProviderState;
  readonly clock: Clock;
  readonly logger: Logger;
  readonly events: UpstreamEvents;
}

export interface CredentialPool {
  readonly layer: Layer;
  /** Each credential's standing as this instance last saw it, with the end of a stop. */
  standing(): Record<string, { state: CredentialState; untilMs?: number }>;
}

/**
 * What the provider says about each credential: a 429 stops that credential (or, for a 503,
 * the whole upstream) until the time it gave; a spent usage cap stops the credential on every
 * endpoint for long; a window reported down to the reserve stops it until the reset; a 401/403
 * takes it out of the rotation until a recheck (`credential_recheck_seconds`, doubling while the
 * provider keeps rejecting it, up to an hour) or a reload; an endpoint the provider refuses to a credential
 * (x_v2's 403) is stopped for that credential alone for `forbidden_retry_seconds`. The call that
 * drew a 429, a 401/403 or such a refusal is made once more on another credential, so the client
 * does not pay for one bad credential.
 */
export function createCredentialPool(options: CredentialPoolOptions): CredentialPool {
  const { upstream, config, state, clock, logger, events } = options;
  /** Revoked credentials: when the next recheck is due and the wait it follows. */
  const revoked = new Map<string, { recheckAtMs: number; waitMs: number }>();
  /** Credentials whose recheck call is under way on this instance. */
  const rechecking = new Set<string>();
  /** Credential and endpoint -> until when it is refused, so the refusal is logged once. */
  const forbidden = new Map<string, number>();
  const standing = new Map<string, { state: CredentialState; untilMs?: number }>(
    config.credentials.map((c) => [c.id, { state: 'active' }]),
  );

  function setStanding(credential: string, next: CredentialState, untilMs?: number): void {
    const current = standing.get(credential);
    if (current === undefined) return;
    const changed = current.state !== next;
    standing.set(credential, untilMs === undefined ? { state: next } : { state: next, untilMs });
    if (changed) events.credentialState(upstream, credential, next);
  }

  function record(stop: Omit<Stop, 'upstream'>): void {
    const done = state.stop({ upstream, ...stop });
    if (done instanceof Promise) done.catch((error: unknown) => logger.warn({ upstream, err: error }, 'could not share a provider stop'));
  }

  /**
   * Acts on what a result says about its credential: whether the call deserves another
   * credential, and the result as the client should see it (a usage cap's wait is perch's own).
   */
  function observe(result: UpstreamResult, attempt: Attempt): { again: boolean; result: UpstreamResult } {
    const credential = result.credential;
    if (credential === undefined) return { again: false, result };
    const now = clock.now();
    const scope = config.cooldown_scope === 'endpoint' ? attempt.request.endpoint : ANY;
    const route = attempt.request.endpoint;
    if (result.kind === 'rate_limited') {
      if (result.cause === 'usage_capped') {
        const untilMs = now + config.usage_cap_seconds * 1000;
        record({ credential, scope: ANY, untilMs, state: 'usage_capped' });
        if (standing.get(credential)?.state !== 'usage_capped') {
          logger.error({ upstream, credential, route, until: new Date(untilMs).toISOString() }, 'provider usage cap spent: credential stopped on every endpoint');
        }
        setStanding(credential, 'usage_capped', untilMs);
        return { again: true, result: { ...result, untilMs, retryAfterSeconds: config.usage_cap_seconds } };
      }
      const whole = result.cause === 'status_503';
      // An overloaded provider is overloaded on every endpoint: a 503 stops them all, whatever
      // `cooldown_scope` says of 429s.
      record({ credential: whole ? ANY : credential, scope: whole ? ANY : scope, untilMs: result.untilMs, state: 'cooling_down' });
      if (standing.get(credential)?.state !== 'cooling_down') {
        logger.warn(
          { upstream, credential: whole ? ANY : credential, route, scope: whole ? ANY : scope, cause: result.cause, retry_after: result.retryAfterSeconds },
          'provider said stop: cooling down',
        );
      }
      if (whole) for (const id of standing.keys()) setStanding(id, 'cooling_down', result.untilMs);
      else setStanding(credential, 'cooling_down', result.untilMs);
      return { again: !whole, result };
    }
    // With the client's own key (pass-through) a refusal is the client's to hear, not perch's.
    if (result.kind === 'failed' && result.failure === 'forbidden' && attempt.credential === undefined && config.forbidden_retry_seconds !== undefined) {
      const untilMs = now + config.forbidden_retry_seconds * 1000;
      // Through the shared state: every instance stops asking, and each logs it once.
      record({ credential, scope: route, untilMs, state: 'forbidden' });
      const key = `${credential}\n${route}`;
      if ((forbidden.get(key) ?? 0) <= now) {
        logger.warn({ upstream, credential, route, until: new Date(untilMs).toISOString() }, 'provider refuses this endpoint to the credential: not asked again until then');
      }
      forbidden.set(key, untilMs);
      return { again: true, result };
    }
    if (result.kind === 'failed' && result.failure === 'unauthorized' && attempt.credential === undefined) {
      if (!revoked.has(credential)) {
        const waitMs = config.credential_recheck_seconds * 1000;
        revoked.set(credential, { recheckAtMs: now + waitMs, waitMs });
        logger.error(
          { upstream, credential, reason: result.reason, recheck_at: new Date(now + waitMs).toISOString() },
          'provider rejected a credential: out of the rotation until its recheck',
        );
      }
      setStanding(credential, 'revoked', revoked.get(credential)!.recheckAtMs);
      return { again: true, result };
    }
    const limit = result.limit;
    if (limit !== undefined && limit.remaining <= config.rate_limit_reserve && limit.resetAtMs > now) {
      record({ credential, scope, untilMs: limit.resetAtMs, state: 'cooling_down' });
      if (standing.get(credential)?.state !== 'cooling_down') {
        logger.info({ upstream, credential, route, scope, remaining: limit.remaining, until: new Date(limit.resetAtMs).toISOString() }, 'provider window at its reserve: cooling down until its reset');
      }
      setStanding(credential, 'cooling_down', limit.resetAtMs);
      return { again: false, result };
    }
    if (standing.get(credential)?.state !== 'revoked') setStanding(credential, 'active');
    return { again: false, result };
  }

  /**
   * A revoked credential whose recheck is due and whose turn this instance got (one instance of
   * a fleet rechecks, through the shared state); undefined when there is none.
   */
  async function dueRecheck(): Promise<string | undefined> {
    const now = clock.now();
    for (const [credential, entry] of revoked) {
      if (entry.recheckAtMs > now || rechecking.has(credential)) continue;
      rechecking.add(credential);
      let turn = false;
      try {
        turn = await state.claim(upstream, `recheck:${credential}`, entry.waitMs);
      } catch {
        turn = false;
      }
      if (turn) return credential;
      // Another instance has the turn: this one waits a full interval before it asks again.
      revoked.set(credential, { ...entry, recheckAtMs: now + entry.waitMs });
      rechecking.delete(credential);
    }
    return undefined;
  }

  /** What a recheck's answer says: any answer but 401/403 restores the credential. */
  function settleRecheck(credential: string, result: UpstreamResult): void {
    rechecking.delete(credential);
    const entry = revoked.get(credential);
    if (entry === undefined) return;
    const now = clock.now();
    const answered = result.kind !== 'refused' && result.kind !== 'timeout' && !(result.kind === 'failed' && result.failure === 'connection');
    if (result.credential === credential && answered && !(result.kind === 'failed' && result.failure === 'unauthorized')) {
      revoked.delete(credential);
      if (standing.get(credential)?.state === 'revoked') setStanding(credential, 'active');
      logger.info({ upstream, credential }, 'credential recheck: the provider answers it again, back in the rotation');
      events.credentialRecheck(upstream, credential, 'restored');
      return;
    }
    const rejected = result.credential === credential && result.kind === 'failed' && result.failure === 'unauthorized';
    const waitMs = rejected ? Math.min(entry.waitMs * 2, MAX_RECHECK_WAIT_MS) : entry.waitMs;
    revoked.set(credential, { recheckAtMs: now + waitMs, waitMs });
    setStanding(credential, 'revoked', now + waitMs);
    logger.warn(
      { upstream, credential, outcome: rejected ? 'rejected' : 'no_answer', recheck_at: new Date(now + waitMs).toISOString() },
      'credential recheck: still out of the rotation',
    );
    events.credentialRecheck(upstream, credential, rejected ? 'rejected' : 'no_answer');
  }

  const layer: Layer = (next) => async (attempt) => {
    // The client's own key is the one credential such a call may use: no rotation, no switch.
    const own = attempt.credential !== undefined;
    const recheck = own || revoked.size === 0 ? undefined : await dueRecheck();
    if (recheck !== undefined) {
      // This call is the recheck: every other credential is set aside, so it goes out on this one.
      const result = await next({ ...attempt, avoid: config.credentials.map((c) => c.id).filter((id) => id !== recheck) });
      settleRecheck(recheck, result);
      // Restored, its answer is this call's; still out, the call goes on as if it had not been made.
      if (!revoked.has(recheck)) return observe(result, attempt).result;
    }
    const avoid = own || revoked.size === 0 ? undefined : [...revoked.keys()];
    const first = observe(await next(avoid === undefined ? attempt : { ...attempt, avoid }), attempt);
    let result = first.result;
    if (first.again && !own && config.credentials.length > 1) {
      const switched = observe(await next({ ...attempt, avoid: [...revoked.keys(), result.credential!] }), attempt).result;
      // A refusal of the second call says less than the provider's own answer to the first.
      if (switched.kind !== 'refused') result = switched;
    }
    if (revoked.size === config.credentials.length && result.kind === 'refused') return { ...result, reason: 'no_credential' };
    return result;
  };

  return {
    layer,
    standing: () => {
      const now = clock.now();
      return Object.fromEntries(
        [...standing].map(([id, s]) => [id, s.untilMs !== undefined && s.untilMs <= now && s.state !== 'revoked' ? { state: 'active' as const } : s]),
      );
    },
  };
}
