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

interface Verdict {
  readonly accepted: boolean;
  readonly untilMs: number;
}

/**
 * What the provider last said about each forwarded key: accepted until `verify_ttl_seconds`
 * after its last successful call, rejected until `reject_ttl_seconds` after a 401. A key with no
 * verdict, or one past its time, is unknown. Only accepted keys may be answered from the cache;
 * every other request is its own upstream call, so the provider checks the key before perch
 * serves it anything. Verdicts live in this process only, at most `remembered_keys` of them
 * (least recently used dropped first), and a reload starts afresh.
 */
export class UpstreamVerifier {
  readonly #verdicts: LRUCache<string, Verdict>;
  /** Per key, the verifying call under way: later requests of that key wait for its verdict. */
  readonly #verifying = new Map<string, Promise<unknown>>();
  readonly #plan: string;
  readonly #verifyMs: number;
  readonly #rejectMs: number;
  readonly #clock: Clock;

  constructor(auth: AuthConfig, clock: Clock) {
    this.#verdicts = new LRUCache({ max: auth.remembered_keys });
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
    if (this.#verdict(digest)?.accepted === false) return undefined;
    return { id: `client:${digest.slice(0, 16)}`, plan: this.#plan, metricsId: PASS_THROUGH_METRICS_ID, key: presented, digest };
  }

  /** Whether the provider accepted this key within `verify_ttl_seconds`: only then may the cache answer it. */
  accepted(client: PassThroughClient): boolean {
    return this.#verdict(client.digest)?.accepted === true;
  }

  /**
   * Records what the answer to a call made with this key says about the key: an answer about
   * the request (found, not found) accepts it, a rejected credential (401, or 403 for `v1`)
   * rejects it, and anything else (errors, 429s, refusals) says nothing.
   */
  judge(client: PassThroughClient, result: UpstreamResult): void {
    const now = this.#clock.now();
    if (result.kind === 'ok' || result.kind === 'not_found') this.#verdicts.set(client.digest, { accepted: true, untilMs: now + this.#verifyMs });
    else if (result.kind === 'failed' && result.failure === 'unauthorized') this.#verdicts.set(client.digest, { accepted: false, untilMs: now + this.#rejectMs });
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
      if (this.#verdict(client.digest)?.accepted === false) return undefined;
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

  #verdict(digest: string): Verdict | undefined {
    const verdict = this.#verdicts.get(digest);
    if (verdict === undefined || verdict.untilMs > this.#clock.now()) return verdict;
    this.#verdicts.delete(digest);
    return undefined;
  }
}
