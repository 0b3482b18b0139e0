import type { V1UpstreamConfig } from './types.js';
import { Problems, childPath, readInteger, readString } from './schema-helpers.js';

type HttpSettings = Pick<V1UpstreamConfig, 'timeout_ms' | 'connections' | 'max_body_bytes' | 'retry_after_default_seconds'>;

/** The connection keys every HTTP upstream kind (`v1`, `x_v2`) takes, with the same defaults. */
export function validateHttpSettings(problems: Problems, raw: Record<string, unknown>, path: string): HttpSettings {
  const int = (key: string, min: number, max: number, fallback: number) =>
    readInteger(problems, raw, key, path, { min, max, fallback, expected: `an integer from ${min} to ${max}` });
  return {
    timeout_ms: int('timeout_ms', 1, 600_000, 5000),
    connections: int('connections', 1, 1024, 64),
    max_body_bytes: int('max_body_bytes', 1024, 1_073_741_824, 8_388_608),
    retry_after_default_seconds: int('retry_after_default_seconds', 1, 86_400, 60),
  };
}

/**
 * The URL is an origin: request paths are appended to it verbatim, so a path prefix, query or
 * fragment would silently produce wrong upstream requests. Messages do not echo the URL because
 * it may carry credentials. `fallback` makes the key optional.
 */
export function validateUrl(problems: Problems, raw: Record<string, unknown>, path: string, fallback?: string): string {
  const text = readString(problems, raw, 'url', path, fallback);
  if (text === undefined) return '';
  const at = childPath(path, 'url');
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    problems.add(at, 'is not a valid absolute URL');
    return '';
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') problems.add(at, 'must use http: or https:');
  if (url.username !== '' || url.password !== '') {
    problems.add(at, 'must not contain a username or password (put credentials in headers)');
  }
  if (url.pathname !== '/') problems.add(at, 'must not have a path (give the origin only)');
  if (url.search !== '' || url.hash !== '') problems.add(at, 'must not have a query or fragment');
  return url.origin;
}
