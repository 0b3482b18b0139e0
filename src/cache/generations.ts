import type { EndpointName } from '../endpoints.js';
import type { Generation } from './generation.js';
import type { MemoryStore } from './memory-store.js';

/**
 * What one purge covers: every entry of one endpoint for one path parameter (all cursors and
 * counts), e.g. `tweets:123`, `user_by_username:alice`. Scopes contain a colon, so they never
 * collide with the `all` field that sits beside them in Redis.
 */
export type Scope = `${EndpointName}:${string}`;

/** A purge: one scope, or every entry. */
export type PurgeTarget = Scope | 'all';

/** A generation taken when a fetch starts, with this instance's purge sequence at that moment. */
export interface Stamp extends Generation {
  readonly seq: number;
}

/**
 * The scope of a cache key. Cache keys are the canonical paths route.ts builds
 * (`/v1/users/<id>`, `/v1/users/<id>/<listing>?...`, `/v1/users/by/username/<name>`,
 * `/v1/tweets/<id>`), so the scope is read off the path segments: exact, unlike a prefix match,
 * where `/v1/users/1` would also cover `/v1/users/12` and `/v1/users/1/tweets`.
 */
export function scopeOfKey(key: string): Scope {
  const q = key.indexOf('?');
  const s = (q === -1 ? key : key.slice(0, q)).split('/');
  if (s[2] === 'tweets') return `tweet:${s[3]}`;
  if (s[3] === 'by') return `user_by_username:${s[5]}`;
  return s.length === 4 ? `user:${s[3]}` : (`${s[4]}:${s[3]}` as Scope);
}

/**
 * This instance's view of the purge counters, and its enforcement on the memory tier. The view
 * only ever rises: a purge message, a purge's own result and a resync after a reconnect are all
 * merged with `observe`, in any order, to the same outcome. Memory entries of a purged scope are
 * dropped when the rise is observed, so a memory hit needs no generation check at all; entries
 * read from Redis or about to be stored are checked with `accepts`.
 */
export class Generations {
  readonly #memory: MemoryStore;
  #all = 0;
  readonly #scopes = new Map<string, number>();
  /** Rises with every observed purge; lets a fetch tell whether any purge happened meanwhile. */
  #seq = 0;

  constructor(memory: MemoryStore) {
    this.#memory = memory;
  }

  /** The counter of `all` purges this instance knows. */
  get all(): number {
    return this.#all;
  }

  stamp(key: string): Stamp {
    return { all: this.#all, scope: this.#scopes.get(scopeOfKey(key)) ?? 0, seq: this.#seq };
  }

  /**
   * The generation for `key` as of `since`, or undefined when a purge was observed after `since`
   * was taken. For a key learnt only from a response body: its own scope was not stamped when
   * the fetch started, so a fetch that overlapped any purge does not store under it.
   */
  restamp(since: Stamp, key: string): Generation | undefined {
    return since.seq === this.#seq ? this.stamp(key) : undefined;
  }

  /** Whether an entry of `key` fetched under `generation` has survived every purge known here. */
  accepts(key: string, generation: Generation): boolean {
    // Newer than this view: a purge this instance has not heard of yet; the entry is current.
    if (generation.all !== this.#all) return generation.all > this.#all;
    // Most of the time no scope was purged since the last `all`: no key parsing, no lookup.
    return this.#scopes.size === 0 || generation.scope >= (this.#scopes.get(scopeOfKey(key)) ?? 0);
  }

  /**
   * Raises the view to `all` and the given scope generations, dropping the memory entries that
   * the rise invalidates. A higher `all` starts a new epoch: scope counters restart from zero and
   * the whole memory tier goes. Returns what was dropped, for the log; empty when nothing rose.
   */
  observe(all: number, scopes: Iterable<readonly [string, number]> = []): PurgeTarget[] {
    if (all < this.#all) return [];
    const raised: PurgeTarget[] = [];
    if (all > this.#all) {
      this.#all = all;
      this.#scopes.clear();
      raised.push('all');
    }
    for (const [scope, generation] of scopes) {
      if (generation <= (this.#scopes.get(scope) ?? 0)) continue;
      this.#scopes.set(scope, generation);
      if (raised[0] !== 'all') raised.push(scope as Scope);
    }
    if (raised.length > 0) {
      this.#seq++;
      this.drop(raised);
    }
    return raised;
  }

  /** A purge with no Redis to count it: this instance's counters alone. */
  bump(target: PurgeTarget): void {
    if (target === 'all') this.observe(this.#all + 1);
    else this.observe(this.#all, [[target, (this.#scopes.get(target) ?? 0) + 1]]);
  }

  /** Drops memory entries of `targets` without touching the counters. */
  drop(targets: readonly PurgeTarget[]): void {
    if (targets.includes('all')) {
      this.#memory.clear();
      return;
    }
    const scopes = new Set<string>(targets);
    this.#memory.deleteWhere((key) => scopes.has(scopeOfKey(key)));
  }

  /** The view as Redis stores it: `all`, then scope and generation pairs. */
  snapshot(): string[] {
    return [String(this.#all), ...[...this.#scopes].flatMap(([scope, generation]) => [scope, String(generation)])];
  }
}
