import type { CredentialConfig, XV2UpstreamConfig } from './types.js';
import { keysUnder } from './config-keys.js';
import { validateHttpSettings, validateUrl } from './validate-http-settings.js';
import { validateProtection } from './validate-protection.js';
import { NAME_PATTERN, Problems, checkKeys, childPath, field, indexPath, isMapping, readString } from './schema-helpers.js';

const X_V2_KEYS = keysUnder('upstreams.<name>', 'x_v2');

/** X's API origin; `url` overrides it only to point perch at a stand-in. */
const X_API_ORIGIN = 'https://api.twitter.com';

/**
 * RFC 6750's b64token: what a bearer token may be. Anything else (a space, a line break, a
 * pasted `Bearer ` prefix) would make a header X rejects, or one that splits the request.
 */
const BEARER_TOKEN = /^[A-Za-z0-9\-._~+/%]+=*$/;

/**
 * An `x_v2` upstream section: the keys of a `v1` one, with `bearer_token` in place of `headers`.
 * `passThrough` (`auth.mode: upstream`): each call carries the client's token, so none is needed.
 */
export function validateXV2(problems: Problems, raw: Record<string, unknown>, path: string, passThrough: boolean): XV2UpstreamConfig {
  checkKeys(problems, raw, path, X_V2_KEYS);
  const protection = validateProtection(problems, raw, path);
  return {
    kind: 'x_v2',
    ...protection,
    cooldown_scope: field(raw, 'cooldown_scope') === undefined ? 'endpoint' : protection.cooldown_scope,
    url: validateUrl(problems, raw, path, X_API_ORIGIN),
    credentials: validateBearerCredentials(problems, raw, path, passThrough),
    ...validateHttpSettings(problems, raw, path),
  };
}

/**
 * `credentials: [{ id, bearer_token }]`, or the `bearer_token` shorthand for a single credential
 * `default`. X answers nothing without a token, so one of them is required, except with
 * pass-through auth: then neither is sent, and absent they read as one credential with no header.
 */
function validateBearerCredentials(problems: Problems, raw: Record<string, unknown>, path: string, passThrough: boolean): CredentialConfig[] {
  const list = field(raw, 'credentials');
  const single = field(raw, 'bearer_token');
  if (list === undefined) {
    if (single === undefined) {
      if (passThrough) return [{ id: 'default', headers: {} }];
      problems.add(childPath(path, 'credentials'), 'is required for x_v2 (or the bearer_token shorthand)');
      return [];
    }
    return [{ id: 'default', headers: bearerHeader(problems, raw, path) }];
  }
  const at = childPath(path, 'credentials');
  if (single !== undefined) problems.add(childPath(path, 'bearer_token'), 'give either bearer_token or credentials, not both');
  if (!Array.isArray(list) || list.length === 0) {
    problems.add(at, 'must be a non-empty list of { id, bearer_token }');
    return [];
  }
  const ids = new Set<string>();
  return list.map((entry: unknown, i): CredentialConfig => {
    const here = indexPath(at, i);
    if (!isMapping(entry)) {
      problems.add(here, 'must be a mapping with id and bearer_token');
      return { id: `#${i}`, headers: {} };
    }
    checkKeys(problems, entry, here, keysUnder('upstreams.<name>.credentials[]', 'x_v2'));
    const id = readString(problems, entry, 'id', here) ?? `#${i}`;
    if (!NAME_PATTERN.test(id)) problems.add(childPath(here, 'id'), 'must match [A-Za-z0-9_.-]{1,64}');
    else if (ids.has(id)) problems.add(childPath(here, 'id'), `repeats ${JSON.stringify(id)}`);
    ids.add(id);
    return { id, headers: bearerHeader(problems, entry, here) };
  });
}

/** The token is a secret: messages about it name the path only, never the value. */
function bearerHeader(problems: Problems, raw: Record<string, unknown>, path: string): Record<string, string> {
  const token = readString(problems, raw, 'bearer_token', path);
  if (token === undefined) return {};
  if (!BEARER_TOKEN.test(token)) {
    problems.add(childPath(path, 'bearer_token'), 'must be a bearer token: letters, digits and -._~+/% then optional = (no "Bearer " prefix, no spaces)');
    return {};
  }
  return { Authorization: `Bearer ${token}` };
}
