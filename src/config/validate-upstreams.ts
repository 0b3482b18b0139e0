import type { UpstreamConfig, V1UpstreamConfig } from './types.js';
import {
  UPSTREAM_NAME_PATTERN,
  Problems,
  checkKeys,
  childPath,
  field,
  isMapping,
  readInteger,
  readString,
} from './schema-helpers.js';

const V1_KEYS = ['kind', 'url', 'headers', 'timeout_ms', 'connections', 'max_body_bytes', 'retry_after_default_seconds'];

const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/**
 * Headers that describe one connection or the message framing. The HTTP client manages them
 * itself; setting them by hand breaks keep-alive or invites request smuggling.
 */
const FORBIDDEN_HEADERS = new Set(['host', 'connection', 'content-length', 'transfer-encoding', 'keep-alive', 'upgrade', 'te', 'trailer']);

/** `upstreams`: required, at least one entry. Output keeps file order. */
export function validateUpstreams(problems: Problems, raw: unknown): Record<string, UpstreamConfig> {
  const path = 'upstreams';
  if (raw === undefined) {
    problems.add(path, 'is required (at least one upstream)');
    return {};
  }
  if (!isMapping(raw)) {
    problems.add(path, 'must be a mapping of upstream name to settings');
    return {};
  }
  const names = Object.keys(raw);
  if (names.length === 0) problems.add(path, 'must define at least one upstream');
  return Object.fromEntries(names.map((name) => [name, validateUpstream(problems, raw[name], name)]));
}

function validateUpstream(problems: Problems, raw: unknown, name: string): UpstreamConfig {
  const path = childPath('upstreams', name);
  if (!UPSTREAM_NAME_PATTERN.test(name)) problems.add(path, 'upstream name must match [A-Za-z][A-Za-z0-9_.-]{0,63}');
  if (!isMapping(raw)) {
    problems.add(path, 'must be a mapping (with at least `kind`)');
    return { kind: 'fixture' };
  }
  const kind = field(raw, 'kind');
  if (kind === 'fixture') {
    checkKeys(problems, raw, path, ['kind'], 'a fixture upstream takes no other keys');
    return { kind: 'fixture' };
  }
  if (kind === 'v1') return validateV1(problems, raw, path);
  problems.add(childPath(path, 'kind'), kind === undefined ? 'is required (v1 or fixture)' : 'must be "v1" or "fixture"');
  return { kind: 'fixture' };
}

function validateV1(problems: Problems, raw: Record<string, unknown>, path: string): V1UpstreamConfig {
  checkKeys(problems, raw, path, V1_KEYS);
  return {
    kind: 'v1',
    url: validateUrl(problems, raw, path),
    headers: validateHeaders(problems, field(raw, 'headers'), childPath(path, 'headers')),
    timeout_ms: readInteger(problems, raw, 'timeout_ms', path, {
      min: 1,
      max: 600_000,
      fallback: 5000,
      expected: 'an integer from 1 to 600000',
    }),
    connections: readInteger(problems, raw, 'connections', path, {
      min: 1,
      max: 1024,
      fallback: 64,
      expected: 'an integer from 1 to 1024',
    }),
    max_body_bytes: readInteger(problems, raw, 'max_body_bytes', path, {
      min: 1024,
      max: 1_073_741_824,
      fallback: 8_388_608,
      expected: 'an integer from 1024 to 1073741824',
    }),
    retry_after_default_seconds: readInteger(problems, raw, 'retry_after_default_seconds', path, {
      min: 1,
      max: 86_400,
      fallback: 60,
      expected: 'an integer from 1 to 86400',
    }),
  };
}

/**
 * The URL is an origin: request paths are appended to it verbatim, so a path prefix, query or
 * fragment would silently produce wrong upstream requests. Messages do not echo the URL because
 * it may carry credentials.
 */
function validateUrl(problems: Problems, raw: Record<string, unknown>, path: string): string {
  const text = readString(problems, raw, 'url', path);
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

/** Header values are usually provider keys, so messages about them name the path only. */
function validateHeaders(problems: Problems, raw: unknown, path: string): Record<string, string> {
  if (raw === undefined) return {};
  if (!isMapping(raw)) {
    problems.add(path, 'must be a mapping of header name to value');
    return {};
  }
  const seen = new Map<string, string>();
  for (const [name, value] of Object.entries(raw)) {
    const at = childPath(path, name);
    const lower = name.toLowerCase();
    if (!HEADER_NAME.test(name)) {
      problems.add(at, 'is not a valid header name');
    } else if (FORBIDDEN_HEADERS.has(lower) || lower.startsWith('proxy-')) {
      problems.add(at, 'is a hop-by-hop or framing header, which perch does not let you set');
    }
    const earlier = seen.get(lower);
    if (earlier !== undefined) problems.add(at, `repeats header ${earlier} (header names are case-insensitive)`);
    seen.set(lower, name);
    if (typeof value !== 'string') {
      problems.add(at, 'must be a string');
    } else if (/[\r\n\0]/.test(value)) {
      problems.add(at, 'must not contain a line break or NUL character');
    }
  }
  return Object.fromEntries(Object.entries(raw).filter((entry): entry is [string, string] => typeof entry[1] === 'string'));
}
