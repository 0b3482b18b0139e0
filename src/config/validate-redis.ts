import type { RedisConfig } from './types.js';
import { Problems, checkKeys, childPath, field, indexPath, isMapping, readInteger, readString } from './schema-helpers.js';

const HOST_PORT = /^[A-Za-z0-9.:\-[\]]+:\d{1,5}$/;

/** Checks an optional Redis section (`cache.redis`, `rate_limits_redis`); undefined when absent. */
export function validateRedis(problems: Problems, raw: unknown, path: string): RedisConfig | undefined {
  if (raw === undefined) return undefined;
  if (!isMapping(raw)) {
    problems.add(path, 'must be a mapping');
    return undefined;
  }
  checkKeys(problems, raw, path, ['url', 'sentinels', 'name', 'cluster', 'prefix', 'command_timeout_ms']);
  const modes = ['url', 'sentinels', 'cluster'].filter((key) => field(raw, key) !== undefined);
  if (modes.length !== 1) problems.add(path, 'needs exactly one of url, sentinels or cluster');

  const url = field(raw, 'url') === undefined ? undefined : readString(problems, raw, 'url', path);
  if (url !== undefined) checkRedisUrl(problems, url, childPath(path, 'url'));
  const sentinels = readList(problems, raw, 'sentinels', path, (value, at) => {
    if (!HOST_PORT.test(value)) problems.add(at, 'must be host:port');
  });
  const cluster = readList(problems, raw, 'cluster', path, (value, at) => checkRedisUrl(problems, value, at));
  const name = field(raw, 'name') === undefined ? undefined : readString(problems, raw, 'name', path);
  if (sentinels !== undefined && (name === undefined || name === '')) problems.add(childPath(path, 'name'), 'is required with sentinels');
  if (sentinels === undefined && name !== undefined) problems.add(childPath(path, 'name'), 'is only used with sentinels');

  return {
    ...(url === undefined ? {} : { url }),
    ...(sentinels === undefined ? {} : { sentinels, name }),
    ...(cluster === undefined ? {} : { cluster }),
    prefix: readString(problems, raw, 'prefix', path, 'perch:') ?? 'perch:',
    command_timeout_ms: readInteger(problems, raw, 'command_timeout_ms', path, {
      min: 1,
      max: 60_000,
      fallback: 50,
      expected: 'an integer from 1 to 60000',
    }),
  };
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
function checkRedisUrl(problems: Problems, value: string, at: string): void {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    problems.add(at, 'is not a valid URL');
    return;
  }
  if (url.protocol !== 'redis:' && url.protocol !== 'rediss:') problems.add(at, 'must use redis: or rediss:');
}
