import { ENDPOINT_NAMES } from '../endpoints.js';
import { bool, int, list, map, num, obj, record, str, strList, type Infer } from './dsl.js';
import { NAME_PATTERN } from './schema-helpers.js';
import { UPSTREAM, UPSTREAM_NAME } from './schema-upstreams.js';

/**
 * The one definition of the configuration file: every key with its type, default, range or
 * choices and meaning. Validation (walk.ts), the types (types.ts), the editor schema
 * (config/perch.schema.json) and the configuration table of docs/configuration.md are derived
 * from it; the rules between keys are in rules.ts.
 */

const HOUR_MS = 3_600_000;
const ms = (fallback: number, doc: string, min = 1) => int({ min, max: HOUR_MS, default: fallback, doc });

const server = obj(
  {
    host: str({ default: '127.0.0.1', doc: 'address to bind; exposing perch is a deliberate choice' }),
    port: int({ min: 0, max: 65535, default: 8080, doc: 'TCP port, 0-65535 (0 picks a free port)' }),
    reuse_port: bool({
      default: false,
      doc: 'listen with SO_REUSEPORT, so that several perch processes on this host share the port and the kernel spreads connections over them (Linux); `perch --workers` sets it for its workers',
    }),
    shutdown_grace_ms: ms(10_000, 'on SIGTERM/SIGINT, how long in-flight requests may run before their connections are closed (0-3600000)', 0),
    headers_timeout_ms: ms(
      10_000,
      "bound on receiving a request's headers (slowloris defence), kept to within a second; past it 408 `E408`, or a silent close when nothing was received",
    ),
    request_timeout_ms: ms(30_000, 'bound on receiving a whole request; at least `headers_timeout_ms`'),
    miss_deadline_ms: ms(
      10_000,
      "bound on everything a miss waits for upstream: another instance's fetch of it, the call cap's queue, retries and their backoff, failover along the route (1-3600000)",
    ),
    keep_alive_timeout_ms: ms(5000, 'how long an idle keep-alive connection stays open'),
    max_header_bytes: int({
      min: 1024,
      max: 1_048_576,
      default: 16_384,
      doc: 'largest request head as it arrives (request line, every header line with its separators), 1024-1048576; larger is 431 `E431`',
    }),
    max_connections: int({
      min: 1,
      max: 1_000_000,
      default: 10_000,
      doc: 'connections open at once; at the cap a new one sheds the oldest connection that never sent a request, else the longest-idle keep-alive one (see [Limits and TLS](operations.md#limits-and-tls))',
    }),
    tls: obj(
      {
        cert_file: str({ required: true, readme: 'required with `tls`', doc: 'PEM certificate chain; with `key_file`, perch serves HTTPS (read at start-up, and by `--check-config`)' }),
        key_file: str({ required: true, readme: 'required with `tls`', doc: 'PEM private key of `cert_file` (read at start-up, and by `--check-config`)' }),
      },
      { doc: 'serve HTTPS with this certificate and key; absent: plain HTTP', expected: 'must be a mapping with cert_file and key_file' },
    ),
    rate_limit_headers: strList({
      enum: ['ietf', 'x_rate_limit'] as const,
      default: ['ietf'] as const,
      doc: "rate-limit header dialects on answers, at least one: `ietf` (`RateLimit`, `RateLimit-Policy`) and `x_rate_limit` (Twitter's `x-rate-limit-limit`, `-remaining`, `-reset`); see [Rate limits](rate-limits.md)",
    }),
  },
  { doc: 'the listener', section: true },
);

const keyId = (doc: string) => str({ required: true, doc });
const secretKeys = {
  key: str({ readme: '-', doc: 'the secret, at least 16 characters, normally `"${file:/run/secrets/...}"` or `"${ENV}"`; perch keeps only its SHA-256' }),
  sha256: str({ readme: '-', doc: 'instead of `key`: the hex SHA-256 of the secret (`printf %s "$KEY" \\| sha256sum`)' }),
};
const secret = {
  ...secretKeys,
  secrets: list(
    obj(
      {
        ...secretKeys,
        not_after: str({
          readme: '-',
          doc: 'an RFC 3339 time with its offset (`2026-12-31T00:00:00Z`); past it this secret is 401 and logged once (absent: no end)',
        }),
      },
      { doc: 'one secret of the key', expected: 'must be a mapping with key or sha256, and not_after' },
    ),
    {
      readme: '-',
      doc: 'instead of `key` or `sha256`: several secrets for this one id at once, each with `key` or `sha256` and an optional `not_after`, all of them the same id (a client key\'s one bucket, budget and metrics label), for a rotation with overlap (see [Rotating a key](configuration.md#rotating-a-key))',
    },
  ),
};
const ttl = (fallback: number, doc: string) => int({ min: 1, max: 86_400, default: fallback, doc });

const auth = obj(
  {
    mode: str({
      enum: ['keys', 'upstream'] as const,
      default: 'keys',
      doc: "who checks a client's `X-API-Key`: `keys` (perch, against `auth.keys`) or `upstream` (the provider; see [Pass-through auth](upstreams.md#pass-through-auth))",
    }),
    keys: list(
      obj(
        {
          id: keyId('name used in logs and metrics instead of the secret, `[A-Za-z0-9_.-]{1,64}`, unique'),
          ...secret,
          plan: str({ required: true, doc: 'name of an entry of `rate_limits`' }),
        },
        { doc: 'a client key', expected: 'must be a mapping with id, plan and key or sha256' },
      ),
      { readme: 'required with mode `keys`', doc: 'client keys, at least one; must be absent with mode `upstream`' },
    ),
    default_plan: str({ readme: 'required with mode `upstream`', doc: 'the `rate_limits` plan of every forwarded key (each key has its own bucket)' }),
    verify_ttl_seconds: ttl(
      300,
      "mode `upstream`: how long the provider's acceptance of a key lets the cache answer that key (1-86400); past it the key's next request is a real call",
    ),
    reject_ttl_seconds: ttl(60, 'mode `upstream`: how long a key the provider rejected is answered 401 without a call (1-86400)'),
    remembered_keys: int({
      min: 1,
      max: 10_000_000,
      default: 100_000,
      doc: 'mode `upstream`: verdicts kept of each kind, accepted and rejected apart, least recently used dropped first (1-10000000)',
    }),
    verify_rate_per_second: num({
      min: 0,
      max: Number.MAX_VALUE,
      aboveMin: true,
      default: 1,
      expected: 'a positive number',
      doc: 'mode `upstream`: provider calls per second, across every key the provider has not accepted yet and every instance sharing the Redis, that may verify a key; past it such a key is 429 without a call (positive number)',
    }),
    verify_burst: int({
      min: 1,
      max: 1_000_000,
      default: 20,
      doc: 'mode `upstream`: verifying calls allowed at once on top of `verify_rate_per_second` (1-1000000)',
    }),
    verify_source_share: num({
      min: 0,
      max: 1,
      aboveMin: true,
      default: 0.25,
      expected: 'a number above 0 and at most 1',
      doc: 'mode `upstream`: the share of `verify_rate_per_second` and `verify_burst` (at least one call) that the unknown keys of one client address (of one IPv6 /64) may take; 1 bounds no source apart, as behind a proxy that perch sees as one address (above 0, at most 1, and at least `1 / (999999999999999 * verify_rate_per_second)`, so that `Retry-After` stays an integer of 15 digits)',
    }),
    revalidate_rate_per_second: num({
      min: 0,
      max: Number.MAX_VALUE,
      aboveMin: true,
      default: 10,
      expected: 'a positive number',
      doc: 'mode `upstream`: provider calls per second, fleet-wide, that may verify keys the provider accepted lately (a stale acceptance renewed, another endpoint checked), apart from the unknown keys\' budget; one key takes at most one per endpoint each tenth of `verify_ttl_seconds` (positive number, at least `1 / 999999999999999`)',
    }),
    revalidate_burst: int({
      min: 1,
      max: 1_000_000,
      default: 100,
      doc: 'mode `upstream`: such calls allowed at once on top of `revalidate_rate_per_second` (1-1000000)',
    }),
  },
  { doc: 'who may call the API', required: true, missing: 'is required (auth.keys lists the client keys)' },
);

const admin = obj(
  {
    keys: list(
      obj(
        { id: keyId('name used in logs instead of the secret, `[A-Za-z0-9_.-]{1,64}`, unique among admin keys'), ...secret },
        { doc: 'an admin key', expected: 'must be a mapping with id and key or sha256' },
      ),
      {
        required: true,
        missing: 'is required (at least one key)',
        readme: 'required with `admin`',
        doc: 'admin keys, at least one; separate from `auth.keys` (a client key is 401 on the admin route, an admin key 401 on the API), and no secret may be in both lists',
      },
    ),
    status_page: bool({
      default: false,
      doc: 'serve the operator status page, `GET /status` and `GET /status.json` (see [Status page](observability.md#status-page)); `false`: both paths answer like any unknown route',
    }),
  },
  { readme: '-', doc: 'operator access to `POST /admin/purge` (see [Purging](caching.md#purging)) and the status page; absent: neither exists (404)' },
);

/** The largest integer a Structured Field carries (RFC 8941: 15 digits): the RateLimit fields' numbers. */
const MAX_FIELD_INTEGER = 999_999_999_999_999;

const SEE_SHARING = '(see [Sharing the provider](provider.md#sharing-the-provider))';

const plan = obj(
  {
    capacity: int({ min: 1, max: MAX_FIELD_INTEGER, required: true, doc: 'token-bucket size: requests allowed at once (positive integer of at most 15 digits: `RateLimit-Policy` and `x-rate-limit-limit` carry it)' }),
    refill_per_second: num({ min: 0, max: Number.MAX_VALUE, aboveMin: true, required: true, expected: 'a positive number', doc: 'tokens added per second (positive number, at least `capacity / 999990000000000`, so that `Retry-After`, `RateLimit` and `x-rate-limit-reset` stay integers of at most 15 digits)' }),
    cost_of_hit: int({ min: 0, max: 1, values: [0, 1], default: 1, expected: '0 or 1', doc: 'tokens a cache hit costs, `0` or `1` (see [Rate limits](rate-limits.md))' }),
    provider_weight: num({
      min: 0.001,
      max: 1000,
      default: 1,
      doc: `this plan's keys' share of an upstream's call cap while misses wait for it, 0.001-1000: a key of weight 3 gets three calls for one of a key of weight 1 ${SEE_SHARING}`,
    }),
    provider_calls: obj(
      {
        limit: int({
          min: 1,
          max: MAX_FIELD_INTEGER,
          required: true,
          readme: 'required with `provider_calls`',
          doc: `provider calls one key of the plan may make per calendar window, a positive integer of at most 15 digits (\`RateLimit-Policy\` carries it) ${SEE_SHARING}`,
        }),
        window: str({
          enum: ['hour', 'day', 'month'] as const,
          required: true,
          missing: 'is required (hour, day or month)',
          readme: 'required with `provider_calls`',
          doc: '`hour`, `day` or `month`, in UTC: the window ends at the next full hour, midnight or first of the month',
        }),
      },
      { doc: "a budget of provider calls per key; past it the key's misses get 429 until the window ends", expected: 'must be a mapping with limit and window' },
    ),
  },
  { doc: 'a plan: the token bucket and the share of the provider of the keys that name it', expected: 'must be a mapping with capacity and refill_per_second' },
);

/** A Redis section (`cache.redis`, `rate_limits_redis`): the same keys for both. */
const redis = (doc: string, prefixDoc: string, timeoutDoc: string, readme?: string) =>
  obj(
    {
      url: str({
        readme: '-',
        doc: 'a single node, `redis://[user:password@]host:port[/db]` (or `rediss://` for TLS); exactly one of `url`, `sentinels` or `cluster`. Percent-encode special characters in user and password',
      }),
      sentinels: strList({ doc: 'sentinel `host:port` list, with `name`' }),
      name: str({ readme: '-', doc: 'the master name the sentinels know' }),
      cluster: strList({
        doc: 'Redis Cluster seed URLs `redis://[user:password@]host:port` (or `rediss://`; every seed with the same scheme, user and password; database 0 only)',
      }),
      username: str({ readme: '-', doc: 'with `sentinels` only: ACL user for the master (with `url` and `cluster` it goes in the URLs)' }),
      password: str({ readme: '-', doc: 'with `sentinels` only: password for the master' }),
      sentinel_username: str({ readme: '-', doc: 'with `sentinels` only: ACL user of the sentinels themselves' }),
      sentinel_password: str({ readme: '-', doc: 'with `sentinels` only: password of the sentinels (their `requirepass`)' }),
      tls: bool({ readme: '`false`', doc: 'with `sentinels` only: TLS to the master' }),
      sentinel_tls: bool({ readme: '`false`', doc: 'with `sentinels` only: TLS to the sentinels' }),
      tls_ca_file: str({
        readme: '-',
        doc: "PEM file of the CAs trusted for this section's TLS connections, read at start-up; absent: Node's default CAs. Only with TLS",
      }),
      prefix: str({ default: 'perch:', doc: prefixDoc }),
      command_timeout_ms: int({ min: 1, max: 60_000, default: 50, doc: timeoutDoc }),
    },
    { doc, ...(readme === undefined ? { readme: '-' } : { readme }) },
  );

const TTL_DEFAULTS = { user: 300, user_by_username: 300, tweets: 60, replies: 60, following: 300, tweet: 600 } as const;
const ttlSeconds = (fallback: number, doc: string) => int({ min: 0, max: 604_800, default: fallback, doc });

const cache = obj(
  {
    memory: obj(
      {
        max_bytes: int({
          min: 1_048_576,
          default: 268_435_456,
          expected: 'an integer of at least 1048576 (1 MiB)',
          doc: "bound on what the in-process cache's entries are charged (bodies as stored, keys and per-entry overhead), at least 1 MiB; the memory the bodies hold is at most twice it after the traffic's entry sizes change (see [Caching](caching.md#the-memory-tier))",
        }),
      },
      { doc: 'the in-process tier', section: true },
    ),
    redis: redis(
      'the shared second cache tier; absent: memory only',
      'prefix of every key perch writes, so deployments can share a Redis',
      'bound on one Redis command, 1-60000; past it the command counts as failed (a miss)',
    ),
    ttl_seconds: obj(
      {
        ...Object.fromEntries(
          ENDPOINT_NAMES.map((endpoint) => [endpoint, ttlSeconds(TTL_DEFAULTS[endpoint], `freshness of \`${endpoint}\` in whole seconds, 0-604800; 0 disables caching it`)]),
        ),
        not_found: ttlSeconds(30, 'how long an upstream 404 is cached, 0-604800'),
      } as Record<(typeof ENDPOINT_NAMES)[number] | 'not_found', ReturnType<typeof ttlSeconds>>,
      { doc: 'freshness per endpoint', section: true, unknown: `keys are ${[...ENDPOINT_NAMES, 'not_found'].join(', ')}` },
    ),
    compression: obj(
      {
        brotli: bool({ default: true, doc: 'keep a brotli variant (quality 4) of each stored body, for clients whose `Accept-Encoding` takes `br`' }),
        gzip: bool({ default: true, doc: 'keep a gzip variant (level 6) of each stored body, for clients whose `Accept-Encoding` takes `gzip`' }),
        min_bytes: int({
          min: 0,
          max: 1_073_741_824,
          default: 1024,
          doc: 'smallest body compressed, in bytes; smaller bodies are stored and sent as they are (see [Compression and revalidation](caching.md#compression-and-revalidation))',
        }),
      },
      {
        doc: 'compressed variants, made once when an entry is stored and never on a hit; `brotli: false` and `gzip: false` turn compression off',
        section: true,
      },
    ),
    stale_seconds: int({
      min: 0,
      max: 86_400,
      default: 600,
      doc: 'how long past its TTL an entry is kept and served stale (see [Stale serving](caching.md#stale-serving)), integer 0-86400; 0 disables stale serving',
    }),
  },
  { doc: 'the two cache tiers', section: true },
);

const metrics = obj(
  {
    path: str({ default: '/metrics', doc: 'path of the Prometheus endpoint' }),
    port: int({
      min: 0,
      max: 65535,
      readme: '-',
      doc: 'serve metrics only on their own plain-HTTP listener on this port (`server.host`), not on the API listener',
    }),
    require_admin: bool({
      default: false,
      doc: 'answer metrics only to a scraper presenting an `admin.keys` key, as `Authorization: Bearer <key>` (Prometheus\'s `authorization`) or `X-API-Key`; other requests are 401 (see [Metrics](observability.md#metrics))',
    }),
  },
  { doc: 'the Prometheus endpoint', section: true },
);

const log = obj(
  {
    level: str({ enum: ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const, default: 'info', doc: 'pino level: fatal, error, warn, info, debug, trace, silent' }),
    time: str({
      enum: ['epoch_ms', 'iso'] as const,
      default: 'epoch_ms',
      doc: 'the `time` field: `epoch_ms` (milliseconds since the epoch, a number) or `iso` (ISO-8601 UTC, `"2026-01-01T12:00:00.000Z"`); see [Logs](observability.md#logs)',
    }),
    level_format: str({ enum: ['number', 'label'] as const, default: 'number', doc: 'the `level` field: `number` (`30`) or `label` (`"info"`); see [Logs](observability.md#logs)' }),
  },
  { doc: 'the JSON log', section: true },
);

const tracing = obj(
  {
    endpoint: str({
      required: true,
      readme: 'required with `tracing`',
      doc: "the OTLP/HTTP collector's base URL, as in `OTEL_EXPORTER_OTLP_ENDPOINT` (e.g. `http://otel-collector:4318`): spans are posted, protobuf-encoded, to `<endpoint>/v1/traces`",
    }),
    headers: map({ readme: '`{}`', doc: 'headers sent with every export, e.g. `{ Authorization: "Bearer ${OTLP_TOKEN}" }`; values never appear in logs' }),
    sample_ratio: num({
      min: 0,
      max: 1,
      default: 1,
      doc: 'share of new traces recorded, 0-1; a request that arrives with a `traceparent` follows its caller\'s decision (see [Tracing](observability.md#tracing))',
    }),
    service_name: str({ default: 'perch', doc: 'the `service.name` of every span' }),
    client_tracestate: bool({
      default: false,
      doc: "keep an accepted caller's `tracestate` in its trace, and so send it to every upstream with `propagate_trace`; `false`: dropped, so nothing of the client's request reaches a provider (see [Tracing](observability.md#tracing))",
    }),
  },
  {
    doc: 'export spans over OTLP/HTTP (see [Tracing](observability.md#tracing)); absent: tracing is off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set',
    expected: 'must be a mapping with endpoint',
  },
);

export const CONFIG = obj(
  {
    server,
    auth,
    admin,
    rate_limits: record(plan, {
      placeholder: '<plan>',
      pattern: { test: NAME_PATTERN, message: 'plan name must match [A-Za-z0-9_.-]{1,64}' },
      required: true,
      missing: 'is required (at least one plan)',
      expected: 'must be a mapping of plan name to limits',
      empty: 'must define at least one plan',
      doc: 'rate-limit plans by name',
    }),
    rate_limits_redis: redis(
      'the Redis holding the token buckets and the provider guard\'s stops and call caps, shared by every instance; with neither section they are per instance, in memory',
      "key prefix; a key's bucket is `<prefix>rl:<key id>`",
      "bound on one Redis command, 1-60000; past it the instance's own buckets decide",
      '`cache.redis`',
    ),
    upstreams: record(UPSTREAM, {
      placeholder: '<name>',
      pattern: UPSTREAM_NAME,
      required: true,
      missing: 'is required (at least one upstream)',
      expected: 'must be a mapping of upstream name to settings',
      empty: 'must define at least one upstream',
      doc: 'the providers by name',
    }),
    routes: record(strList({ of: 'upstream names', item: 'must be a string (an upstream name)', readme: 'the first upstream', doc: 'ordered upstream names to try for that endpoint' }), {
      placeholder: '<endpoint>',
      keys: ENDPOINT_NAMES,
      unknown: `endpoints are ${ENDPOINT_NAMES.join(', ')}`,
      section: true,
      doc: 'which upstreams serve each endpoint',
    }),
    cache,
    metrics,
    log,
    tracing,
  },
  { doc: 'perch configuration' },
);

/** The file as the definition describes it, defaults applied, before the rules resolve it. */
export type FileConfig = Infer<typeof CONFIG>;
export type ServerConfig = Infer<typeof server>;
export type RateLimitPlan = Infer<typeof plan>;
export type CacheConfig = Infer<typeof cache>;
export type RedisConfig = Infer<ReturnType<typeof redis>>;
export type MetricsConfig = Infer<typeof metrics>;
export type LogConfig = Infer<typeof log>;
export type TracingConfig = Infer<typeof tracing>;
export type TlsConfig = NonNullable<ServerConfig['tls']>;
export type RateLimitHeaderDialect = ServerConfig['rate_limit_headers'][number];
export type MemoryCacheConfig = CacheConfig['memory'];
export type CompressionConfig = CacheConfig['compression'];
export type ProviderCallBudget = NonNullable<RateLimitPlan['provider_calls']>;
