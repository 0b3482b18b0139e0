import type { Credential, Layer } from './upstream.js';

/**
 * Pass-through auth: turns the client's key into the credential of the call, in the header the
 * provider's dialect reads it from (`X-API-Key` for `v1`, `Authorization: Bearer` for `x_v2`).
 * Outermost, so every layer below sees the credential the call will use: the pool and the guard
 * then neither rotate nor revoke, and the guard keeps the provider's stops per client key.
 */
export function forwardClientKey(kind: 'v1' | 'x_v2'): Layer {
  return (next) => (attempt) => {
    if (attempt.clientKey === undefined) return next(attempt);
    const { id, key } = attempt.clientKey;
    const credential: Credential = { id, headers: kind === 'x_v2' ? { authorization: `Bearer ${key}` } : { 'x-api-key': key } };
    return next({ ...attempt, credential });
  };
}
