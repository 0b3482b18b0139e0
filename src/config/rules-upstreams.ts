import { looksLikePlaceholder } from './rules-keys.js';
import { callFloorMs, windowLeavesMs } from './call-floor.js';
import type { Infer } from './dsl.js';
import type { UPSTREAM } from './schema-upstreams.js';
import { NAME_PATTERN, childPath, field, indexPath, isMapping, type Problems } from './schema-helpers.js';
import type { CredentialConfig, UpstreamConfig } from './schema-upstreams.js';
import { isBroken } from './walk.js';

type FileUpstream = Infer<typeof UPSTREAM>;
type FileHttpUpstream = Exclude<FileUpstream, { kind: 'fixture' }>;

const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/**
 * Headers that describe one connection or the message framing. The HTTP client manages them
 * itself; setting them by hand breaks keep-alive or invites request smuggling.
 */
const FORBIDDEN_HEADERS = new Set(['host', 'connection', 'content-length', 'transfer-encoding', 'keep-alive', 'upgrade', 'te', 'trailer']);

/**
 * RFC 6750's b64token: what a bearer token may be. Anything else (a space, a line break, a
 * pasted `Bearer ` prefix) would make a header X rejects, or one that splits the request.
 */
const BEARER_TOKEN = /^[A-Za-z0-9\-._~+/%]+=*$/;

/**
 * One upstream as perch uses it: the rules between its keys checked, its credentials in one
 * form (`headers` and `bearer_token` are shorthands for one credential `default`), computed
 * defaults filled in. `raw` is the section as written, to tell a default from a given value.
 * `passThrough` (`auth.mode: upstream`): calls carry the client's key, so an x_v2 token is optional.
 */
export function resolveUpstream(problems: Problems, up: FileUpstream, raw: unknown, path: string, passThrough: boolean): UpstreamConfig {
  if (up.kind === 'fixture') return { kind: 'fixture' };
  const written = isMapping(raw) ? raw : {};
  const { headers: _headers, bearer_token: _bearer, credentials: _credentials, burst: _burst, ...settings } = up as FileHttpUpstream & { headers?: unknown; bearer_token?: unknown };
  const resolved = {
    ...settings,
    ...protection(problems, up, written, path),
    url: origin(problems, up.url, childPath(path, 'url')),
    credentials: up.kind === 'v1' ? headerCredentials(problems, up, path) : bearerCredentials(problems, up, path, passThrough),
  };
  return resolved as UpstreamConfig;
}

/**
 * A lone miss waits `batch.window_ms` for company within its own deadline, and must have what a
 * window leaves a call (call-floor.ts) when it ends; batch.ts ends a window that soon whatever
 * the setting, so a longer one would be cut short on every lone lookup.
 */
export function checkBatchWindows(problems: Problems, upstreams: Readonly<Record<string, UpstreamConfig>>, missDeadlineMs: number): void {
  const leaves = windowLeavesMs(callFloorMs(missDeadlineMs));
  const most = Math.max(0, missDeadlineMs - leaves);
  for (const [name, up] of Object.entries(upstreams)) {
    if (up.kind !== 'x_v2' || !up.batch.enabled || up.batch.window_ms <= most) continue;
    problems.add(
      childPath(childPath(childPath('upstreams', name), 'batch'), 'window_ms'),
      `leaves a lone miss less than the ${leaves} ms a call needs of server.miss_deadline_ms (${missDeadlineMs}): at most ${most}`,
    );
  }
}

/** The provider-protection rules: the burst needs a rate, backoffs and breaker waits in order. */
function protection(problems: Problems, up: FileHttpUpstream, raw: Record<string, unknown>, path: string) {
  const rate = up.max_requests_per_second;
  if (up.burst !== undefined && rate === undefined) problems.add(childPath(path, 'burst'), 'needs max_requests_per_second');
  if (up.retry_backoff_max_ms < up.retry_backoff_ms) problems.add(childPath(path, 'retry_backoff_max_ms'), 'must be at least retry_backoff_ms');
  const breakerRaw = field(raw, 'breaker');
  const maxGiven = isMapping(breakerRaw) && field(breakerRaw, 'half_open_max_ms') !== undefined;
  const breaker = maxGiven ? up.breaker : { ...up.breaker, half_open_max_ms: Math.max(up.breaker.half_open_max_ms, up.breaker.half_open_after_ms) };
  if (breaker.half_open_max_ms < breaker.half_open_after_ms) problems.add(childPath(childPath(path, 'breaker'), 'half_open_max_ms'), 'must be at least half_open_after_ms');
  return { breaker, ...(rate === undefined ? {} : { burst: up.burst ?? Math.ceil(rate) }) };
}

/**
 * The URL is an origin: request paths are appended to it verbatim, so a path prefix, query or
 * fragment would silently produce wrong upstream requests. Messages do not echo the URL because
 * it may carry credentials.
 */
function origin(problems: Problems, text: string, at: string): string {
  if (text === '') return '';
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    problems.add(at, 'is not a valid absolute URL');
    return '';
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') problems.add(at, 'must use http: or https:');
  if (url.username !== '' || url.password !== '') problems.add(at, 'must not contain a username or password (put credentials in headers)');
  if (url.pathname !== '/') problems.add(at, 'must not have a path (give the origin only)');
  if (url.search !== '' || url.hash !== '') problems.add(at, 'must not have a query or fragment');
  return url.origin;
}

/** `credentials: [{ id, headers }]`, or the `headers` shorthand; both at once leave unclear what a call sends. */
function headerCredentials(problems: Problems, up: Extract<FileUpstream, { kind: 'v1' }>, path: string): CredentialConfig[] {
  if (up.credentials === undefined) return [{ id: 'default', headers: checkHeaders(problems, up.headers, childPath(path, 'headers')) }];
  if (up.headers !== undefined) problems.add(childPath(path, 'headers'), 'give either headers or credentials, not both');
  const ids = new Set<string>();
  return up.credentials.map((entry, i) => {
    const here = indexPath(childPath(path, 'credentials'), i);
    if (isBroken(entry)) return { id: `#${i}`, headers: {} };
    checkId(problems, entry.id, here, ids);
    return { id: entry.id, headers: checkHeaders(problems, entry.headers, childPath(here, 'headers')) };
  });
}

/**
 * `credentials: [{ id, bearer_token }]`, or the `bearer_token` shorthand. X answers nothing
 * without a token, so one is required, except with pass-through auth: then none is sent.
 */
function bearerCredentials(problems: Problems, up: Extract<FileUpstream, { kind: 'x_v2' }>, path: string, passThrough: boolean): CredentialConfig[] {
  if (up.credentials === undefined) {
    if (up.bearer_token !== undefined) return [{ id: 'default', headers: bearer(problems, up.bearer_token, childPath(path, 'bearer_token')) }];
    if (passThrough) return [{ id: 'default', headers: {} }];
    problems.add(childPath(path, 'credentials'), 'is required for x_v2 (or the bearer_token shorthand)');
    return [];
  }
  if (up.bearer_token !== undefined) problems.add(childPath(path, 'bearer_token'), 'give either bearer_token or credentials, not both');
  const ids = new Set<string>();
  return up.credentials.map((entry, i) => {
    const here = indexPath(childPath(path, 'credentials'), i);
    if (isBroken(entry)) return { id: `#${i}`, headers: {} };
    checkId(problems, entry.id, here, ids);
    return { id: entry.id, headers: bearer(problems, entry.bearer_token, childPath(here, 'bearer_token')) };
  });
}

function checkId(problems: Problems, id: string, path: string, ids: Set<string>): void {
  if (!NAME_PATTERN.test(id)) problems.add(childPath(path, 'id'), 'must match [A-Za-z0-9_.-]{1,64}');
  else if (ids.has(id)) problems.add(childPath(path, 'id'), `repeats ${JSON.stringify(id)}`);
  ids.add(id);
}

/** The token is a secret: messages about it name the path only, never the value. */
function bearer(problems: Problems, token: string, at: string): Record<string, string> {
  if (token === '') return {};
  if (!BEARER_TOKEN.test(token)) {
    problems.add(at, 'must be a bearer token: letters, digits and -._~+/% then optional = (no "Bearer " prefix, no spaces)');
    return {};
  }
  return { Authorization: `Bearer ${token}` };
}

/** Header values are usually provider keys, so messages about them name the path only. */
export function checkHeaders(problems: Problems, headers: Readonly<Record<string, unknown>> | undefined, path: string): Record<string, string> {
  if (headers === undefined) return {};
  const seen = new Map<string, string>();
  for (const [name, value] of Object.entries(headers)) {
    const at = childPath(path, name);
    const lower = name.toLowerCase();
    if (!HEADER_NAME.test(name)) problems.add(at, 'is not a valid header name');
    else if (FORBIDDEN_HEADERS.has(lower) || lower.startsWith('proxy-')) problems.add(at, 'is a hop-by-hop or framing header, which perch does not let you set');
    const earlier = seen.get(lower);
    if (earlier !== undefined) problems.add(at, `repeats header ${earlier} (header names are case-insensitive)`);
    seen.set(lower, name);
    if (typeof value !== 'string') problems.add(at, 'must be a string');
    else if (/[\r\n\0]/.test(value)) problems.add(at, 'must not contain a line break or NUL character');
    else if (looksLikePlaceholder(value)) problems.add(at, 'still looks like a "${...}" placeholder after substitution (a variable left unset, or a "$${" that was meant as one)');
  }
  return Object.fromEntries(Object.entries(headers).filter((entry): entry is [string, string] => typeof entry[1] === 'string'));
}
