import type { CredentialConfig, UpstreamConfig, V1UpstreamConfig } from './types.js';
import { keysUnder } from './config-keys.js';
import { validateHttpSettings, validateUrl } from './validate-http-settings.js';
import { validateProtection } from './validate-protection.js';
import { validateXV2 } from './validate-x-v2.js';
import {
  UPSTREAM_NAME_PATTERN,
  Problems,
  checkKeys,
  childPath,
  field,
  indexPath,
  isMapping,
  NAME_PATTERN,
  readString,
} from './schema-helpers.js';

const V1_KEYS = keysUnder('upstreams.<name>', 'v1');

const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/**
 * Headers that describe one connection or the message framing. The HTTP client manages them
 * itself; setting them by hand breaks keep-alive or invites request smuggling.
 */
const FORBIDDEN_HEADERS = new Set(['host', 'connection', 'content-length', 'transfer-encoding', 'keep-alive', 'upgrade', 'te', 'trailer']);

/** `upstreams`: required, at least one entry. Output keeps file order. */
/** `passThrough`: `auth.mode: upstream`, where calls carry the client's key (an x_v2 token is optional). */
export function validateUpstreams(problems: Problems, raw: unknown, passThrough: boolean): Record<string, UpstreamConfig> {
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
  return Object.fromEntries(names.map((name) => [name, validateUpstream(problems, raw[name], name, passThrough)]));
}

function validateUpstream(problems: Problems, raw: unknown, name: string, passThrough: boolean): UpstreamConfig {
  const path = childPath('upstreams', name);
  if (!UPSTREAM_NAME_PATTERN.test(name)) problems.add(path, 'upstream name must match [A-Za-z][A-Za-z0-9_.-]{0,63}');
  if (!isMapping(raw)) {
    problems.add(path, 'must be a mapping (with at least `kind`)');
    return { kind: 'fixture' };
  }
  const kind = field(raw, 'kind');
  if (kind === 'fixture') {
    checkKeys(problems, raw, path, keysUnder('upstreams.<name>', 'fixture'), 'a fixture upstream takes no other keys');
    return { kind: 'fixture' };
  }
  if (kind === 'v1') return validateV1(problems, raw, path);
  if (kind === 'x_v2') return validateXV2(problems, raw, path, passThrough);
  problems.add(childPath(path, 'kind'), kind === undefined ? 'is required (v1, x_v2 or fixture)' : 'must be "v1", "x_v2" or "fixture"');
  return { kind: 'fixture' };
}

function validateV1(problems: Problems, raw: Record<string, unknown>, path: string): V1UpstreamConfig {
  checkKeys(problems, raw, path, V1_KEYS);
  return {
    kind: 'v1',
    ...validateProtection(problems, raw, path),
    url: validateUrl(problems, raw, path),
    credentials: validateCredentials(problems, raw, path),
    ...validateHttpSettings(problems, raw, path),
  };
}

/**
 * `credentials: [{ id, headers }]`, or the `headers` shorthand for a single credential `default`.
 * Both at once would leave it unclear which headers a call sends, so that is a problem.
 */
function validateCredentials(problems: Problems, raw: Record<string, unknown>, path: string): CredentialConfig[] {
  const list = field(raw, 'credentials');
  const headers = field(raw, 'headers');
  if (list === undefined) return [{ id: 'default', headers: validateHeaders(problems, headers, childPath(path, 'headers')) }];
  const at = childPath(path, 'credentials');
  if (headers !== undefined) problems.add(childPath(path, 'headers'), 'give either headers or credentials, not both');
  if (!Array.isArray(list) || list.length === 0) {
    problems.add(at, 'must be a non-empty list of { id, headers }');
    return [{ id: 'default', headers: {} }];
  }
  const ids = new Set<string>();
  return list.map((entry: unknown, i): CredentialConfig => {
    const here = indexPath(at, i);
    if (!isMapping(entry)) {
      problems.add(here, 'must be a mapping with id and headers');
      return { id: `#${i}`, headers: {} };
    }
    checkKeys(problems, entry, here, keysUnder('upstreams.<name>.credentials[]', 'v1'));
    const id = readString(problems, entry, 'id', here) ?? `#${i}`;
    if (!NAME_PATTERN.test(id)) problems.add(childPath(here, 'id'), 'must match [A-Za-z0-9_.-]{1,64}');
    else if (ids.has(id)) problems.add(childPath(here, 'id'), `repeats ${JSON.stringify(id)}`);
    ids.add(id);
    if (field(entry, 'headers') === undefined) problems.add(childPath(here, 'headers'), 'is required');
    return { id, headers: validateHeaders(problems, field(entry, 'headers'), childPath(here, 'headers')) };
  });
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
