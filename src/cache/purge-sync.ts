import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from '../logging/logger.js';
import type { GuardedRedis } from '../redis/guarded-redis.js';
import type { RedisClient } from '../redis/redis-client.js';
import type { Generations, PurgeTarget } from './generations.js';

/**
 * Counts a purge and announces it in one atomic step, so no instance can see the new count
 * without the message having been sent. The counters live in one hash, `all` beside one field
 * per purged scope, rather than one key each: a resync must read every scope counter, and one
 * hash is one HGETALL where separate keys would need KEYS or SCAN; one key also needs no hash
 * tags in a cluster. An `all` purge resets the scope fields (entries of the old epoch are all
 * invalid anyway), which bounds the hash to the scopes purged since the last `all`.
 * A missing hash (evicted, flushed, a Redis restarted without persistence) would restart the
 * counts from 0, below what the instances hold, and they would ignore the purge: then nothing is
 * counted, every instance is told to write back what it knows (`reset`), and the caller restores
 * the hash from its own view before it counts again.
 * KEYS[1] hash, ARGV[1] channel, ARGV[2] target, ARGV[3] the instances' channel. Returns { all,
 * scope generation, how many perch instances the message reached (its subscribers, at most the
 * instances' channel's) }, or { -1, 0 } when the hash was missing.
 */
const PURGE_SCRIPT = `
local function instances() return redis.call('PUBSUB', 'NUMSUB', ARGV[3])[2] end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('PUBLISH', ARGV[1], 'reset')
  return { -1, 0 }
end
if ARGV[2] == 'all' then
  local all = redis.call('HINCRBY', KEYS[1], 'all', 1)
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'all', all)
  local reached = redis.call('PUBLISH', ARGV[1], tostring(all))
  return { all, 0, math.min(reached, instances()) }
end
local generation = redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
local all = tonumber(redis.call('HGET', KEYS[1], 'all') or '0')
local reached = redis.call('PUBLISH', ARGV[1], all .. ' ' .. generation .. ' ' .. ARGV[2])
return { all, generation, math.min(reached, instances()) }`;

/** The message that asks every instance to write its counters back into a hash Redis lost. */
const RESET = 'reset';
/** The prefix of a restored hash announced whole: `sync all <n> <scope> <generation> ...`. */
const SYNC = 'sync ';

/**
 * Resync after (re)connecting, and restore after a reset: raises the hash to this instance's view
 * (field by field, the higher wins) and returns the merged hash. Raising matters when Redis lost
 * its data: counters that went back to zero would make the next purge's count one that instances
 * already hold, and they would ignore it. The hash always gets its `all` field, so it exists
 * after a merge even before any purge; a merge that finds it missing tells the other instances
 * to write theirs back too (`reset`). A restore announces the merged hash (`sync ...`), so an
 * instance that started on the empty hash learns what the others wrote back, without a
 * reconnection of its own.
 * KEYS[1] hash, ARGV[1] channel, ARGV[2] `announce` or `quiet`, ARGV[3] this instance's `all`,
 * then scope and generation pairs.
 */
const MERGE_SCRIPT = `
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('PUBLISH', ARGV[1], 'reset')
end
local all = tonumber(redis.call('HGET', KEYS[1], 'all') or '0')
local mine = tonumber(ARGV[3])
if mine > all then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'all', ARGV[3])
  all = mine
end
if mine == all then
  for i = 4, #ARGV, 2 do
    if tonumber(ARGV[i + 1]) > tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0') then
      redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    end
  end
end
redis.call('HSETNX', KEYS[1], 'all', all)
local merged = redis.call('HGETALL', KEYS[1])
if ARGV[2] == 'announce' then
  redis.call('PUBLISH', ARGV[1], 'sync ' .. table.concat(merged, ' '))
end
return merged`;

const MAX_RESYNC_DELAY_MS = 1000;
/** How long a resync fails before the log says so. */
const RESYNC_TELL_MS = 1000;

/**
 * How long a purge waits for every instance its message reached to confirm it applied it; past
 * that the purge is counted but not confirmed (`unconfirmed`), and the caller is told to retry.
 * The confirmations are looked for after CONFIRM_POLL_MS, then twice as long each time up to
 * CONFIRM_POLL_MAX_MS: they usually land within a few ms, and a burst of purges must not turn
 * into thousands of reads that time out the cache's other commands.
 */
const CONFIRM_MS = 2000;
const CONFIRM_POLL_MS = 2;
const CONFIRM_POLL_MAX_MS = 32;
/**
 * Every perch instance subscribes to a second channel, `<prefix>purge:instances`, on which
 * nothing is ever published: its subscriber count (PUBSUB NUMSUB, which counts no pattern
 * subscribers) is how many perch instances that confirm purges are listening. A purge waits for
 * as many confirmations as its message reached subscribers, but never for more than that: another
 * client subscribed to `<prefix>purge` (`redis-cli SUBSCRIBE`, `PSUBSCRIBE *`, a monitoring tool)
 * or an instance of an older perch, which confirms nothing, is not waited for.
 */
const INSTANCES_SUFFIX = ':instances';
/** How long a confirmation counter outlives its purge. */
const CONFIRM_TTL_MS = 10_000;
// One confirmation: the counter of a purge's message, rising once per instance that applied it.
const CONFIRM_SCRIPT = "local n = redis.call('INCR', KEYS[1]) redis.call('PEXPIRE', KEYS[1], ARGV[1]) return n";

/** What became of a purge: applied by every instance it reached, counted only, or not counted. */
export type PurgeResult = 'confirmed' | 'unconfirmed' | 'failed';

export interface PurgeSyncOptions {
  /** The cache's connection: purges go through its breaker like every other command. */
  readonly guard: GuardedRedis;
  /** A connection of its own: a subscribed connection can send nothing but (un)subscribes. */
  readonly subscriber: RedisClient;
  readonly prefix: string;
  readonly generations: Generations;
  readonly logger: Logger;
}

/**
 * Purges across instances: the purging instance counts the purge in Redis and publishes it on
 * `<prefix>purge`; every instance subscribes and raises its generations, which drops its memory
 * entries of the scope and makes older Redis entries misses. Nothing is read from Redis on a
 * request's path. A message missed while the subscriber was disconnected is made up for on
 * reconnection, which re-reads the counters before the instance relies on messages again.
 */
export class PurgeSync {
  readonly #guard: GuardedRedis;
  readonly #subscriber: RedisClient;
  readonly #key: string;
  readonly #channel: string;
  readonly #generations: Generations;
  readonly #logger: Logger;
  /** Which (re)connection is resyncing: a newer one supersedes a resync still retrying. */
  #connection = 0;
  #closed = false;
  /** The channel whose subscribers are the perch instances that confirm purges. */
  readonly #instances: string;
  /**
   * Whether this instance's view holds every purge Redis counted: false from the start and from
   * each loss of the subscription until the resync after it, while a purge may have gone unheard
   * (meanwhile each entry read from Redis is judged by the counters read after it, `catchUp`, and
   * nothing is written there, tiered-cache.ts).
   */
  #current = false;
  /** Settles the start's wait (`started`): at the first resync, or when the first connection fails. */
  #started!: () => void;
  readonly #start = new Promise<void>((resolve) => (this.#started = resolve));

  constructor(options: PurgeSyncOptions) {
    this.#guard = options.guard;
    this.#subscriber = options.subscriber;
    this.#key = `${options.prefix}gen`;
    this.#channel = `${options.prefix}purge`;
    this.#instances = `${this.#channel}${INSTANCES_SUFFIX}`;
    this.#generations = options.generations;
    this.#logger = options.logger;
    // Connection errors show as a missing subscription, made up for on reconnection; this only
    // keeps ioredis from reporting them as unhandled 'error' events.
    this.#subscriber.on('error', () => {});
    this.#subscriber.on('ready', () => void this.#resync(++this.#connection));
    // Messages sent from now until the resync after the next connection are lost: the resync
    // under way, if any, is superseded, and nothing read from Redis is served until the next one.
    this.#subscriber.on('close', () => {
      this.#connection++;
      this.#current = false;
      this.#started();
    });
    this.#subscriber.on('message', (channel: string, message: string) => {
      if (channel === this.#channel) this.#onMessage(message);
    });
  }

  /**
   * Counts `target` in Redis and announces it; false when Redis could not take it. A hash Redis
   * lost is first restored from this instance's view (the others write theirs back on the
   * `reset` message), so the count starts above what every instance holds.
   */
  async purge(target: PurgeTarget): Promise<PurgeResult> {
    for (let attempt = 0; attempt < 2; attempt++) {
      const reply = await this.#guard.run('purge', this.#key, (client) => client.eval(PURGE_SCRIPT, 1, this.#key, this.#channel, target, this.#instances));
      if (!Array.isArray(reply)) return 'failed';
      const [all, generation, reached] = reply.map(Number) as [number, number, number];
      if (all >= 0) {
        this.#counted(all, target, generation, 'request');
        return (await this.#confirmed(messageOf(all, target, generation), reached)) ? 'confirmed' : 'unconfirmed';
      }
      this.#logger.warn({ key: this.#key }, 'cache purge counters missing in Redis: restoring them before counting');
      if (!(await this.#restore())) return 'failed';
    }
    // Lost again between the restore and the count: not counted, so not claimed.
    return 'failed';
  }

  /**
   * Whether every instance the purge's message reached (`reached`, this one's subscriber
   * included) has applied it: each counts its application under the message (`#confirm`). Until
   * then another instance could still serve, or let a request join, what the purge dropped.
   */
  async #confirmed(message: string, reached: number): Promise<boolean> {
    const key = this.#confirmKey(message);
    const deadline = performance.now() + CONFIRM_MS;
    for (let pause = CONFIRM_POLL_MS; ; pause = Math.min(pause * 2, CONFIRM_POLL_MAX_MS)) {
      // A read that failed (a timeout in a burst) is one look fewer, not a verdict: look again.
      const count = await this.#guard.run('purge', key, (client) => client.get(key));
      if (count !== undefined && Number(count ?? 0) >= reached) return true;
      if (performance.now() >= deadline) {
        this.#logger.warn({ reached, confirmed: count === undefined ? 'unknown' : Number(count ?? 0) }, 'cache purge not confirmed by every instance it reached');
        return false;
      }
      await sleep(Math.min(pause, Math.max(1, deadline - performance.now())));
    }
  }

  #confirmKey(message: string): string {
    return `${this.#key}:ack:${message}`;
  }

  /** Tells the purging instance this one applied the purge `message` announced. */
  #confirm(message: string): void {
    const key = this.#confirmKey(message);
    this.#guard.fire('purge', (client) => client.eval(CONFIRM_SCRIPT, 1, key, CONFIRM_TTL_MS));
  }

  /**
   * Whether Redis entries may be judged by this instance's view alone: it has heard every purge
   * since its last resync. Until then an entry a purge dropped could still be read there, its
   * generation taken for one newer than this instance's view (generations.ts): `catchUp` first.
   */
  get current(): boolean {
    return this.#current;
  }

  /**
   * For an entry read from Redis while not `current`: reads the counters after it and raises this
   * instance's view to them, as a resync does, so that the entry is judged against every purge
   * Redis had counted by then, a purge acknowledged before its request arrived included. Counters
   * missing, or below this view (Redis lost them, and an instance re-created them from a shorter
   * view), are restored from this view first, as a purge that finds them so does, so that the
   * fleet agrees again. False when they could not be read or restored: the entry is not served.
   */
  async catchUp(): Promise<boolean> {
    const fields = await this.#guard.run('purge', this.#key, (client) => client.hgetall(this.#key));
    if (fields === undefined) return false;
    if (fields.all === undefined || Number(fields.all) < this.#generations.all) return this.#restore();
    this.#applyHash(Object.entries(fields).flat(), 'read');
    return true;
  }

  /**
   * Resolves once the first resync is done, or the first connection failed (Redis down: the
   * instance starts, and syncs when Redis is back), or after `ms` at the latest: true when synced.
   */
  async started(ms: number): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.#start, new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)))]);
    clearTimeout(timer);
    return this.#current;
  }

  close(): void {
    this.#closed = true;
    this.#subscriber.disconnect();
  }

  #onMessage(message: string): void {
    if (message === RESET) return void this.#restore();
    if (message.startsWith(SYNC)) return this.#applyHash(message.slice(SYNC.length).split(' '), 'sync');
    const [all, generation, scope] = message.split(' ');
    const counts = [Number(all), Number(generation ?? 0)];
    if (!counts.every(Number.isSafeInteger)) return;
    this.#counted(counts[0]!, (scope ?? 'all') as PurgeTarget, counts[1]!, 'message');
    // Applied (memory dropped, generations raised) synchronously above: only now confirmed.
    this.#confirm(message);
  }

  /**
   * A purge Redis counted. Counted under an `all` below this instance's, it was counted in a hash
   * Redis lost and another instance re-created from a shorter view: this instance honours it in
   * its own view (the same scope, or every entry, goes) and writes its view back. The purging
   * instance hears its own message too and bumps twice: the scope's entries stored in between
   * cost one more miss, nothing else.
   */
  #counted(all: number, target: PurgeTarget, generation: number, via: 'request' | 'message'): void {
    if (all >= this.#generations.all) return this.#apply(all, target === 'all' ? [] : [[target, generation]], via);
    this.#generations.bump(target);
    this.#logger.warn({ purged: [target], via, counted: all, known: this.#generations.all }, 'cache purge counted below this instance\'s counters: applied here, counters restored');
    void this.#restore();
  }

  /**
   * Writes this instance's view back into the hash and announces the result (a `reset`, a count
   * below this view, a purge that found the hash missing); false when Redis did not take it, which
   * the next resync makes up for.
   */
  async #restore(): Promise<boolean> {
    const merged = await this.#guard.run('purge', this.#key, (client) => client.eval(MERGE_SCRIPT, 1, this.#key, this.#channel, 'announce', ...this.#generations.snapshot()));
    if (!Array.isArray(merged)) return false;
    this.#applyHash(merged as string[], 'resync');
    return true;
  }

  #applyHash(reply: readonly string[], via: 'resync' | 'sync' | 'read'): void {
    const fields = new Map<string, number>();
    for (let i = 0; i + 1 < reply.length; i += 2) {
      const count = Number(reply[i + 1]);
      if (Number.isSafeInteger(count)) fields.set(reply[i]!, count);
    }
    const all = fields.get('all') ?? 0;
    fields.delete('all');
    this.#apply(all, fields, via);
  }

  /**
   * Subscribes first, then reads the counters, so a purge lands in one or the other; only then
   * does this instance serve Redis entries again (`current`). Retries
   * until both succeed (the cache connection may come up after this one), directly on the
   * client: this runs beside requests, not on their path, which is what the breaker protects.
   */
  async #resync(connection: number): Promise<void> {
    const began = performance.now();
    let told = false;
    for (let delay = 100; !this.#closed && connection === this.#connection; delay = Math.min(delay * 2, MAX_RESYNC_DELAY_MS)) {
      try {
        await this.#subscriber.subscribe(this.#channel, this.#instances);
        const reply = (await this.#guard.client.eval(MERGE_SCRIPT, 1, this.#key, this.#channel, 'quiet', ...this.#generations.snapshot())) as string[];
        // Lost again while the counters were read: the next connection's resync takes over.
        if (connection !== this.#connection) return;
        this.#applyHash(reply, 'resync');
        // Once per connection: from here on, messages keep this instance's purges current.
        this.#current = true;
        this.#started();
        this.#logger.info({ all: this.#generations.all }, 'cache purge counters synced');
        return;
      } catch (error) {
        // The first tries may fail while the cache's own connection comes up: said once failing
        // for a second, then the retries go on quietly until one succeeds.
        if (!told && connection === this.#connection && performance.now() - began >= RESYNC_TELL_MS) {
          told = true;
          this.#logger.warn({ reason: error instanceof Error ? error.message : String(error) }, 'cache purge counters not synced: until they are, each Redis read reads them too and nothing is written to Redis');
        }
        await sleep(delay, undefined, { ref: false });
      }
    }
  }

  #apply(all: number, scopes: Iterable<readonly [string, number]>, via: 'request' | 'message' | 'resync' | 'sync' | 'read'): void {
    const purged = this.#generations.observe(all, scopes);
    // A new instance's first resync raises every scope purged since the last `all`: keep the line short.
    if (purged.length > 0) this.#logger.info({ purged: purged.slice(0, 10), count: purged.length, via }, 'cache purge applied');
  }
}

/** The message the purge script publishes for a purge counted as `all` and `generation`. */
function messageOf(all: number, target: PurgeTarget, generation: number): string {
  return target === 'all' ? String(all) : `${all} ${generation} ${target}`;
}
