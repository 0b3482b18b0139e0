import { hash, timingSafeEqual } from 'node:crypto';
import type { Clock } from '../clock.js';
import type { ApiKeyConfig } from '../config/types.js';
import type { Logger } from '../logging/logger.js';

/** A client identity as the rest of perch sees it: never the secret. */
export interface Client {
  readonly id: string;
  readonly plan: string;
  /** The `key_id` metrics label when it is not `id`: pass-through keys share one (upstream-verifier.ts). */
  readonly metricsId?: string;
}

/** When one secret of a key was last accepted, for a rotation to tell that nobody uses it any more. */
export interface SecretUse {
  readonly id: string;
  /** The secret's position in the key's `secrets` (0 for `key` or `sha256`). */
  readonly index: number;
  /** The first 8 hex digits of the secret's SHA-256, as logs name it. */
  readonly fingerprint: string;
  /** ms since the epoch; undefined: not since this process started. */
  readonly lastUsedMs: number | undefined;
  readonly notAfterMs: number | undefined;
}

interface Entry {
  readonly digest: Buffer;
  readonly hex: string;
  readonly client: Client;
  readonly index: number;
  readonly notAfterMs: number | undefined;
  lastUsedMs: number | undefined;
  /** An expired secret is logged on its first refusal only: a client retrying it must not flood the log. */
  expiryLogged: boolean;
}

export interface KeyStoreOptions {
  readonly clock: Clock;
  readonly logger: Logger;
  /** The store a reload replaces: each secret's last use and logged expiry carry over by digest. */
  readonly previous?: KeyStore;
  /** Where the keys come from (`auth.keys`, `admin.keys`), for the warning about secrets already past their end. */
  readonly list?: string;
}

/**
 * Looks up clients by `X-API-Key`. The presented key is hashed with SHA-256 and the digest is
 * looked up by its first 8 bytes, then compared in full with `timingSafeEqual`. An attacker
 * controls the key but not its digest, so the time a lookup takes says nothing about how close
 * a guess was, and only digests are kept in memory. A key id may have several secrets (a
 * rotation's overlap): each opens the same client, until its `not_after`.
 */
export class KeyStore {
  readonly #byPrefix = new Map<string, Entry[]>();
  readonly #entries: Entry[] = [];
  readonly #clock: Clock;
  readonly #logger: Logger;
  /**
   * The key each connection last presented successfully, and its entry. Keep-alive clients send
   * the same key on every request; comparing with the key this same connection sent before spares
   * a SHA-256 per request and tells a caller nothing it did not already send. Only accepted keys
   * are kept, one per live connection, and a reload builds a new store, so nothing stale is kept.
   */
  readonly #byConnection = new WeakMap<object, { presented: string; entry: Entry }>();

  constructor(keys: readonly ApiKeyConfig[], options: KeyStoreOptions) {
    this.#clock = options.clock;
    this.#logger = options.logger;
    const before = new Map(options.previous === undefined ? [] : options.previous.#entries.map((entry) => [entry.hex, entry]));
    for (const key of keys) {
      const client = Object.freeze({ id: key.id, plan: key.plan });
      key.secrets.forEach((secret, index) => {
        const earlier = before.get(secret.sha256);
        const entry: Entry = {
          digest: Buffer.from(secret.sha256, 'hex'),
          hex: secret.sha256,
          client,
          index,
          notAfterMs: secret.notAfterMs,
          lastUsedMs: earlier?.lastUsedMs,
          expiryLogged: earlier?.expiryLogged === true && earlier.notAfterMs === secret.notAfterMs,
        };
        const prefix = secret.sha256.slice(0, 16);
        const bucket = this.#byPrefix.get(prefix) ?? [];
        bucket.push(entry);
        this.#byPrefix.set(prefix, bucket);
        this.#entries.push(entry);
      });
    }
    this.#warnExpired(options.list ?? 'auth.keys');
  }

  /**
   * A secret loaded already past its `not_after` opens nothing from the start: a typo in a year
   * would otherwise cut a client off with no word until it calls, and a key left without a
   * valid secret at all is dead. Said at every load (start and reload) until it is removed.
   */
  #warnExpired(list: string): void {
    const now = this.#clock.now();
    const expired = this.#entries.filter((entry) => entry.notAfterMs !== undefined && now > entry.notAfterMs);
    for (const entry of expired) {
      const left = this.#entries.some((other) => other.client === entry.client && !(other.notAfterMs !== undefined && now > other.notAfterMs));
      this.#logger.warn(
        {
          key_id: entry.client.id,
          secret: entry.index,
          fingerprint: entry.hex.slice(0, 8),
          not_after: new Date(entry.notAfterMs!).toISOString(),
          valid_secrets_left: left,
        },
        left
          ? `${list}: a key secret is already past its not_after at load: it is refused (401); remove it`
          : `${list}: every secret of this key is past its not_after at load: the key is refused (401)`,
      );
    }
  }

  /**
   * The client for a presented key; undefined for a missing, empty, unknown or expired key.
   * `connection` (the socket) lets a connection's next request with the same key skip the hash.
   */
  authenticate(presented: string | string[] | undefined, connection?: object): Client | undefined {
    // A repeated header is ambiguous: refusing it is safer than picking one.
    if (typeof presented !== 'string' || presented === '') return undefined;
    const last = connection === undefined ? undefined : this.#byConnection.get(connection);
    const entry = last !== undefined && last.presented === presented ? last.entry : this.#lookup(presented);
    if (entry === undefined) return undefined;
    const now = this.#clock.now();
    if (entry.notAfterMs !== undefined && now > entry.notAfterMs) {
      this.#expired(entry);
      return undefined;
    }
    entry.lastUsedMs = now;
    if (connection !== undefined && last?.entry !== entry) this.#byConnection.set(connection, { presented, entry });
    return entry.client;
  }

  /** Each secret of each key, in configuration order, with when it was last accepted. */
  uses(): SecretUse[] {
    return this.#entries.map((entry) => ({
      id: entry.client.id,
      index: entry.index,
      fingerprint: entry.hex.slice(0, 8),
      lastUsedMs: entry.lastUsedMs,
      notAfterMs: entry.notAfterMs,
    }));
  }

  #expired(entry: Entry): void {
    if (entry.expiryLogged) return;
    entry.expiryLogged = true;
    this.#logger.warn(
      { key_id: entry.client.id, secret: entry.index, fingerprint: entry.hex.slice(0, 8), not_after: new Date(entry.notAfterMs!).toISOString() },
      'a key secret past its not_after was presented: refused (401); logged once',
    );
  }

  #lookup(presented: string): Entry | undefined {
    // One-shot hashing: a Hash object per request showed in the hit path's profile.
    const digest = hash('sha256', presented, 'buffer');
    const bucket = this.#byPrefix.get(digest.toString('hex', 0, 8));
    if (bucket === undefined) return undefined;
    for (const entry of bucket) {
      if (timingSafeEqual(entry.digest, digest)) return entry;
    }
    return undefined;
  }
}
