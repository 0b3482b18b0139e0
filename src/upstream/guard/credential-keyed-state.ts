import { createHash } from 'node:crypto';
import type { CredentialConfig } from '../../config/types.js';
import type { Admission, AdmitQuery, ProviderState, Stop, StopState } from './provider-state.js';

/** Separates a credential's id from its fingerprint in a stop's key; ids never hold it. */
export const FINGERPRINT_SEPARATOR = '@';

/**
 * A short, one-way fingerprint of a credential's secret (its headers): enough to tell a rotated
 * secret from the old one, useless for finding the secret, and safe in Redis keys and logs.
 */
export function credentialFingerprint(credential: CredentialConfig): string {
  const headers = Object.entries(credential.headers).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return createHash('sha256').update(JSON.stringify(headers)).digest('hex').slice(0, 16);
}

/**
 * The provider's stops belong to a credential's secret, not only to its id: the state below
 * sees `id@fingerprint` wherever a configured credential is named, so a secret rotated under
 * the same id (a changed file and a SIGHUP, a new environment and a restart) starts with no stop
 * of the old one, in memory and in Redis alike. Everything above keeps seeing the id. Ids that
 * are not configured (a client's own key with pass-through auth) and `ANY` pass unchanged.
 * Endpoints the provider counts in one window (`sharedWindows`: endpoint -> the endpoint whose
 * window it spends) share one stop: a stop learned on either holds both.
 */
export function keyStopsBySecret(state: ProviderState, credentials: readonly CredentialConfig[], sharedWindows: Readonly<Record<string, string>> = {}): ProviderState {
  const keyed = new Map(credentials.map((c) => [c.id, `${c.id}${FINGERPRINT_SEPARATOR}${credentialFingerprint(c)}`]));
  const ids = new Map([...keyed].map(([id, key]) => [key, id]));
  const toKey = (id: string) => keyed.get(id) ?? id;
  const toScope = (scope: string) => sharedWindows[scope] ?? scope;
  const toId = (admission: Admission): Admission =>
    admission.kind === 'admitted' ? { ...admission, credential: ids.get(admission.credential) ?? admission.credential } : admission;

  return {
    spend: (query) => state.spend(query),
    refund: (query, spent) => state.refund(query, spent),
    admit(query: AdmitQuery) {
      const admission = state.admit({ ...query, scope: toScope(query.scope), candidates: query.candidates.map(toKey) });
      return admission instanceof Promise ? admission.then(toId) : toId(admission);
    },
    withdraw: (upstream, payer) => state.withdraw(upstream, payer),
    finish: (upstream, leaseId) => state.finish(upstream, leaseId),
    stop: (stop: Stop) => state.stop({ ...stop, credential: toKey(stop.credential), scope: toScope(stop.scope) }),
    lift: (upstream: string, credential: string, scope: string, stopState: StopState) => state.lift(upstream, toKey(credential), toScope(scope), stopState),
    claim: (upstream, what, ttlMs) => state.claim(upstream, what, ttlMs),
    exchange: (report) => state.exchange(report),
    // The state is the app's, shared by every upstream: closing is its owner's business.
    close: async () => undefined,
  };
}
