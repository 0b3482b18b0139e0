/**
 * Every key of the configuration file, in one table. The validators take the keys they accept
 * from here (`keysUnder`), the JSON Schema is generated from it (`json-schema.ts`), and tests
 * hold it to the README's configuration table and to the defaults the validators apply. Range
 * and cross-key rules stay in the hand-written validators: the schema is for editors, the
 * validator is the authority.
 *
 * Path syntax: `a.b` nests mappings; `<name>` is a mapping with keys of the operator's choosing
 * (`<endpoint>`: one of the endpoint names); `[]` is a list of the mappings its children describe.
 */

/** What a key holds. `map`: string to string (headers); `object`/`array`: see the children. */
export type KeyType = 'string' | 'integer' | 'number' | 'boolean' | 'object' | 'array' | 'string[]' | 'map';

/** The upstream kinds; a key under `upstreams.<name>` applies to the kinds it lists. */
export type UpstreamKind = 'v1' | 'x_v2' | 'fixture';

export interface ConfigKey {
  readonly path: string;
  readonly type: KeyType;
  /** The value the validator applies when the key is absent, when it is a plain value. */
  readonly default?: string | number | boolean | readonly string[] | Readonly<Record<string, never>>;
  readonly enum?: readonly string[];
  /** Must be present (within its parent, and for the kinds it lists). */
  readonly required?: boolean;
  /** Under `upstreams.<name>`: the kinds that take the key (default v1 and x_v2). */
  readonly kinds?: readonly UpstreamKind[];
  /**
   * The README's default column, when it is prose rather than the default rendered as code
   * (`required`, `-`, a rule such as `ceil(max_requests_per_second)`).
   */
  readonly readme?: string;
  /** False for a section the README has no row for (its keys have theirs). */
  readonly row?: false;
}

const HTTP: readonly UpstreamKind[] = ['v1', 'x_v2'];

const SERVER: ConfigKey[] = [
  { path: 'server.host', type: 'string', default: '127.0.0.1' },
  { path: 'server.port', type: 'integer', default: 8080 },
  { path: 'server.shutdown_grace_ms', type: 'integer', default: 10000 },
  { path: 'server.headers_timeout_ms', type: 'integer', default: 10000 },
  { path: 'server.request_timeout_ms', type: 'integer', default: 30000 },
  { path: 'server.miss_deadline_ms', type: 'integer', default: 10000 },
  { path: 'server.keep_alive_timeout_ms', type: 'integer', default: 5000 },
  { path: 'server.max_header_bytes', type: 'integer', default: 16384 },
  { path: 'server.max_connections', type: 'integer', default: 10000 },
  { path: 'server.tls.cert_file', type: 'string', required: true, readme: '-' },
  { path: 'server.tls.key_file', type: 'string', required: true, readme: '-' },
  { path: 'server.rate_limit_headers', type: 'string[]', enum: ['ietf', 'x_rate_limit'], default: ['ietf'] },
];

const KEYS: ConfigKey[] = [
  { path: 'auth', type: 'object', required: true, row: false },
  { path: 'auth.mode', type: 'string', enum: ['keys', 'upstream'], default: 'keys' },
  { path: 'auth.keys[]', type: 'array', readme: 'required with mode `keys`' },
  { path: 'auth.keys[].id', type: 'string', required: true },
  { path: 'auth.keys[].key', type: 'string' },
  { path: 'auth.keys[].sha256', type: 'string' },
  { path: 'auth.keys[].plan', type: 'string', required: true },
  { path: 'auth.default_plan', type: 'string', readme: 'required with mode `upstream`' },
  { path: 'auth.verify_ttl_seconds', type: 'integer', default: 300 },
  { path: 'auth.reject_ttl_seconds', type: 'integer', default: 60 },
  { path: 'auth.remembered_keys', type: 'integer', default: 100000 },
  { path: 'admin', type: 'object' },
  { path: 'admin.keys[]', type: 'array', required: true, readme: 'required with `admin`' },
  { path: 'admin.keys[].id', type: 'string', required: true },
  { path: 'admin.keys[].key', type: 'string' },
  { path: 'admin.keys[].sha256', type: 'string' },
  { path: 'admin.status_page', type: 'boolean', default: false },
  { path: 'rate_limits', type: 'object', required: true, row: false },
  { path: 'rate_limits.<plan>.capacity', type: 'integer', required: true },
  { path: 'rate_limits.<plan>.refill_per_second', type: 'number', required: true },
  { path: 'rate_limits.<plan>.cost_of_hit', type: 'integer', default: 1 },
  { path: 'rate_limits.<plan>.provider_weight', type: 'number', default: 1 },
  { path: 'rate_limits.<plan>.provider_calls', type: 'object', row: false },
  { path: 'rate_limits.<plan>.provider_calls.limit', type: 'integer', required: true, readme: 'required with `provider_calls`' },
  { path: 'rate_limits.<plan>.provider_calls.window', type: 'string', enum: ['hour', 'day', 'month'], required: true, readme: 'required with `provider_calls`' },
];

/** The keys of a Redis section (`cache.redis`, `rate_limits_redis`): the same for both. */
function redisKeys(section: string): ConfigKey[] {
  return [
    ...['url', 'name', 'username', 'password', 'sentinel_username', 'sentinel_password', 'tls_ca_file'].map(
      (key): ConfigKey => ({ path: `${section}.${key}`, type: 'string' }),
    ),
    { path: `${section}.sentinels`, type: 'string[]' },
    { path: `${section}.cluster`, type: 'string[]' },
    { path: `${section}.tls`, type: 'boolean', default: false },
    { path: `${section}.sentinel_tls`, type: 'boolean', default: false },
    { path: `${section}.prefix`, type: 'string', default: 'perch:' },
    { path: `${section}.command_timeout_ms`, type: 'integer', default: 50 },
  ];
}

const U = 'upstreams.<name>';

const UPSTREAMS: ConfigKey[] = [
  { path: 'upstreams', type: 'object', required: true, row: false },
  { path: U, type: 'object' },
  { path: `${U}.kind`, type: 'string', enum: ['v1', 'x_v2', 'fixture'], required: true, kinds: ['v1', 'x_v2', 'fixture'] },
  { path: `${U}.url`, type: 'string', required: true, kinds: ['v1'], readme: 'required for `v1`; `https://api.twitter.com` for `x_v2`' },
  { path: `${U}.url`, type: 'string', default: 'https://api.twitter.com', kinds: ['x_v2'], readme: 'required for `v1`; `https://api.twitter.com` for `x_v2`' },
  { path: `${U}.headers`, type: 'map', kinds: ['v1'], default: {} },
  { path: `${U}.bearer_token`, type: 'string', kinds: ['x_v2'] },
  { path: `${U}.credentials[]`, type: 'array', kinds: ['v1'], readme: 'one `default` credential' },
  { path: `${U}.credentials[]`, type: 'array', kinds: ['x_v2'], readme: 'required with `x_v2` unless `bearer_token` or `auth.mode: upstream`' },
  { path: `${U}.credentials[].id`, type: 'string', required: true },
  { path: `${U}.credentials[].headers`, type: 'map', required: true, kinds: ['v1'] },
  { path: `${U}.credentials[].bearer_token`, type: 'string', required: true, kinds: ['x_v2'] },
  { path: `${U}.max_requests_per_second`, type: 'number' },
  { path: `${U}.burst`, type: 'integer', readme: '`ceil(max_requests_per_second)`' },
  { path: `${U}.max_concurrent`, type: 'integer' },
  { path: `${U}.quota.requests`, type: 'integer', required: true, readme: '-' },
  { path: `${U}.quota.per_seconds`, type: 'integer', required: true, readme: '-' },
  { path: `${U}.queue_timeout_ms`, type: 'integer', default: 1000 },
  { path: `${U}.queue_size`, type: 'integer', default: 1000 },
  { path: `${U}.redis_down_share`, type: 'number', default: 1 },
  { path: `${U}.rate_limit_reserve`, type: 'integer', default: 0 },
  { path: `${U}.cooldown_scope`, type: 'string', enum: ['upstream', 'endpoint'], default: 'upstream', kinds: ['v1'], readme: '`upstream` (`v1`)' },
  { path: `${U}.cooldown_scope`, type: 'string', enum: ['upstream', 'endpoint'], default: 'endpoint', kinds: ['x_v2'] },
  { path: `${U}.usage_cap_seconds`, type: 'integer', default: 86400 },
  { path: `${U}.timeout_ms`, type: 'integer', default: 5000 },
  { path: `${U}.connections`, type: 'integer', default: 64 },
  { path: `${U}.max_body_bytes`, type: 'integer', default: 8388608 },
  { path: `${U}.retry_after_default_seconds`, type: 'integer', default: 60 },
  { path: `${U}.price_per_call`, type: 'number', readme: '-' },
  { path: `${U}.retries`, type: 'integer', default: 0 },
  { path: `${U}.retry_budget_percent`, type: 'number', default: 20 },
  { path: `${U}.retry_budget_min_per_second`, type: 'number', default: 1 },
  { path: `${U}.retry_backoff_ms`, type: 'integer', default: 50 },
  { path: `${U}.retry_backoff_max_ms`, type: 'integer', default: 1000 },
  { path: `${U}.breaker.consecutive_failures`, type: 'integer', default: 20 },
  { path: `${U}.breaker.failure_ratio`, type: 'number', default: 0.9 },
  { path: `${U}.breaker.window_ms`, type: 'integer', default: 10000 },
  { path: `${U}.breaker.min_calls`, type: 'integer', default: 20 },
  { path: `${U}.breaker.half_open_after_ms`, type: 'integer', default: 1000 },
  { path: `${U}.breaker.half_open_max_ms`, type: 'integer', default: 4000 },
  { path: `${U}.throttle.enabled`, type: 'boolean', default: true },
  { path: `${U}.throttle.k`, type: 'number', default: 2 },
  { path: `${U}.throttle.window_ms`, type: 'integer', default: 10000 },
  { path: `${U}.throttle.min_calls`, type: 'integer', default: 20 },
];

const REST: ConfigKey[] = [
  { path: 'routes.<endpoint>', type: 'string[]', readme: 'the first upstream' },
  { path: 'cache.memory.max_bytes', type: 'integer', default: 268435456 },
  { path: 'cache.ttl_seconds.<endpoint>', type: 'integer', readme: 'see below' },
  { path: 'cache.ttl_seconds.not_found', type: 'integer', default: 30 },
  { path: 'cache.stale_seconds', type: 'integer', default: 600 },
  { path: 'cache.redis', type: 'object' },
  ...redisKeys('cache.redis'),
  { path: 'metrics.path', type: 'string', default: '/metrics' },
  { path: 'metrics.port', type: 'integer' },
  { path: 'log.level', type: 'string', enum: ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'], default: 'info' },
  { path: 'log.time', type: 'string', enum: ['epoch_ms', 'iso'], default: 'epoch_ms' },
  { path: 'log.level_format', type: 'string', enum: ['number', 'label'], default: 'number' },
];

/** Every configuration key, in the README's order. */
export const CONFIG_KEYS: readonly ConfigKey[] = [
  ...SERVER,
  ...KEYS,
  { path: 'rate_limits_redis', type: 'object', readme: '`cache.redis`' },
  ...redisKeys('rate_limits_redis'),
  ...UPSTREAMS,
  ...REST,
];

/** Whether `key` applies to upstreams of `kind` (keys outside `upstreams` apply to all). */
export function appliesTo(key: ConfigKey, kind: UpstreamKind): boolean {
  if (!key.path.startsWith(`${U}.`)) return true;
  return (key.kinds ?? HTTP).includes(kind);
}

/**
 * The keys a mapping at `parent` (a table path, `''` for the top level) accepts: the validators'
 * unknown-key checks read them from here, so the validator cannot accept a key the table, the
 * schema and the README do not have.
 */
export function keysUnder(parent: string, kind?: UpstreamKind): string[] {
  const prefix = parent === '' ? '' : `${parent}.`;
  const names = new Set<string>();
  for (const key of CONFIG_KEYS) {
    if (!key.path.startsWith(prefix) || (kind !== undefined && !appliesTo(key, kind))) continue;
    const rest = key.path.slice(prefix.length);
    const name = /^[^.[]+/.exec(rest)?.[0];
    if (name !== undefined && !name.startsWith('<')) names.add(name);
  }
  return [...names];
}
