import { canonicalParameter, DEFAULT_COUNT, INVALID, MAX_COUNT, MAX_CURSOR_BYTES, PARAMETER_PATTERNS, type EndpointName, type EndpointRequest, type PathParams } from './endpoints.js';

/**
 * The whole URL table: the paths perch answers itself (probes, metrics, the OpenAPI document,
 * admin) and the six API routes, with the one way a request target is split into path and query.
 * Everything not in the table is the API handler's, which answers an unknown path 404 after the
 * key check, so a caller without a key learns nothing about which paths exist.
 */

/** Operational and admin paths, answered outside the API: no rate-limit token, no API access line. */
export const OPERATIONAL_PATHS = {
  '/healthz': 'healthz',
  '/readyz': 'readyz',
  '/openapi.json': 'openapi',
  '/admin/purge': 'purge',
  '/status': 'status_page',
  '/status.json': 'status_json',
} as const satisfies Readonly<Record<string, string>>;

/** An operational route; `metrics` is at `metrics.path`, which the configuration chooses. */
export type OperationalRoute = (typeof OPERATIONAL_PATHS)[keyof typeof OPERATIONAL_PATHS] | 'metrics';

const OPERATIONAL = new Map<string, OperationalRoute>(Object.entries(OPERATIONAL_PATHS));

/** Path and query of a request target (`/a/b?c=d` -> `/a/b`, `c=d`); the query is '' when absent. */
export function splitTarget(target: string): readonly [path: string, query: string] {
  const q = target.indexOf('?');
  return q === -1 ? [target, ''] : [target.slice(0, q), target.slice(q + 1)];
}

/**
 * The operational route a target names, by exact path (a query is allowed: probes add cache
 * busters); undefined for the API's. `metricsPath`: where metrics are served on this listener,
 * undefined when `metrics.port` gives them their own.
 */
export function operationalRoute(target: string, metricsPath: string | undefined): OperationalRoute | undefined {
  // Every API request comes through here first: its prefix turns it away without slicing.
  if (target.startsWith('/v1/')) return undefined;
  const [path] = splitTarget(target);
  return OPERATIONAL.get(path) ?? (path === metricsPath ? 'metrics' : undefined);
}

/** Result of matching a request target against the six routes. */
export type RouteMatch =
  | { readonly kind: 'endpoint'; readonly request: EndpointRequest }
  | { readonly kind: 'invalid'; readonly endpoint: EndpointName; readonly message: string }
  | { readonly kind: 'unknown' };

const COUNT_PATTERN = /^[0-9]{1,3}$/;
// C0 controls and DEL: a cursor is opaque, but these never belong in one and break log lines.
const CONTROL_CHARACTER = /[\u0000-\u001f\u007f]/;

/**
 * Matches `/v1/...` targets to an endpoint and validates its parameters. Matching is by path
 * segments, not regular expressions over the whole target: it is on every request's path and the
 * shape is fixed. Unknown query parameters are dropped here, so they never reach the upstream
 * or split the cache.
 */
export function matchRoute(target: string): RouteMatch {
  let match = recent.get(target);
  if (match === undefined) {
    // Cleared rather than evicted one by one: a flood of distinct targets costs the same as none.
    if (recent.size >= RECENT_TARGETS) recent.clear();
    match = matchTarget(target);
    recent.set(target, match);
  }
  return match;
}

/**
 * Recently matched targets: on the hit path the same few targets come again and again, and a
 * match is an immutable value, so it is computed once per target while it stays recent.
 */
const recent = new Map<string, RouteMatch>();
const RECENT_TARGETS = 1024;

function matchTarget(target: string): RouteMatch {
  const [path, query] = splitTarget(target);
  const s = path.split('/');
  // s[0] is the empty string before the leading slash.
  if (s[0] !== '' || s[1] !== 'v1') return UNKNOWN;
  if (s[2] === 'tweets' && s.length === 4) return single('tweet', 'tweet_id', s[3]!);
  if (s[2] !== 'users') return UNKNOWN;
  if (s.length === 4) return single('user', 'user_id', s[3]!);
  if (s.length === 6 && s[3] === 'by' && s[4] === 'username') return byUsername(s[5]!);
  if (s.length === 5) {
    const sub = s[4];
    if (sub === 'tweets' || sub === 'replies' || sub === 'following') return listing(sub, s[3]!, query);
  }
  return UNKNOWN;
}

const UNKNOWN: RouteMatch = { kind: 'unknown' };

function single(endpoint: 'user' | 'tweet', name: 'user_id' | 'tweet_id', raw: string): RouteMatch {
  const given = decodeSegment(raw);
  if (given === undefined || !PARAMETER_PATTERNS[name].test(given)) return invalid(endpoint, INVALID[name]);
  const id = canonicalParameter(name, given);
  const base = endpoint === 'tweet' ? '/v1/tweets/' : '/v1/users/';
  return ok(endpoint, { [name]: id }, base + id);
}

function byUsername(raw: string): RouteMatch {
  const name = decodeSegment(raw);
  if (name === undefined || !PARAMETER_PATTERNS.username.test(name)) return invalid('user_by_username', INVALID.username);
  const username = canonicalParameter('username', name);
  return ok('user_by_username', { username }, `/v1/users/by/username/${username}`);
}

function listing(endpoint: 'tweets' | 'replies' | 'following', raw: string, query: string): RouteMatch {
  const given = decodeSegment(raw);
  if (given === undefined || !PARAMETER_PATTERNS.user_id.test(given)) return invalid(endpoint, INVALID.user_id);
  const id = canonicalParameter('user_id', given);
  const search = query === '' ? undefined : new URLSearchParams(query);
  const cursors = search?.getAll('cursor') ?? [];
  if (cursors.length > 1) return invalid(endpoint, INVALID.repeated('cursor'));
  const cursor = cursors[0];
  if (cursor !== undefined && (cursor === '' || Buffer.byteLength(cursor) > MAX_CURSOR_BYTES || CONTROL_CHARACTER.test(cursor))) {
    return invalid(endpoint, INVALID.cursor);
  }
  let path = `/v1/users/${id}/${endpoint}`;
  let count: number | undefined;
  if (endpoint === 'following') {
    const counts = search?.getAll('count') ?? [];
    if (counts.length > 1) return invalid(endpoint, INVALID.repeated('count'));
    count = counts.length === 0 ? DEFAULT_COUNT : parseCount(counts[0]!);
    if (count === undefined) return invalid(endpoint, INVALID.count);
    path += `?count=${count}`;
  }
  if (cursor !== undefined) path += `${count === undefined ? '?' : '&'}cursor=${encodeURIComponent(cursor)}`;
  return { kind: 'endpoint', request: { endpoint, params: { user_id: id }, count, cursor, path } };
}

function parseCount(raw: string): number | undefined {
  if (!COUNT_PATTERN.test(raw)) return undefined;
  const n = Number(raw);
  return n >= 1 && n <= MAX_COUNT ? n : undefined;
}

/** Percent-decodes a path segment; undefined when the encoding is broken. */
function decodeSegment(raw: string): string | undefined {
  if (!raw.includes('%')) return raw;
  try {
    return decodeURIComponent(raw);
  } catch {
    return undefined;
  }
}

function ok(endpoint: EndpointName, params: PathParams, path: string): RouteMatch {
  return { kind: 'endpoint', request: { endpoint, params, path } };
}

function invalid(endpoint: EndpointName, message: string): RouteMatch {
  return { kind: 'invalid', endpoint, message };
}
