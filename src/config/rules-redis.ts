import type { RedisConfig } from './schema.js';
import { childPath, indexPath, type Problems } from './schema-helpers.js';

const HOST_PORT = /^[A-Za-z0-9.:\-[\]]+:\d{1,5}$/;

/** Keys that only mean something with `sentinels`: the URL forms carry their own credentials and scheme. */
const SENTINEL_ONLY = ['username', 'password', 'sentinel_username', 'sentinel_password', 'tls', 'sentinel_tls'] as const;

/** The rules of a Redis section (`cache.redis`, `rate_limits_redis`) between its keys. */
export function checkRedis(problems: Problems, redis: RedisConfig, path: string): void {
  const modes = (['url', 'sentinels', 'cluster'] as const).filter((key) => redis[key] !== undefined);
  if (modes.length !== 1) problems.add(path, 'needs exactly one of url, sentinels or cluster');
  if (redis.url !== undefined) checkRedisUrl(problems, redis.url, childPath(path, 'url'), false);
  redis.sentinels?.forEach((value, i) => {
    if (!HOST_PORT.test(value)) problems.add(indexPath(childPath(path, 'sentinels'), i), 'must be host:port');
  });
  if (redis.cluster !== undefined) {
    redis.cluster.forEach((value, i) => checkRedisUrl(problems, value, indexPath(childPath(path, 'cluster'), i), true));
    checkSeedsAgree(problems, redis.cluster, childPath(path, 'cluster'));
  }
  if (redis.sentinels !== undefined && (redis.name === undefined || redis.name === '')) problems.add(childPath(path, 'name'), 'is required with sentinels');
  if (redis.sentinels === undefined && redis.name !== undefined) problems.add(childPath(path, 'name'), 'is only used with sentinels');
  for (const key of SENTINEL_ONLY) {
    if (redis[key] !== undefined && redis.sentinels === undefined) {
      problems.add(childPath(path, key), 'is only used with sentinels (put credentials and rediss:// in the URL)');
    }
  }
  const secure = (value: string) => value.startsWith('rediss:');
  const tls = (redis.url !== undefined && secure(redis.url)) || (redis.cluster?.some(secure) ?? false) || redis.tls === true || redis.sentinel_tls === true;
  if (redis.tls_ca_file !== undefined && !tls) problems.add(childPath(path, 'tls_ca_file'), 'is only used with TLS (rediss://, tls or sentinel_tls)');
}

// Messages name the path only: a Redis URL may carry a password.
function checkRedisUrl(problems: Problems, value: string, at: string, seed: boolean): void {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    problems.add(at, 'is not a valid URL');
    return;
  }
  if (url.protocol !== 'redis:' && url.protocol !== 'rediss:') problems.add(at, 'must use redis: or rediss:');
  if (url.hostname === '') problems.add(at, 'needs a host');
  const db = url.pathname.replace(/^\//, '');
  if (db !== '' && !/^\d{1,5}$/.test(db)) problems.add(at, 'database (the URL path) must be a number');
  else if (seed && db !== '' && Number(db) !== 0) problems.add(at, 'Redis Cluster has database 0 only');
  try {
    decodeURIComponent(url.username);
    decodeURIComponent(url.password);
  } catch {
    problems.add(at, 'has a badly percent-encoded user or password');
  }
}

/** ioredis applies one set of credentials and one scheme to every node it discovers. */
function checkSeedsAgree(problems: Problems, seeds: readonly string[], at: string): void {
  const signature = (seed: string) => {
    try {
      const url = new URL(seed);
      return `${url.protocol}|${url.username}|${url.password}`;
    } catch {
      return undefined;
    }
  };
  const first = seeds[0] === undefined ? undefined : signature(seeds[0]);
  seeds.forEach((seed, i) => {
    const mine = signature(seed);
    if (first !== undefined && mine !== undefined && mine !== first) {
      problems.add(indexPath(at, i), 'must have the same scheme, user and password as the first seed');
    }
  });
}
