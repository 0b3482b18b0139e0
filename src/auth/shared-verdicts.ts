import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { GuardedRedis } from '../redis/guarded-redis.js';

/**
 * One thing the provider said about a key, as the fleet heard it: `a` accepted it on an endpoint,
 * `f` refused it there (X's 403), `r` rejected the key itself (401); `at` is when (epoch ms).
 */
export interface SharedVerdict {
  readonly kind: 'a' | 'f' | 'r';
  readonly at: number;
}

/** The field of a key-wide rejection; every other field is an endpoint's name. */
export const KEY_FIELD = '*';

/** How often an instance waiting for another's verifying call looks whether it ended. */
const POLL_MS = 15;

/**
 * How long a key's verifying turn lasts unless its holder renews it (a third of it before it
 * lapses, while its call runs): an instance that died holding a turn frees it within this.
 */
const LEASE_MS = 3000;

// One key's hash: a rejection replaces everything said before it; an endpoint's verdict ends a
// rejection (the provider answered the key since). The key lapses with its longest verdict.
const RECORD_SCRIPT = `
if ARGV[1] == '*' then redis.call('del', KEYS[1]) else redis.call('hdel', KEYS[1], '*') end
redis.call('hset', KEYS[1], ARGV[1], ARGV[2])
if redis.call('pttl', KEYS[1]) < tonumber(ARGV[3]) then redis.call('pexpire', KEYS[1], ARGV[3]) end
return 1`;

// Deletes the turn only if it is still ours: after it expired another instance may hold it.
const RELEASE_SCRIPT = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
// Extends the turn only if it is still ours.
const RENEW_SCRIPT = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

/** A key's verifying turn, held by this instance in Redis until `release`. */
export interface FleetTurn {
  release(): void;
}

/**
 * Pass-through verdicts shared by every instance on one Redis (`rate_limits_redis`, else
 * `cache.redis`), and each key's verifying turn across the fleet: one instance at a time calls
 * the provider to verify a key, the others wait for its verdict and read it here. Keys are named
 * by their SHA-256 only, under `namespace`, which names the providers that gave the verdicts: a
 * verdict of another provider is never read. Redis failing is "nothing shared": every call here
 * answers undefined or nothing, and each instance verifies on its own, as without Redis.
 */
export class SharedVerdicts {
  readonly #guard: GuardedRedis;
  readonly #prefix: string;

  constructor(guard: GuardedRedis, prefix: string) {
    this.#guard = guard;
    this.#prefix = prefix;
  }

  /** What the fleet heard about the key, by field; undefined when nothing, or Redis did not answer. */
  async read(namespace: string, digest: string): Promise<ReadonlyMap<string, SharedVerdict> | undefined> {
    const key = this.#key('verdicts', namespace, digest);
    const fields = await this.#guard.run('auth read', key, (client) => client.hgetall(key));
    if (fields === undefined) return undefined;
    const verdicts = new Map<string, SharedVerdict>();
    for (const [field, value] of Object.entries(fields)) {
      const kind = value[0];
      const at = Number(value.slice(2));
      if ((kind === 'a' || kind === 'f' || kind === 'r') && value[1] === ':' && Number.isSafeInteger(at)) verdicts.set(field, { kind, at });
    }
    return verdicts.size === 0 ? undefined : verdicts;
  }

  /** Tells the fleet one verdict, which means something for `keepMs`: the key's record lapses no sooner. */
  async record(namespace: string, digest: string, field: string, verdict: SharedVerdict, keepMs: number): Promise<void> {
    const key = this.#key('verdicts', namespace, digest);
    await this.#guard.run('auth record', key, (client) => client.eval(RECORD_SCRIPT, 1, key, field, `${verdict.kind}:${verdict.at}`, Math.max(1, Math.ceil(keepMs))));
  }

  /**
   * Takes the key's verifying turn for at most `turnMs` (the longest a verifying call can take),
   * as a lease of a few seconds (`LEASE_MS`) that this instance renews until `release`: a live
   * holder keeps it, one that died frees it within the lease, not `turnMs`.
   * `held`: another instance has it; undefined: Redis did not answer, and nobody can be waited for.
   */
  async take(namespace: string, digest: string, turnMs: number): Promise<FleetTurn | 'held' | undefined> {
    const key = this.#key('turn', namespace, digest);
    const token = randomUUID();
    const leaseMs = Math.min(turnMs, LEASE_MS);
    const taken = await this.#guard.run('auth turn', key, (client) => client.set(key, token, 'PX', leaseMs, 'NX'));
    if (taken === undefined) {
      // Unanswered (a stalled Redis), the SET may still run when Redis resumes: given back after
      // it, with our token, on the same connection and so in order, it orphans no turn.
      this.#release(key, token);
      return undefined;
    }
    if (taken !== 'OK') return 'held';
    const until = performance.now() + turnMs;
    const renewal = setInterval(() => {
      const left = Math.ceil(Math.min(leaseMs, until - performance.now()));
      if (left <= 0) clearInterval(renewal);
      else void this.#guard.run('auth turn', key, (client) => client.eval(RENEW_SCRIPT, 1, key, token, left));
    }, leaseMs / 3);
    renewal.unref();
    return {
      release: () => {
        clearInterval(renewal);
        this.#release(key, token);
      },
    };
  }

  #release(key: string, token: string): void {
    this.#guard.fire('auth release', (client) => client.eval(RELEASE_SCRIPT, 1, key, token));
  }

  /** Resolves once no instance holds the key's turn, or after `turnMs` at the latest, or at once when Redis does not answer. */
  async ended(namespace: string, digest: string, turnMs: number): Promise<void> {
    const key = this.#key('turn', namespace, digest);
    const deadline = performance.now() + turnMs;
    while (performance.now() < deadline) {
      await sleep(POLL_MS);
      const held = await this.#guard.run('auth turn', key, (client) => client.exists(key));
      if (held !== 1) return;
    }
  }

  #key(kind: 'verdicts' | 'turn', namespace: string, digest: string): string {
    return `${this.#prefix}auth:${kind}:${namespace}:${digest}`;
  }
}
