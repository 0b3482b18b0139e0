import { hash, timingSafeEqual } from 'node:crypto';
import type { ApiKeyConfig } from '../config/types.js';

/** A client identity as the rest of perch sees it: never the secret. */
export interface Client {
  readonly id: string;
  readonly plan: string;
  /** The `key_id` metrics label when it is not `id`: pass-through keys share one (upstream-verifier.ts). */
  readonly metricsId?: string;
}

/**
 * Looks up clients by `X-API-Key`. The presented key is hashed with SHA-256 and the digest is
 * looked up by its first 8 bytes, then compared in full with `timingSafeEqual`. An attacker
 * controls the key but not its digest, so the time a lookup takes says nothing about how close
 * a guess was, and only digests are kept in memory.
 */
export class KeyStore {
  readonly #byPrefix = new Map<string, { digest: Buffer; client: Client }[]>();
  /**
   * The key each connection last presented successfully, and its client. Keep-alive clients send
   * the same key on every request; comparing with the key this same connection sent before spares
   * a SHA-256 per request and tells a caller nothing it did not already send. Only accepted keys
   * are kept, one per live connection, and a reload builds a new store, so nothing stale is kept.
   */
  readonly #byConnection = new WeakMap<object, { presented: string; client: Client }>();

  constructor(keys: readonly ApiKeyConfig[]) {
    for (const key of keys) {
      const digest = Buffer.from(key.sha256, 'hex');
      const prefix = key.sha256.slice(0, 16);
      const bucket = this.#byPrefix.get(prefix) ?? [];
      bucket.push({ digest, client: Object.freeze({ id: key.id, plan: key.plan }) });
      this.#byPrefix.set(prefix, bucket);
    }
  }

  /**
   * The client for a presented key; undefined for a missing, empty or unknown key. `connection`
   * (the socket) lets a connection's next request with the same key skip the hash.
   */
  authenticate(presented: string | string[] | undefined, connection?: object): Client | undefined {
    // A repeated header is ambiguous: refusing it is safer than picking one.
    if (typeof presented !== 'string' || presented === '') return undefined;
    const last = connection === undefined ? undefined : this.#byConnection.get(connection);
    if (last !== undefined && last.presented === presented) return last.client;
    const client = this.#lookup(presented);
    if (client !== undefined && connection !== undefined) this.#byConnection.set(connection, { presented, client });
    return client;
  }

  #lookup(presented: string): Client | undefined {
    // One-shot hashing: a Hash object per request showed in the hit path's profile.
    const digest = hash('sha256', presented, 'buffer');
    const bucket = this.#byPrefix.get(digest.toString('hex', 0, 8));
    if (bucket === undefined) return undefined;
    for (const entry of bucket) {
      if (timingSafeEqual(entry.digest, digest)) return entry.client;
    }
    return undefined;
  }
}
