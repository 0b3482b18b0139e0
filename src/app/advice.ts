import type { Config } from '../config/types.js';

/**
 * Upstreams whose call caps, or the keys' budgets charged for their calls, would multiply across
 * the fleet while Redis is unreachable: a cap or a plan's `provider_calls` is set, they are shared
 * through a Redis, and `redis_down_share` is left at 1, so during an outage every instance may use
 * the whole cap and charge a key its whole limit. perch cannot know how many instances run, so it
 * says so at start-up rather than guess a smaller default.
 */
export function unsharedCapUpstreams(config: Config): string[] {
  if ((config.rate_limits_redis ?? config.cache.redis) === undefined) return [];
  const budgets = Object.values(config.rate_limits).some((plan) => plan.provider_calls !== undefined);
  return Object.entries(config.upstreams).flatMap(([name, upstream]) => {
    if (upstream.kind === 'fixture') return [];
    const capped = budgets || upstream.max_requests_per_second !== undefined || upstream.max_concurrent !== undefined || upstream.quota !== undefined;
    return capped && upstream.redis_down_share === 1 ? [name] : [];
  });
}

/** The start-up warning for `unsharedCapUpstreams`. */
export const UNSHARED_CAP_WARNING =
  'upstream caps and key budgets are fleet-wide through Redis, but redis_down_share is 1: while Redis is unreachable every instance may use the whole cap and charge a key its whole budget; set it to 1 / the number of instances';

const MIB = 1024 * 1024;

/**
 * What perch keeps in the V8 heap beyond its memory tier: code, compiled schemas, connection
 * state and requests in flight (about 20 MiB live at start, measured), with room to collect.
 */
const HEAP_BASE_BYTES = 64 * MIB;

/**
 * V8 heap per byte the memory tier charges, at most. Bodies live outside the heap; each entry's
 * object, Buffer handle, key string and lru-cache slots take about 530 bytes of heap plus the key
 * (measured on Node 20 after a full GC), against at least 640 bytes plus twice the key charged.
 */
const HEAP_PER_CHARGED_BYTE = 0.85;

/** The V8 heap limit below which a full memory tier could exhaust the heap. */
export function heapNeeded(config: Config): number {
  return Math.ceil(config.cache.memory.max_bytes * HEAP_PER_CHARGED_BYTE) + HEAP_BASE_BYTES;
}

/**
 * The heap perch needs when the runtime's old-space limit (`oldSpaceLimitBytes`) is below it,
 * else undefined. Operators lower the limit (`--max-old-space-size`) to keep RSS close to
 * `max_bytes`; set too low, the process would crash with a full cache, hours after a start that
 * looked fine, so perch says so at start-up.
 */
export function heapShortfall(config: Config, heapLimitBytes: number): number | undefined {
  const needed = heapNeeded(config);
  return heapLimitBytes < needed ? needed : undefined;
}

/**
 * The old-generation limit, where cache entries live once they survive their first collections:
 * `--max-old-space-size` (`userOldSpaceMib`), else the whole heap limit. That one also counts the
 * young generation, which on Node 24 reserves 192 MiB beside a 64 MiB old space, so it alone
 * would hide a small old space.
 */
export function oldSpaceLimitBytes(execArgv: readonly string[], nodeOptions: string | undefined, heapSizeLimit: number): number {
  const mib = userOldSpaceMib(execArgv, nodeOptions);
  return mib === undefined ? heapSizeLimit : mib * MIB;
}

/**
 * `--max-old-space-size` (MiB) from node's own flags or NODE_OPTIONS, the last one winning as in
 * node; undefined when neither sets it.
 */
export function userOldSpaceMib(execArgv: readonly string[], nodeOptions: string | undefined): number | undefined {
  return lastFlagMib(/^--max[-_]old[-_]space[-_]size=(\d+)$/, execArgv, nodeOptions);
}

/** `--max-semi-space-size` (MiB) from node's own flags or NODE_OPTIONS, as `userOldSpaceMib`. */
export function userSemiSpaceMib(execArgv: readonly string[], nodeOptions: string | undefined): number | undefined {
  return lastFlagMib(/^--max[-_]semi[-_]space[-_]size=(\d+)$/, execArgv, nodeOptions);
}

/** `--initial-old-space-size` (MiB) from node's own flags or NODE_OPTIONS, as `userOldSpaceMib`. */
export function userInitialOldSpaceMib(execArgv: readonly string[], nodeOptions: string | undefined): number | undefined {
  return lastFlagMib(/^--initial[-_]old[-_]space[-_]size=(\d+)$/, execArgv, nodeOptions);
}

function lastFlagMib(flagPattern: RegExp, execArgv: readonly string[], nodeOptions: string | undefined): number | undefined {
  let mib: number | undefined;
  for (const flag of [...(nodeOptions ?? '').split(/\s+/), ...execArgv]) {
    // node takes these flags only with `=`; any other spelling stops it from starting.
    const match = flagPattern.exec(flag);
    if (match) mib = Number(match[1]);
  }
  return mib;
}

/** The start-up warning for `heapShortfall`. */
export const HEAP_LIMIT_WARNING =
  'the V8 old-space limit is below what a full memory cache may need: raise --max-old-space-size to at least needed_mib, or lower cache.memory.max_bytes';
