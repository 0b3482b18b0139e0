import { bool, int, kinds, list, map, num, obj, str, type Infer } from './dsl.js';
import { UPSTREAM_NAME_PATTERN } from './schema-helpers.js';

/**
 * The definition of `upstreams.<name>`: one branch of keys per kind. The keys that protect the
 * provider and the connection keys are shared by both HTTP kinds; `fixture` takes only `kind`.
 */

const SEE_PROTECTING = '(see [Protecting the provider](provider.md#protecting-the-provider))';
const SEE_BREAKERS = '(see [Breakers and retries](upstreams.md#breakers-and-retries))';

const quota = obj(
  {
    requests: int({ min: 1, max: 100_000_000, required: true, readme: 'required with `quota`', doc: 'calls allowed per window, 1-100000000' }),
    per_seconds: int({ min: 1, max: 31 * 86_400, required: true, readme: 'required with `quota`', doc: 'the window in whole seconds (900 for 15 minutes, 86400 for a day), 1-2678400' }),
  },
  {
    doc: 'a longer window the provider sells, e.g. `{ requests: 900, per_seconds: 900 }`: never more calls in any such window (sliding)',
    expected: 'must be a mapping with requests and per_seconds',
  },
);

const breaker = obj(
  {
    consecutive_failures: int({ min: 1, max: 10_000, default: 20, doc: 'failed requests in a row that open the breaker, 1-10000' }),
    failure_ratio: num({
      min: 0.01,
      max: 1,
      default: 0.9,
      doc: "share of failed requests over `window_ms` that opens it, 0.01-1 (1: never on the ratio); near 1 so that only a provider failing (nearly) every call opens it: partial failure is the throttle's",
    }),
    window_ms: int({ min: 100, max: 3_600_000, default: 10_000, doc: 'the window of `failure_ratio`, 100-3600000' }),
    min_calls: int({ min: 1, max: 1_000_000, default: 20, doc: 'requests the window must hold before the ratio counts, 1-1000000' }),
    half_open_after_ms: int({ min: 1, max: 3_600_000, default: 1000, doc: 'how long it stays open before the first probe goes through, 1-3600000' }),
    half_open_max_ms: int({
      min: 1,
      max: 3_600_000,
      default: 4000,
      doc: 'each failed probe doubles the wait before the next, up to this, 1-3600000, at least `half_open_after_ms` (default: the larger of 4000 and `half_open_after_ms`)',
    }),
  },
  { doc: `the breaker, for a provider that is down or hanging ${SEE_BREAKERS}`, section: true },
);

const throttle = obj(
  {
    enabled: bool({ default: true, doc: `the adaptive throttle ${SEE_BREAKERS}; \`false\` turns it off` }),
    k: num({
      min: 1,
      max: 100,
      default: 2,
      doc: 'how many calls per accepted one the provider may see before the throttle sheds, 1-100: a provider answering at least `1/k` of its calls is never throttled',
    }),
    window_ms: int({ min: 100, max: 3_600_000, default: 10_000, doc: 'the window the throttle counts over, 100-3600000' }),
    min_calls: int({ min: 1, max: 1_000_000, default: 20, doc: 'answered calls the window must hold before anything is shed, 1-1000000' }),
  },
  { doc: 'adaptive throttling (Google SRE book, "Handling Overload"), for a provider that fails part of its calls', section: true },
);

const batch = obj(
  {
    enabled: bool({ default: true, doc: 'send the misses of `user`, `user_by_username` and `tweet` that wait for X at the same time as one batch lookup (`/2/users?ids=`, `/2/users/by?usernames=`, `/2/tweets?ids=`); `false`: one call per miss' }),
    max_items: int({ min: 1, max: 100, default: 100, doc: 'items in one batch call, 1-100 (X takes at most 100)' }),
    window_ms: int({
      min: 0,
      max: 50,
      default: 0,
      doc: 'how long a miss that finds no call to share waits for company, 0-50; 0: it goes at the end of the current tick, as without batching (misses waiting under the cap share calls whatever this says)',
    }),
  },
  { doc: 'batch lookups (see [Batch lookups](upstreams.md#batch-lookups))', section: true },
);

const cooldownScope = (fallback: 'upstream' | 'endpoint', doc: string, readme?: string) =>
  str({ enum: ['upstream', 'endpoint'] as const, default: fallback, expected: '"upstream" or "endpoint"', doc, ...(readme === undefined ? {} : { readme }) });

/** The keys of both HTTP kinds but the credentials, the URL and `cooldown_scope`. */
const HTTP = {
  max_requests_per_second: num({
    min: 0.001,
    max: 1_000_000,
    readme: '-',
    doc: "perch's cap on its own calls to this upstream, fleet-wide: never more in any one-second window, 0.001-1000000 (under 1/s: one call per `1/rate` seconds); absent: no rate cap",
  }),
  burst: int({ min: 1, max: 1_000_000, readme: '`ceil(max_requests_per_second)`', doc: 'calls that may start at once from an idle cap (token bucket); while calls wait for the one-second window it saves only the next, so a saturated cap sends them a refill apart; needs `max_requests_per_second`' }),
  max_concurrent: int({ min: 1, max: 100_000, readme: '-', doc: 'calls in flight at once, fleet-wide, 1-100000' }),
  quota,
  queue_timeout_ms: int({
    min: 0,
    max: 600_000,
    default: 1000,
    doc: "how long a miss over the cap waits in this instance's FIFO before it gets the stale entry or `429 E429` with `Retry-After`, 0-600000",
  }),
  queue_size: int({ min: 0, max: 1_000_000, default: 1000, doc: 'misses that may wait in that FIFO at once; more are refused at once, 0-1000000 (an x_v2 upstream\'s batch lookups let as many more wait for a seat, see [Batch lookups](upstreams.md#batch-lookups))' }),
  redis_down_share: num({
    min: 0.001,
    max: 1,
    default: 1,
    doc: "while the shared Redis is unreachable, the fraction of every cap each instance keeps on its own, and of each key's `provider_calls` budget it may charge for calls to this upstream, 0.001-1: set it to 1 / the number of instances (left at 1 with a Redis on a capped upstream, or on any upstream when a plan has `provider_calls`, start-up logs a warning naming the upstream)",
  }),
  rate_limit_reserve: int({
    min: 0,
    max: 1_000_000,
    default: 0,
    doc: 'stop calling a credential when the provider reports this many calls left in its window (`x-rate-limit-remaining` or IETF `RateLimit`), until the window resets',
  }),
  credential_recheck_seconds: int({
    min: 1,
    max: 3600,
    default: 300,
    doc: 'how long a credential the provider answered 401/403 stays out before one real call tries it again, 1-3600: any answer but 401/403 restores it, another 401/403 doubles the wait, up to an hour; one instance of a fleet rechecks at a time; a reload restores at once',
  }),
  usage_cap_seconds: int({
    min: 1,
    max: 31 * 86_400,
    default: 86_400,
    doc: 'how long a credential stays out after the provider says its usage cap is spent (X: a 429 with problem type `.../usage-capped`), 1-2678400',
  }),
  timeout_ms: int({ min: 1, max: 600_000, default: 5000, doc: 'bound on one whole exchange (connect, headers and body), 1-600000' }),
  connections: int({ min: 1, max: 1024, default: 64, doc: 'keep-alive connections in the undici pool, 1-1024' }),
  max_body_bytes: int({ min: 1024, max: 1_073_741_824, default: 8_388_608, doc: 'largest upstream body accepted, as received and once a gzip, br or deflate `Content-Encoding` is undone; larger is 502' }),
  retry_after_default_seconds: int({
    min: 1,
    max: 86_400,
    default: 60,
    doc: 'how long an upstream 429 (or 503) that gives neither `Retry-After` nor `x-rate-limit-reset` stops calls, 1-86400',
  }),
  price_per_call: num({
    min: 0,
    max: 1_000_000_000,
    readme: '-',
    doc: "what one call to this upstream costs, a number from 0: each key's calls are then also summed as `perch_key_upstream_spend_total` (see [Sharing the provider](provider.md#sharing-the-provider))",
  }),
  retries: int({
    min: 0,
    max: 10,
    default: 0,
    doc: `extra attempts on the same upstream after a connection error, timeout, 502, 503 (without \`Retry-After\`) or 504, 0-10 ${SEE_BREAKERS}`,
  }),
  retry_budget_percent: num({ min: 0, max: 100, default: 20, doc: 'retries allowed as a percentage of the requests to this upstream over the last 10 s, 0-100' }),
  retry_budget_min_per_second: num({
    min: 0,
    max: 10_000,
    default: 1,
    doc: 'retries always allowed per second whatever the percentage says (10 per 10 s window by default), 0-10000',
  }),
  retry_backoff_ms: int({ min: 1, max: 60_000, default: 50, doc: 'first backoff before a retry, 1-60000; each later one may be twice as long, with full jitter' }),
  retry_backoff_max_ms: int({ min: 1, max: 600_000, default: 1000, doc: 'longest backoff before a retry, at least `retry_backoff_ms`' }),
  breaker,
  throttle,
} as const;

const credentialId = str({ required: true, doc: 'name in logs and metrics instead of the secret, `[A-Za-z0-9_.-]{1,64}`, unique per upstream' });

const v1 = obj(
  {
    kind: str({ enum: ['v1'] as const, required: true, doc: 'an HTTP provider speaking this interface' }),
    url: str({ required: true, doc: 'provider origin, `http:` or `https:`, no path or credentials' }),
    headers: map({
      readme: '`{}`',
      doc: 'headers added to every upstream request, e.g. `{ X-API-Key: "${UPSTREAM_KEY}" }`: shorthand for one credential with id `default`; not together with `credentials`',
    }),
    credentials: list(
      obj(
        {
          id: credentialId,
          headers: map({ required: true, doc: 'headers sent with every call on this credential, e.g. `{ X-API-Key: "${KEY_1}" }`; values never appear in logs or metrics' }),
        },
        { doc: 'one credential', expected: 'must be a mapping with id and headers' },
      ),
      { readme: 'one `default` credential', doc: `the provider credentials calls rotate over ${SEE_PROTECTING}`, expected: 'must be a non-empty list of { id, headers }' },
    ),
    cooldown_scope: cooldownScope(
      'upstream',
      'what a 429 stops: the credential on every endpoint (`upstream`), or only on the endpoint that drew it (`endpoint`, for per-endpoint limits such as X\'s)',
    ),
    propagate_trace: bool({ default: true, doc: 'send `traceparent` and `tracestate` with each call, so the provider\'s own spans join the trace (see [Tracing](observability.md#tracing))' }),
    ...HTTP,
  },
  {
    doc: 'an HTTP provider that speaks this same interface',
    foreign: { batch: 'batch lookups are the X API v2\'s (/2/users?ids=, /2/tweets?ids=): only an x_v2 upstream takes batch' },
  },
);

const xV2 = obj(
  {
    kind: str({ enum: ['x_v2'] as const, required: true, doc: 'the X API v2, see [In front of the X API v2](upstreams.md#in-front-of-the-x-api-v2)' }),
    url: str({ default: 'https://api.twitter.com', doc: "X's origin; tests point it at a local stand-in" }),
    bearer_token: str({
      readme: '-',
      doc: "instead of `headers`: the X app's bearer token (`\"${X_BEARER_TOKEN}\"`), sent as `Authorization: Bearer`, never logged; shorthand for one credential `default`",
    }),
    credentials: list(
      obj(
        { id: credentialId, bearer_token: str({ required: true, doc: 'that token, sent as `Authorization: Bearer`, never logged' }) },
        {
          doc: 'one X app token',
          expected: 'must be a mapping with id and bearer_token',
          // The generic `{ id, headers }` form of v1 is refused with what to write instead.
          unknown: 'an x_v2 credential is { id, bearer_token }: give the token as bearer_token, perch sends it as Authorization: Bearer',
        },
      ),
      {
        readme: 'required with `x_v2` unless `bearer_token` or `auth.mode: upstream`',
        doc: '`{ id, bearer_token }` per X app token; calls rotate over them, and a spent one (429, usage cap) stops alone',
        expected: 'must be a non-empty list of { id, bearer_token }',
      },
    ),
    forbidden_retry_seconds: int({
      min: 1,
      max: 86_400,
      default: 3600,
      doc: "how long perch stops asking X for an endpoint with a token X answered 403 for it (an endpoint outside the app's plan), 1-86400; logged once; other endpoints and other tokens go on",
    }),
    cooldown_scope: cooldownScope(
      'endpoint',
      "what an X 429 stops: that credential's calls to that endpoint, since X's windows are per endpoint and per token (`upstream`: all its endpoints)",
    ),
    batch,
    propagate_trace: bool({ default: false, doc: 'send `traceparent` and `tracestate` to X; off by default, so perch never hands its trace ids to a third party unless asked (see [Tracing](observability.md#tracing))' }),
    ...HTTP,
  },
  { doc: 'the X API v2 behind the interface' },
);

const fixture = obj(
  { kind: str({ enum: ['fixture'] as const, required: true, doc: 'built-in synthetic data' }) },
  { doc: 'the built-in synthetic data source; needs no network', unknown: 'a fixture upstream takes no other keys' },
);

export const UPSTREAM = kinds(
  { v1, x_v2: xV2, fixture },
  { doc: 'an upstream; the name matches `[A-Za-z][A-Za-z0-9_.-]{0,63}`', expected: 'must be a mapping (with at least `kind`)' },
);

export const UPSTREAM_NAME = { test: UPSTREAM_NAME_PATTERN, message: 'upstream name must match [A-Za-z][A-Za-z0-9_.-]{0,63}' };

/** One provider credential: headers sent with every call made on it. */
export interface CredentialConfig {
  readonly id: string;
  readonly headers: Readonly<Record<string, string>>;
}

type FileUpstream = Infer<typeof UPSTREAM>;
/** The shorthands (`headers`, `bearer_token`) resolved into `credentials` (rules-upstreams.ts). */
type Resolved<U> = Omit<U, 'headers' | 'bearer_token' | 'credentials'> & { readonly credentials: readonly CredentialConfig[] };

export type V1UpstreamConfig = Resolved<Extract<FileUpstream, { kind: 'v1' }>>;
export type XV2UpstreamConfig = Resolved<Extract<FileUpstream, { kind: 'x_v2' }>>;
export type FixtureUpstreamConfig = Extract<FileUpstream, { kind: 'fixture' }>;
export type UpstreamConfig = V1UpstreamConfig | XV2UpstreamConfig | FixtureUpstreamConfig;
/** How perch protects a provider account: the keys both HTTP kinds share but the connection's. */
export type ProviderProtectionConfig = Omit<
  V1UpstreamConfig,
  'kind' | 'url' | 'credentials' | 'timeout_ms' | 'connections' | 'max_body_bytes' | 'retry_after_default_seconds' | 'propagate_trace'
>;
export type QuotaConfig = Infer<typeof quota>;
export type BreakerConfig = Infer<typeof breaker>;
export type ThrottleConfig = Infer<typeof throttle>;
export type BatchConfig = Infer<typeof batch>;
