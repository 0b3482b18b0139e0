import { hash } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import type { Clock } from '../clock.js';
import type { AuthConfig } from '../config/types.js';
import type { UpstreamResult } from '../upstream/upstream.js';
import type { Client } from './key-store.js';

/**
 * A client of pass-through auth (`auth.mode: upstream`). The key itself travels with its request
 * only, because it is the credential of that request's upstream call; verdicts are kept under
 * its digest. `id` (`client:` and 16 hex digits of the digest) names the key in logs, rate
 * limits and provider stops.
 */
export interface PassThroughClient extends Client {
  readonly key: string;
  /** Lowercase hex SHA-256 of the key. */
  readonly digest: string;
}

/**
 * The `key_id` metrics label of every pass-through client: forwarded keys are unbounded, and a
 * label per key would let any caller grow the metrics without end.
 */
export const PASS_THROUGH_METRICS_ID = 'upstream-auth';

/** The pass-through client behind `client`, or undefined for a key of `auth.keys`. */
export function passThrough(client: Client | undefined): PassThroughClient | undefined {
  return client !== undefined && 'digest' in client ? (client as PassThroughClient) : undefined;
}

/**
 * What the provider last said about each forwarded key: accepted until `verify_ttl_seconds`
 * after its last answer for that key, rejected until `reject_ttl_seconds` after a 401. A key with
 * no verdict, or one past its time, is unknown. Only accepted keys may be answered from the
 * cache; every other request is its own upstream call, so the provider checks the key before
 * perch serves it anything. Verdicts live in this process only, and a reload starts afresh.
 *
 * Accepted and rejected keys are kept apart, each at most `remembered_keys` (least recently used
 * dropped first): a flood of made-up keys fills the rejected side only, and never pushes out a
 * key the provider accepted.
 */
export class UpstreamVerifier {
  /** Key digest -> until when the provider's acceptance lets the cache answer it. */
  readonly #accepted: LRUCache<string, number>;
  /** Key digest -> until when it is answered 401 without a call. */
  readonly #rejected: LRUCache<string, number>;
  /** Per key, the verifying call under way: later requests of that key wait for its verdict. */
  readonly #verifying = new Map<string, Promise<unknown>>();
  readonly #plan: string;
  readonly #verifyMs: number;
  readonly #rejectMs: number;
  readonly #clock: Clock;

  constructor(auth: AuthConfig, clock: Clock) {
    this.#accepted = new LRUCache({ max: auth.remembered_keys });
    this.#rejected = new LRUCache({ max: auth.remembered_keys });
    // Validation guarantees a default plan in mode upstream.
    this.#plan = auth.default_plan!;
    this.#verifyMs = auth.verify_ttl_seconds * 1000;
    this.#rejectMs = auth.reject_ttl_seconds * 1000;
    this.#clock = clock;
  }

  /** The client for a presented key; undefined for a missing, empty, repeated or rejected key. */
  authenticate(presented: string | string[] | undefined): PassThroughClient | undefined {
    if (typeof presented !== 'string' || presented === '') return undefined;
    const digest = hash('sha256', presented, 'hex');
    if (this.#holds(this.#rejected, digest)) return undefined;
    return { id: `client:${digest.slice(0, 16)}`, plan: this.#plan, metricsId: PASS_THROUGH_METRICS_ID, key: presented, digest };
  }

  /** Whether the provider accepted this key within `verify_ttl_seconds`: only then may the cache answer it. */
  accepted(client: PassThroughClient): boolean {
    return this.#holds(this.#accepted, client.digest);
  }

  /**
   * Records what the answer to a call made with this key says about the key. Only an answer the
   * provider sent for it counts: a 2xx or a not found accepts the key, a rejected credential (401,
   * or 403 for `v1`) rejects it. Everything else says nothing: errors, 429s, perch's refusals, and
   * a not found perch made itself for a request the provider cannot match (`unasked`), which a
   * made-up key could otherwise ask for to be accepted without the provider ever seeing it.
   */
  judge(client: PassThroughClient, result: UpstreamResult): void {
    const now = this.#clock.now();
    if (result.kind === 'ok' || (result.kind === 'not_found' && result.unasked !== true)) {
      this.#rejected.delete(client.digest);
      this.#accepted.set(client.digest, now + this.#verifyMs);
    } else if (result.kind === 'failed' && result.failure === 'unauthorized') {
      this.#accepted.delete(client.digest);
      this.#rejected.set(client.digest, now + this.#rejectMs);
    }
  }

  /**
   * Runs `call`, the request of a key not accepted yet, once any verifying call of the same key
   * (for another path) has settled. Undefined, without calling, when that call got the key
   * rejected: a flood of one bad key costs one upstream call, whatever paths it asks for.
   */
  async verifying<T>(client: PassThroughClient, call: () => Promise<T>): Promise<T | undefined> {
    const earlier = this.#verifying.get(client.digest);
    if (earlier !== undefined) {
      await earlier;
      if (this.#holds(this.#rejected, client.digest)) return undefined;
    }
    const running = call();
    const settled = running.catch(() => undefined);
    this.#verifying.set(client.digest, settled);
    try {
      return await running;
    } finally {
      if (this.#verifying.get(client.digest) === settled) this.#verifying.delete(client.digest);
    }
  }

  /** Verdicts held now, of each kind: each at most `remembered_keys`, however many keys callers make up. */
  held(): { readonly accepted: number; readonly rejected: number } {
    return { accepted: this.#accepted.size, rejected: this.#rejected.size };
  }

  /** Whether `side` holds a verdict for `digest` that has not run out; one that has is dropped. */
  #holds(side: LRUCache<string, number>, digest: string): boolean {
    const untilMs = side.get(digest);
    if (untilMs === undefined) return false;
    if (untilMs > this.#clock.now()) return true;
    side.delete(digest);
    return false;
  }
}
