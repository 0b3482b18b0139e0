import { ENDPOINT_NAMES, type EndpointName } from '../endpoints.js';
import { OPERATIONAL_PATHS } from '../url-table.js';
import { resolveKeys, sha256Hex, type SecretsSeen } from './rules-keys.js';
import { checkRedis } from './rules-redis.js';
import { checkTracing } from './rules-tracing.js';
import { checkBatchWindows, resolveUpstream } from './rules-upstreams.js';
import type { FileConfig } from './schema.js';
import { childPath, field, indexPath, isMapping, type Problems } from './schema-helpers.js';
import type { AdminConfig, AuthConfig, Config, UpstreamConfig } from './types.js';

/** Keys of `auth` that only mode `upstream` reads. */
const UPSTREAM_ONLY = [
  'default_plan',
  'verify_ttl_seconds',
  'reject_ttl_seconds',
  'remembered_keys',
  'verify_rate_per_second',
  'verify_burst',
  'verify_source_share',
  'revalidate_rate_per_second',
  'revalidate_burst',
] as const;

/** Paths perch answers itself besides metrics: metrics must not shadow one. */
const RESERVED_PATHS = Object.keys(OPERATIONAL_PATHS);

/**
 * The rules between keys, which one key's definition cannot say: references (plans, upstreams),
 * secrets, either/or keys, orders between values. Also resolves the shorthands into the form
 * perch uses. `raw` is the file as written, to tell a default from a value given.
 */
export function applyRules(problems: Problems, file: FileConfig, raw: Record<string, unknown>): Config {
  const server = file.server;
  if (server.host === '') problems.add('server.host', 'must not be empty');
  // Node applies the request timeout to the headers too; a shorter one would silently win.
  if (server.request_timeout_ms < server.headers_timeout_ms) problems.add('server.request_timeout_ms', 'must be at least server.headers_timeout_ms');

  // References are checked only against a usable section: a missing, broken or empty one is
  // already reported, and repeating that for every reference would bury the report.
  const plans = usable(file.rate_limits);
  checkPlanWaits(problems, file.rate_limits);
  const secrets: SecretsSeen = new Map();
  const auth = resolveAuth(problems, file.auth, field(raw, 'auth'), plans, secrets);
  const admin = file.admin === undefined ? undefined : resolveAdmin(problems, file.admin, secrets);

  const rawUpstreams = field(raw, 'upstreams');
  const upstreams = Object.fromEntries(
    Object.entries(file.upstreams).map(([name, up]): [string, UpstreamConfig] => [
      name,
      resolveUpstream(problems, up, isMapping(rawUpstreams) ? field(rawUpstreams, name) : undefined, childPath('upstreams', name), auth.mode === 'upstream'),
    ]),
  );
  checkCredentialsAgainstKeys(problems, file.upstreams, upstreams, secrets);
  checkBatchWindows(problems, upstreams, server.miss_deadline_ms);
  if (file.cache.redis !== undefined) checkRedis(problems, file.cache.redis, 'cache.redis');
  if (file.rate_limits_redis !== undefined) checkRedis(problems, file.rate_limits_redis, 'rate_limits_redis');
  checkMetricsPath(problems, file.metrics.path);
  if (file.metrics.require_admin && file.admin === undefined) problems.add('metrics.require_admin', 'needs an admin section (its keys are what a scraper presents)');
  if (file.tracing !== undefined) checkTracing(problems, file.tracing);

  const { admin: _admin, ...sections } = file;
  return {
    ...sections,
    auth,
    ...(admin === undefined ? {} : { admin }),
    upstreams,
    routes: resolveRoutes(problems, file.routes, usable(file.upstreams)),
  };
}

function usable<T>(section: Readonly<Record<string, T>>): Readonly<Record<string, T>> | undefined {
  return Object.keys(section).length > 0 ? section : undefined;
}

/**
 * Mode `keys` (perch checks `auth.keys`) or `upstream` (the provider checks each key). An option
 * of the other mode is a problem rather than ignored, so a file never reads as if it did
 * something it does not.
 */
function resolveAuth(problems: Problems, auth: FileConfig['auth'], raw: unknown, plans: object | undefined, secrets: SecretsSeen): AuthConfig {
  const given = (key: string) => isMapping(raw) && field(raw, key) !== undefined;
  const { keys: _keys, ...settings } = auth;
  if (auth.mode === 'keys') {
    for (const name of UPSTREAM_ONLY) if (given(name)) problems.add(childPath('auth', name), 'applies only with mode: upstream');
    if (isMapping(raw) && !given('keys')) problems.add('auth.keys', 'is required (at least one key)');
    const keys = resolveKeys(problems, auth.keys ?? [], 'auth.keys', secrets);
    auth.keys?.forEach((key, i) => {
      if (key.plan !== '' && plans !== undefined && !Object.hasOwn(plans, key.plan)) {
        problems.add(childPath(indexPath('auth.keys', i), 'plan'), `names no entry of rate_limits (${JSON.stringify(key.plan)})`);
      }
    });
    return { ...settings, keys };
  }
  if (given('keys')) problems.add('auth.keys', 'must be absent with mode: upstream (the provider checks every key)');
  if (auth.default_plan === undefined) problems.add('auth.default_plan', 'is required');
  else if (plans !== undefined && !Object.hasOwn(plans, auth.default_plan)) {
    problems.add('auth.default_plan', `names no entry of rate_limits (${JSON.stringify(auth.default_plan)})`);
  }
  checkVerificationWaits(problems, auth);
  return { ...settings, keys: [] };
}

/** The largest integer a Structured Field carries (RFC 8941: 15 digits), and so `Retry-After`. */
const MAX_WAIT_SECONDS = 999_999_999_999_999;

/**
 * The longest a plan's bucket may take to fill: `x-rate-limit-reset` adds it to the epoch seconds
 * (10 digits until the year 2286), and the sum must still be an integer of at most 15 digits.
 */
const MAX_FILL_SECONDS = MAX_WAIT_SECONDS - 9_999_999_999;

/**
 * A plan's answers carry `Retry-After` (one token: `1 / refill_per_second`), `RateLimit`'s `t`
 * (the bucket full: `capacity / refill_per_second`) and `x-rate-limit-reset` (now plus that):
 * each must stay an integer a client can parse. `refill_per_second: 1e-300` answered
 * `Retry-After: 9.999999999999999e+299`.
 */
function checkPlanWaits(problems: Problems, plans: FileConfig['rate_limits']): void {
  for (const [name, plan] of Object.entries(plans)) {
    if (!(plan.capacity >= 1 && plan.refill_per_second > 0)) continue;
    if (Math.ceil(plan.capacity / plan.refill_per_second) > MAX_FILL_SECONDS) {
      problems.add(
        childPath(childPath('rate_limits', name), 'refill_per_second'),
        `must be at least capacity / ${MAX_FILL_SECONDS} (the bucket fills in at most ${MAX_FILL_SECONDS} seconds, so Retry-After, RateLimit and x-rate-limit-reset stay integers of at most 15 digits)`,
      );
    }
  }
}

/**
 * A verification 429 asks the client to wait one token of the bucket that refused it, `1 / rate`
 * seconds: of one source's unknown keys (`verify_source_share` of `verify_rate_per_second`), or of
 * the accepted keys (`revalidate_rate_per_second`). Each must be an integer a client can parse:
 * `verify_source_share: 5e-324` answered `Retry-After: Infinity`.
 */
function checkVerificationWaits(problems: Problems, auth: FileConfig['auth']): void {
  const within = (rate: number) => Math.ceil(1 / rate) <= MAX_WAIT_SECONDS;
  // A rate too low on its own is the rate's problem, not the share's.
  if (within(auth.verify_rate_per_second) && !within(auth.verify_source_share * auth.verify_rate_per_second)) {
    problems.add('auth.verify_source_share', `must be at least 1 / (${MAX_WAIT_SECONDS} * verify_rate_per_second) (one source's keys wait at most ${MAX_WAIT_SECONDS} seconds for a turn, the largest integer Retry-After carries)`);
  }
  if (!within(auth.revalidate_rate_per_second)) {
    problems.add('auth.revalidate_rate_per_second', `must be at least 1 / ${MAX_WAIT_SECONDS} (an accepted key waits at most ${MAX_WAIT_SECONDS} seconds for a turn, the largest integer Retry-After carries)`);
  }
}

function resolveAdmin(problems: Problems, admin: NonNullable<FileConfig['admin']>, secrets: SecretsSeen): AdminConfig {
  return { ...admin, keys: resolveKeys(problems, admin.keys, 'admin.keys', secrets) };
}

/** Every endpoint not listed falls back to the first upstream, so a one-upstream file needs no routes. */
function resolveRoutes(problems: Problems, routes: FileConfig['routes'], upstreams: object | undefined): Record<EndpointName, readonly string[]> {
  const first = upstreams === undefined ? [] : Object.keys(upstreams).slice(0, 1);
  const entries = ENDPOINT_NAMES.map((endpoint): [EndpointName, readonly string[]] => {
    const list = routes[endpoint];
    if (list === undefined || list.length === 0) return [endpoint, first];
    const seen = new Set<string>();
    list.forEach((name, i) => {
      const at = indexPath(childPath('routes', endpoint), i);
      if (seen.has(name)) problems.add(at, `repeats ${JSON.stringify(name)}`);
      else if (upstreams !== undefined && !Object.hasOwn(upstreams, name)) problems.add(at, `names no configured upstream (${JSON.stringify(name)})`);
      seen.add(name);
    });
    return [endpoint, list];
  });
  return Object.fromEntries(entries) as Record<EndpointName, readonly string[]>;
}

function checkMetricsPath(problems: Problems, path: string): void {
  if (!path.startsWith('/')) problems.add('metrics.path', 'must start with "/"');
  // The API lives under /v1/; a metrics path there would shadow an endpoint.
  else if (path.startsWith('/v1/')) problems.add('metrics.path', 'must not start with "/v1/" (the API uses that prefix)');
  else if (RESERVED_PATHS.includes(path)) problems.add('metrics.path', `must not be ${path} (perch serves that itself)`);
}

/**
 * A client or admin key that is also a provider credential would hand the provider's secret to
 * whoever holds that key (and the other way round). Messages name both paths, never the secret.
 */
function checkCredentialsAgainstKeys(problems: Problems, files: FileConfig['upstreams'], upstreams: Readonly<Record<string, UpstreamConfig>>, secrets: SecretsSeen): void {
  if (secrets.size === 0) return;
  for (const [name, up] of Object.entries(upstreams)) {
    if (up.kind === 'fixture') continue;
    const file = files[name] as { credentials?: unknown } | undefined;
    const base = childPath('upstreams', name);
    up.credentials.forEach((credential, i) => {
      const at = file?.credentials === undefined ? base : indexPath(childPath(base, 'credentials'), i);
      for (const [header, value] of Object.entries(credential.headers)) {
        // A bearer token is the secret whichever way it was written: `bearer_token:` (x_v2), or
        // an `Authorization: Bearer ...` header of any kind.
        const token = header.toLowerCase() === 'authorization' ? /^Bearer +(.+)$/i.exec(value)?.[1] : undefined;
        // x_v2 takes its tokens as `bearer_token` only.
        const shorthand = up.kind === 'x_v2';
        const key = secrets.get(sha256Hex(value)) ?? (token === undefined ? undefined : secrets.get(sha256Hex(token)));
        if (key !== undefined) problems.add(shorthand ? childPath(at, 'bearer_token') : childPath(childPath(at, 'headers'), header), `is the same secret as ${key} (a client key must never be a provider credential)`);
      }
    });
  }
}
