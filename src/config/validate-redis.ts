import { keysUnder } from './config-keys.js';
import type { RedisConfig } from './types.js';
import { Problems, checkKeys, childPath, field, indexPath, isMapping, readBoolean, readInteger, readString } from './schema-helpers.js';

const HOST_PORT = /^[A-Za-z0-9.:\-[\]]+:\d{1,5}$/;

/** Keys that only mean something with `sentinels`: the URL forms carry their own credentials and scheme. */
const SENTINEL_ONLY = ['username', 'password', 'sentinel_username', 'sentinel_password', 'tls', 'sentinel_tls'] as const;

/** Checks an optional Redis section (`cache.redis`, `rate_limits_redis`); undefined when absent. */
export function validateRedis(problems: Problems, raw: unknown, path: string): RedisConfig | undefined {
  if (raw === undefined) return undefined;
  if (!isMapping(raw)) {
    problems.add(path, 'must be a mapping');
    return undefined;
  }
  checkKeys(problems, raw, path, keysUnder(path));
  const modes = ['url', 'sentinels', 'cluster'].filter((key) => field(raw, key) !== undefined);
  if (modes.length !== 1) problems.add(path, 'needs exactly one of url, sentinels or cluster');

  const url = field(raw, 'url') === undefined ? undefined : readString(problems, raw, 'url', path);
  if (url !== undefined) checkRedisUrl(problems, url, childPath(path, 'url'), false);
  const sentinels = readList(problems, raw, 'sentinels', path, (value, at) => {
    if (!HOST_PORT.test(value)) problems.add(at, 'must be host:port');
  });
  const cluster = readList(problems, raw, 'cluster', path, (value, at) => checkRedisUrl(problems, value, at, true));
  if (cluster !== undefined) checkSeedsAgree(problems, cluster, childPath(path, 'cluster'));
  const name = field(raw, 'name') === undefined ? undefined : readString(problems, raw, 'name', path);
  if (sentinels !== undefined && (name === undefined || name === '')) problems.add(childPath(path, 'name'), 'is required with sentinels');
  if (sentinels === undefined && name !== undefined) problems.add(childPath(path, 'name'), 'is only used with sentinels');

  const sentinelOnly: { -readonly [K in (typeof SENTINEL_ONLY)[number]]?: RedisConfig[K] } = {};
  for (const key of SENTINEL_ONLY) {
    if (field(raw, key) === undefined) continue;
    if (sentinels === undefined) problems.add(childPath(path, key), 'is only used with sentinels (put credentials and rediss:// in the URL)');
    if (key === 'tls' || key === 'sentinel_tls') {
      const value = readBoolean(problems, raw, key, path);
      if (value !== undefined) sentinelOnly[key] = value;
    } else {
      const value = readString(problems, raw, key, path);
      if (value !== undefined) sentinelOnly[key] = value;
    }
  }
  const tlsCaFile = field(raw, 'tls_ca_file') === undefined ? undefined : readString(problems, raw, 'tls_ca_file', path);
  if (tlsCaFile !== undefined && !usesTls(url, cluster, sentinelOnly)) {
    problems.add(childPath(path, 'tls_ca_file'), 'is only used with TLS (rediss://, tls or sentinel_tls)');
  }

  return {
    ...(url === undefined ? {} : { url }),
    ...(sentinels === undefined ? {} : { sentinels, name }),
    ...(cluster === undefined ? {} : { cluster }),
    ...sentinelOnly,
    ...(tlsCaFile === undefined ? {} : { tls_ca_file: tlsCaFile }),
    prefix: readString(problems, raw, 'prefix', path, 'perch:') ?? 'perch:',
    command_timeout_ms: readInteger(problems, raw, 'command_timeout_ms', path, {
      min: 1,
      max: 60_000,
      fallback: 50,
      expected: 'an integer from 1 to 60000',
    }),
  };
}

function usesTls(url: string | undefined, cluster: readonly string[] | undefined, sentinelOnly: Pick<RedisConfig, 'tls' | 'sentinel_tls'>): boolean {
  const secure = (value: string) => value.startsWith('rediss:');
  return (url !== undefined && secure(url)) || (cluster?.some(secure) ?? false) || sentinelOnly.tls === true || sentinelOnly.sentinel_tls === true;
}

function readList(
  problems: Problems,
  raw: Record<string, unknown>,
  key: string,
  path: string,
  check: (value: string, at: string) => void,
): string[] | undefined {
  const list = field(raw, key);
  if (list === undefined) return undefined;
  const at = childPath(path, key);
  if (!Array.isArray(list) || list.length === 0) {
    problems.add(at, 'must be a non-empty list');
    return undefined;
  }
  list.forEach((value: unknown, i) => {
    if (typeof value !== 'string') problems.add(indexPath(at, i), 'must be a string');
    else check(value, indexPath(at, i));
  });
  return list.filter((value): value is string => typeof value === 'string');
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
  const first = signature(seeds[0]!);
  seeds.forEach((seed, i) => {
    const mine = signature(seed);
    if (first !== undefined && mine !== undefined && mine !== first) {
      problems.add(indexPath(at, i), 'must have the same scheme, user and password as the first seed');
    }
  });
}
