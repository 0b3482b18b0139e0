import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { stringify } from 'yaml';
import { ConfigError, loadConfigFile, parseConfig } from '../src/config/load.js';

/** The provider-protection defaults every v1 upstream gets. */
const PROTECTION_DEFAULTS = {
    queue_timeout_ms: 1000,
    queue_size: 1000,
    redis_down_share: 1,
    rate_limit_reserve: 0,
    cooldown_scope: 'upstream',
    usage_cap_seconds: 86400,
    credential_recheck_seconds: 300,
    retries: 0,
    retry_budget_percent: 20,
    retry_budget_min_per_second: 1,
    retry_backoff_ms: 50,
    retry_backoff_max_ms: 1000,
    breaker: { consecutive_failures: 20, failure_ratio: 0.9, window_ms: 10000, min_calls: 20, half_open_after_ms: 1000, half_open_max_ms: 4000 },
    throttle: { enabled: true, k: 2, window_ms: 10000, min_calls: 20 },
};

const ALPHA_SECRET = 'alpha-secret-0123456789';
const ALPHA_DIGEST = createHash('sha256').update(ALPHA_SECRET).digest('hex');
const OTHER_DIGEST = 'ab'.repeat(32);
const FULL_FIXTURE = fileURLToPath(new URL('../../test/fixtures/config/full.yaml', import.meta.url));

const MINIMAL = `
auth:
  keys:
    - { id: alpha, sha256: ${ALPHA_DIGEST}, plan: small }
rate_limits:
  small: { capacity: 5, refill_per_second: 1 }
upstreams:
  demo: { kind: fixture }
`;

interface Raw {
  [key: string]: any;
}

/** A valid configuration as a plain tree, for tests that break one thing in it. */
function base(): Raw {
  return {
    auth: { keys: [{ id: 'alpha', sha256: ALPHA_DIGEST, plan: 'small' }] },
    rate_limits: { small: { capacity: 5, refill_per_second: 1 } },
    upstreams: { main: { kind: 'v1', url: 'https://provider.example' }, demo: { kind: 'fixture' } },
  };
}

function configError(load: () => unknown): ConfigError {
  try {
    load();
  } catch (error) {
    assert.ok(error instanceof ConfigError, `expected ConfigError, got ${String(error)}`);
    return error;
  }
  assert.fail('expected the configuration to be rejected');
}

function problemsOf(yamlText: string, env: NodeJS.ProcessEnv = {}): readonly string[] {
  return configError(() => parseConfig(yamlText, env)).problems;
}

/** Applies `mutate` to the valid base tree and returns the problems of the result. */
function problemsAfter(mutate: (raw: Raw) => void): readonly string[] {
  const raw = base();
  mutate(raw);
  return problemsOf(stringify(raw));
}

function assertProblem(mutate: (raw: Raw) => void, expected: string): void {
  assert.deepEqual(problemsAfter(mutate), [expected]);
}

describe('parseConfig: defaults and valid files', () => {
  it('fills every default into a minimal configuration', () => {
    assert.deepEqual(parseConfig(MINIMAL, {}), {
      server: {
        host: '127.0.0.1',
        port: 8080,
        reuse_port: false,
        shutdown_grace_ms: 10000,
        headers_timeout_ms: 10000,
        request_timeout_ms: 30000,
        keep_alive_timeout_ms: 5000,
        max_header_bytes: 16384,
        max_connections: 10000,
        miss_deadline_ms: 10000,
        rate_limit_headers: ['ietf'],
      },
      auth: { mode: 'keys', keys: [{ id: 'alpha', plan: 'small', secrets: [{ sha256: ALPHA_DIGEST }] }], verify_ttl_seconds: 300, reject_ttl_seconds: 60, remembered_keys: 100000, verify_rate_per_second: 1, verify_burst: 20, verify_source_share: 0.25, revalidate_rate_per_second: 10, revalidate_burst: 100 },
      rate_limits: { small: { capacity: 5, refill_per_second: 1, cost_of_hit: 1, provider_weight: 1 } },
      upstreams: { demo: { kind: 'fixture' } },
      routes: {
        user: ['demo'],
        user_by_username: ['demo'],
        tweets: ['demo'],
        replies: ['demo'],
        following: ['demo'],
        tweet: ['demo'],
      },
      cache: {
        memory: { max_bytes: 268435456 },
        ttl_seconds: { user: 300, user_by_username: 300, tweets: 60, replies: 60, following: 300, tweet: 600, not_found: 30 },
        compression: { brotli: true, gzip: true, min_bytes: 1024 },
        stale_seconds: 600,
      },
      metrics: { path: '/metrics', require_admin: false },
      log: { level: 'info', time: 'epoch_ms', level_format: 'number' },
    });
  });

  it('applies v1 upstream defaults', () => {
    const config = parseConfig(stringify(base()), {});
    assert.deepEqual(config.upstreams.main, {
      kind: 'v1',
      url: 'https://provider.example',
      credentials: [{ id: 'default', headers: {} }],
      timeout_ms: 5000,
      connections: 64,
      max_body_bytes: 8388608,
      retry_after_default_seconds: 60,
      propagate_trace: true,
      ...PROTECTION_DEFAULTS,
    });
  });

  it('reads credentials, the call cap and its burst default', () => {
    const raw = base();
    raw.upstreams.main.credentials = [
      { id: 'one', headers: { 'X-Key': 'k1' } },
      { id: 'two', headers: { 'X-Key': 'k2' } },
    ];
    raw.upstreams.main.max_requests_per_second = 2.5;
    raw.upstreams.main.quota = { requests: 900, per_seconds: 900 };
    const main = parseConfig(stringify(raw), {}).upstreams.main;
    assert.ok(main?.kind === 'v1');
    assert.deepEqual(main.credentials.map((c) => c.id), ['one', 'two']);
    assert.deepEqual([main.max_requests_per_second, main.burst, main.quota], [2.5, 3, { requests: 900, per_seconds: 900 }]);
    assert.equal(main.max_concurrent, undefined);
  });

  it('loads the full example file', () => {
    const config = loadConfigFile(FULL_FIXTURE, { ALPHA_KEY: ALPHA_SECRET, UPSTREAM_KEY: 'provider-key' });
    assert.deepEqual(config.auth.keys, [
      { id: 'alpha', plan: 'small', secrets: [{ sha256: ALPHA_DIGEST }] },
      { id: 'beta', plan: 'small', secrets: [{ sha256: createHash('sha256').update('test').digest('hex') }] },
    ]);
    assert.deepEqual(config.upstreams.main, {
      kind: 'v1',
      url: 'https://provider.example',
      credentials: [{ id: 'default', headers: { 'X-API-Key': 'provider-key' } }],
      timeout_ms: 5000,
      connections: 64,
      max_body_bytes: 8388608,
      retry_after_default_seconds: 60,
      propagate_trace: true,
      ...PROTECTION_DEFAULTS,
    });
    assert.deepEqual(config.routes.tweet, ['main']);
    assert.deepEqual(config.routes.user, ['main']);
    assert.equal(config.cache.ttl_seconds.not_found, 30);
  });

  it('accepts cost_of_hit 0 on a plan', () => {
    const config = parseConfig(MINIMAL.replace('refill_per_second: 1 }', 'refill_per_second: 1, cost_of_hit: 0 }'), {});
    assert.equal(config.rate_limits.small!.cost_of_hit, 0);
  });

  it('merges a partial ttl_seconds map with the defaults', () => {
    const config = parseConfig(`${MINIMAL}cache: { ttl_seconds: { tweet: 0 } }\n`, {});
    assert.equal(config.cache.ttl_seconds.tweet, 0);
    assert.equal(config.cache.ttl_seconds.user, 300);
  });

  it('routes unlisted endpoints to the first upstream in file order', () => {
    const raw = base();
    raw.routes = { tweet: ['demo', 'main'] };
    const config = parseConfig(stringify(raw), {});
    assert.deepEqual(config.routes.tweet, ['demo', 'main']);
    assert.deepEqual(config.routes.user, ['main']);
    assert.deepEqual(config.routes.following, ['main']);
  });

  it('hashes a literal key and does not keep it', () => {
    const raw = base();
    raw.auth.keys[0] = { id: 'alpha', key: ALPHA_SECRET, plan: 'small' };
    const config = parseConfig(stringify(raw), {});
    const key = config.auth.keys[0];
    assert.equal(key?.secrets[0]?.sha256, ALPHA_DIGEST);
    assert.equal(Object.hasOwn(key ?? {}, 'key'), false);
    assert.equal(JSON.stringify(config).includes(ALPHA_SECRET), false);
  });

  it('lowercases a sha256 digest', () => {
    const raw = base();
    raw.auth.keys[0].sha256 = ALPHA_DIGEST.toUpperCase();
    assert.equal(parseConfig(stringify(raw), {}).auth.keys[0]?.secrets[0]?.sha256, ALPHA_DIGEST);
  });

  it('reduces an upstream url to its origin', () => {
    const raw = base();
    raw.upstreams.main.url = 'HTTPS://Provider.Example:443/';
    const main = parseConfig(stringify(raw), {}).upstreams.main;
    assert.ok(main?.kind === 'v1');
    assert.equal(main.url, 'https://provider.example');
  });

  it('returns a deeply frozen object', () => {
    const raw = base();
    raw.upstreams.main.headers = { 'X-API-Key': 'provider-key' };
    const config = parseConfig(stringify(raw), {}) as any;
    assert.throws(() => {
      config.server.port = 1;
    }, TypeError);
    assert.throws(() => {
      config.upstreams.main.credentials[0].headers['X-Other'] = 'x';
    }, TypeError);
    assert.throws(() => config.routes.tweet.push('demo'), TypeError);
    assert.throws(() => {
      config.auth.keys[0].plan = 'other';
    }, TypeError);
  });
});

describe('parseConfig: environment substitution', () => {
  const withEnvKey = MINIMAL.replace(`sha256: ${ALPHA_DIGEST}`, 'key: "${ALPHA_KEY}"');

  it('substitutes a set variable', () => {
    assert.equal(parseConfig(withEnvKey, { ALPHA_KEY: ALPHA_SECRET }).auth.keys[0]?.secrets[0]?.sha256, ALPHA_DIGEST);
  });

  it('reports an unset variable, and nothing else about that value', () => {
    assert.deepEqual(problemsOf(withEnvKey), ['auth.keys[0].key: environment variable ALPHA_KEY is not set']);
  });

  it('uses the default when the variable is unset or empty, and coerces numeric strings', () => {
    const text = `${MINIMAL}server: { host: "\${HOST:-0.0.0.0}", port: "\${PORT:-9090}" }\n`;
    assert.deepEqual(parseConfig(text, {}).server, { ...parseConfig(MINIMAL, {}).server, host: '0.0.0.0', port: 9090 });
    assert.deepEqual(parseConfig(text, { HOST: '', PORT: '7070' }).server, { ...parseConfig(MINIMAL, {}).server, host: '0.0.0.0', port: 7070 });
  });

  it('rejects a substituted string that is not a plain decimal number', () => {
    assert.deepEqual(problemsOf(`${MINIMAL}server: { port: "\${PORT}" }\n`, { PORT: '80a' }), [
      'server.port: must be an integer from 0 to 65535',
    ]);
  });

  it('turns $${ into a literal ${ and does not rescan substituted values', () => {
    const text = `${MINIMAL}server: { host: "a$\${B}-\${C}" }\n`;
    assert.equal(parseConfig(text, { C: '${D}' }).server.host, 'a${B}-${D}');
  });

  it('never lets a value inject YAML', () => {
    const text = `${MINIMAL}server: { host: "\${HOST}" }\n`;
    assert.equal(parseConfig(text, { HOST: 'x\nport: 1' }).server.host, 'x\nport: 1');
  });

  it('reports malformed references', () => {
    assert.deepEqual(problemsOf(`${MINIMAL}server: { host: "\${1X}" }\n`), [
      'server.host: invalid variable reference (expected ${NAME}, ${NAME:-default} or ${file:/path})',
    ]);
    assert.deepEqual(problemsOf(`${MINIMAL}server: { host: "\${X" }\n`), [
      'server.host: unterminated "${" (write "$${" for a literal "${")',
    ]);
  });
});

describe('parseConfig: checks', () => {
  const cases: [string, (raw: Raw) => void, string][] = [
    ['empty host', (r) => (r.server = { host: '' }), 'server.host: must not be empty'],
    ['port out of range', (r) => (r.server = { port: 70000 }), 'server.port: must be an integer from 0 to 65535'],
    ['fractional port', (r) => (r.server = { port: 80.5 }), 'server.port: must be an integer from 0 to 65535'],
    ['server not a mapping', (r) => (r.server = 'localhost'), 'server: must be a mapping'],
    ['missing auth', (r) => delete r.auth, 'auth: is required (auth.keys lists the client keys)'],
    ['empty key list', (r) => (r.auth.keys = []), 'auth.keys: must be a non-empty list'],
    ['bad key id', (r) => (r.auth.keys[0].id = 'has space'), 'auth.keys[0].id: must match [A-Za-z0-9_.-]{1,64}'],
    [
      'duplicate key id',
      (r) => r.auth.keys.push({ id: 'alpha', sha256: OTHER_DIGEST, plan: 'small' }),
      'auth.keys[1].id: repeats the id of auth.keys[0] ("alpha")',
    ],
    ['key and sha256', (r) => (r.auth.keys[0].key = ALPHA_SECRET), 'auth.keys[0]: set either key or sha256, not both'],
    ['neither key nor sha256', (r) => delete r.auth.keys[0].sha256, 'auth.keys[0]: needs key, sha256 or secrets'],
    [
      'short key',
      (r) => (r.auth.keys[0] = { id: 'alpha', key: 'short', plan: 'small' }),
      'auth.keys[0].key: must be at least 16 characters (a shorter secret is guessable)',
    ],
    ['non-hex digest', (r) => (r.auth.keys[0].sha256 = 'z'.repeat(64)), 'auth.keys[0].sha256: must be 64 hex digits (a SHA-256 digest)'],
    ['unknown plan', (r) => (r.auth.keys[0].plan = 'large'), 'auth.keys[0].plan: names no entry of rate_limits ("large")'],
    [
      'same secret twice',
      (r) => r.auth.keys.push({ id: 'beta', key: ALPHA_SECRET, plan: 'small' }),
      'auth.keys[1].key: has the same secret as auth.keys[0]',
    ],
    ['missing rate_limits', (r) => delete r.rate_limits, 'rate_limits: is required (at least one plan)'],
    ['no plans', (r) => (r.rate_limits = {}), 'rate_limits: must define at least one plan'],
    [
      'bad plan name',
      (r) => (r.rate_limits['bad name'] = { capacity: 1, refill_per_second: 1 }),
      'rate_limits["bad name"]: plan name must match [A-Za-z0-9_.-]{1,64}',
    ],
    ['zero capacity', (r) => (r.rate_limits.small.capacity = 0), 'rate_limits.small.capacity: must be an integer from 1 to 999999999999999'],
    ['fractional capacity', (r) => (r.rate_limits.small.capacity = 2.5), 'rate_limits.small.capacity: must be an integer from 1 to 999999999999999'],
    ['missing capacity', (r) => delete r.rate_limits.small.capacity, 'rate_limits.small.capacity: is required'],
    ['negative refill', (r) => (r.rate_limits.small.refill_per_second = -1), 'rate_limits.small.refill_per_second: must be a positive number'],
    ['infinite refill', (r) => (r.rate_limits.small.refill_per_second = Infinity), 'rate_limits.small.refill_per_second: must be a positive number'],
    ['cost_of_hit 2', (r) => (r.rate_limits.small.cost_of_hit = 2), 'rate_limits.small.cost_of_hit: must be 0 or 1'],
    ['cost_of_hit not a number', (r) => (r.rate_limits.small.cost_of_hit = 'free'), 'rate_limits.small.cost_of_hit: must be 0 or 1'],
    ['provider_weight 0', (r) => (r.rate_limits.small.provider_weight = 0), 'rate_limits.small.provider_weight: must be a number from 0.001 to 1000'],
    ['provider_weight over 1000', (r) => (r.rate_limits.small.provider_weight = 2000), 'rate_limits.small.provider_weight: must be a number from 0.001 to 1000'],
    ['missing upstreams', (r) => delete r.upstreams, 'upstreams: is required (at least one upstream)'],
    ['no upstreams', (r) => (r.upstreams = {}), 'upstreams: must define at least one upstream'],
    ['bad upstream name', (r) => (r.upstreams['a/b'] = { kind: 'fixture' }), 'upstreams["a/b"]: upstream name must match [A-Za-z][A-Za-z0-9_.-]{0,63}'],
    ['numeric upstream name', (r) => (r.upstreams['42'] = { kind: 'fixture' }), 'upstreams.42: upstream name must match [A-Za-z][A-Za-z0-9_.-]{0,63}'],
    ['missing kind', (r) => delete r.upstreams.main.kind, 'upstreams.main.kind: is required (v1, x_v2 or fixture)'],
    ['unknown kind', (r) => (r.upstreams.main.kind = 'v2'), 'upstreams.main.kind: must be "v1", "x_v2" or "fixture"'],
    ['fixture with settings', (r) => (r.upstreams.demo.url = 'https://x.example'), 'upstreams.demo.url: unknown key (a fixture upstream takes no other keys)'],
    ['missing url', (r) => delete r.upstreams.main.url, 'upstreams.main.url: is required'],
    ['unparsable url', (r) => (r.upstreams.main.url = 'provider.example'), 'upstreams.main.url: is not a valid absolute URL'],
    ['ftp url', (r) => (r.upstreams.main.url = 'ftp://provider.example'), 'upstreams.main.url: must use http: or https:'],
    [
      'url with credentials',
      (r) => (r.upstreams.main.url = 'https://user:pw@provider.example'),
      'upstreams.main.url: must not contain a username or password (put credentials in headers)',
    ],
    ['url with path', (r) => (r.upstreams.main.url = 'https://provider.example/api'), 'upstreams.main.url: must not have a path (give the origin only)'],
    ['url with query', (r) => (r.upstreams.main.url = 'https://provider.example/?a=1'), 'upstreams.main.url: must not have a query or fragment'],
    ['url with fragment', (r) => (r.upstreams.main.url = 'https://provider.example#x'), 'upstreams.main.url: must not have a query or fragment'],
    ['headers not a mapping', (r) => (r.upstreams.main.headers = ['a']), 'upstreams.main.headers: must be a mapping of header name to value'],
    ['bad header name', (r) => (r.upstreams.main.headers = { 'X Key': 'v' }), 'upstreams.main.headers["X Key"]: is not a valid header name'],
    [
      'host header',
      (r) => (r.upstreams.main.headers = { Host: 'v' }),
      'upstreams.main.headers.Host: is a hop-by-hop or framing header, which perch does not let you set',
    ],
    [
      'proxy header',
      (r) => (r.upstreams.main.headers = { 'Proxy-Authorization': 'v' }),
      'upstreams.main.headers.Proxy-Authorization: is a hop-by-hop or framing header, which perch does not let you set',
    ],
    [
      'transfer-encoding header',
      (r) => (r.upstreams.main.headers = { 'transfer-encoding': 'chunked' }),
      'upstreams.main.headers.transfer-encoding: is a hop-by-hop or framing header, which perch does not let you set',
    ],
    [
      'header repeated in another case',
      (r) => (r.upstreams.main.headers = { 'X-Key': 'a', 'x-key': 'b' }),
      'upstreams.main.headers.x-key: repeats header X-Key (header names are case-insensitive)',
    ],
    ['numeric header value', (r) => (r.upstreams.main.headers = { 'X-Version': 2 }), 'upstreams.main.headers.X-Version: must be a string'],
    [
      'header value with a line break',
      (r) => (r.upstreams.main.headers = { 'X-Key': 'a\r\nb' }),
      'upstreams.main.headers.X-Key: must not contain a line break or NUL character',
    ],
    ['timeout 0', (r) => (r.upstreams.main.timeout_ms = 0), 'upstreams.main.timeout_ms: must be an integer from 1 to 600000'],
    ['too many connections', (r) => (r.upstreams.main.connections = 2000), 'upstreams.main.connections: must be an integer from 1 to 1024'],
    ['tiny body limit', (r) => (r.upstreams.main.max_body_bytes = 100), 'upstreams.main.max_body_bytes: must be an integer from 1024 to 1073741824'],
    [
      'retry-after 0',
      (r) => (r.upstreams.main.retry_after_default_seconds = 0),
      'upstreams.main.retry_after_default_seconds: must be an integer from 1 to 86400',
    ],
    [
      'headers and credentials together',
      (r) => {
        r.upstreams.main.headers = { 'X-Key': 'a' };
        r.upstreams.main.credentials = [{ id: 'a', headers: { 'X-Key': 'b' } }];
      },
      'upstreams.main.headers: give either headers or credentials, not both',
    ],
    ['empty credentials', (r) => (r.upstreams.main.credentials = []), 'upstreams.main.credentials: must be a non-empty list of { id, headers }'],
    [
      'repeated credential id',
      (r) => (r.upstreams.main.credentials = [{ id: 'a', headers: {} }, { id: 'a', headers: {} }]),
      'upstreams.main.credentials[1].id: repeats "a"',
    ],
    ['credential without headers', (r) => (r.upstreams.main.credentials = [{ id: 'a' }]), 'upstreams.main.credentials[0].headers: is required'],
    ['bad credential id', (r) => (r.upstreams.main.credentials = [{ id: 'a b', headers: {} }]), 'upstreams.main.credentials[0].id: must match [A-Za-z0-9_.-]{1,64}'],
    [
      'credential header with a line break',
      (r) => (r.upstreams.main.credentials = [{ id: 'a', headers: { 'X-Key': 'a\nb' } }]),
      'upstreams.main.credentials[0].headers.X-Key: must not contain a line break or NUL character',
    ],
    ['zero rate cap', (r) => (r.upstreams.main.max_requests_per_second = 0), 'upstreams.main.max_requests_per_second: must be a number from 0.001 to 1000000'],
    ['burst without a rate', (r) => (r.upstreams.main.burst = 5), 'upstreams.main.burst: needs max_requests_per_second'],
    ['fractional max_concurrent', (r) => (r.upstreams.main.max_concurrent = 1.5), 'upstreams.main.max_concurrent: must be an integer from 1 to 100000'],
    ['quota without a window', (r) => (r.upstreams.main.quota = { requests: 900 }), 'upstreams.main.quota.per_seconds: is required'],
    ['unknown quota key', (r) => (r.upstreams.main.quota = { requests: 9, per_seconds: 9, per: 1 }), 'upstreams.main.quota.per: unknown key (did you mean "per_seconds"?)'],
    ['share above 1', (r) => (r.upstreams.main.redis_down_share = 2), 'upstreams.main.redis_down_share: must be a number from 0.001 to 1'],
    ['bad cooldown scope', (r) => (r.upstreams.main.cooldown_scope = 'credential'), 'upstreams.main.cooldown_scope: must be "upstream" or "endpoint"'],
    ['negative reserve', (r) => (r.upstreams.main.rate_limit_reserve = -1), 'upstreams.main.rate_limit_reserve: must be an integer from 0 to 1000000'],
    ['too many retries', (r) => (r.upstreams.main.retries = 11), 'upstreams.main.retries: must be an integer from 0 to 10'],
    [
      'backoff max under backoff',
      (r) => {
        r.upstreams.main.retry_backoff_ms = 500;
        r.upstreams.main.retry_backoff_max_ms = 100;
      },
      'upstreams.main.retry_backoff_max_ms: must be at least retry_backoff_ms',
    ],
    ['unknown breaker key', (r) => (r.upstreams.main.breaker = { threshold: 3 }), 'upstreams.main.breaker.threshold: unknown key'],
    ['breaker ratio 0', (r) => (r.upstreams.main.breaker = { failure_ratio: 0 }), 'upstreams.main.breaker.failure_ratio: must be a number from 0.01 to 1'],
    [
      'breaker backoff below its start',
      (r) => (r.upstreams.main.breaker = { half_open_after_ms: 5000, half_open_max_ms: 2000 }),
      'upstreams.main.breaker.half_open_max_ms: must be at least half_open_after_ms',
    ],
    ['negative price_per_call', (r) => (r.upstreams.main.price_per_call = -1), 'upstreams.main.price_per_call: must be a number from 0 to 1000000000'],
    ['unknown throttle key', (r) => (r.upstreams.main.throttle = { ratio: 2 }), 'upstreams.main.throttle.ratio: unknown key'],
    ['throttle k under 1', (r) => (r.upstreams.main.throttle = { k: 0.5 }), 'upstreams.main.throttle.k: must be a number from 1 to 100'],
    ['throttle enabled not a boolean', (r) => (r.upstreams.main.throttle = { enabled: 'yes' }), 'upstreams.main.throttle.enabled: must be true or false'],
    ['throttle window too short', (r) => (r.upstreams.main.throttle = { window_ms: 50 }), 'upstreams.main.throttle.window_ms: must be an integer from 100 to 3600000'],
    ['miss deadline 0', (r) => (r.server = { miss_deadline_ms: 0 }), 'server.miss_deadline_ms: must be an integer from 1 to 3600000'],
    [
      'unknown endpoint in routes',
      (r) => (r.routes = { tweeet: ['main'] }),
      'routes.tweeet: unknown key (endpoints are user, user_by_username, tweets, replies, following, tweet)',
    ],
    ['empty route', (r) => (r.routes = { tweet: [] }), 'routes.tweet: must be a non-empty list of upstream names'],
    ['unknown upstream in route', (r) => (r.routes = { tweet: ['mian'] }), 'routes.tweet[0]: names no configured upstream ("mian")'],
    ['repeated upstream in route', (r) => (r.routes = { tweet: ['main', 'main'] }), 'routes.tweet[1]: repeats "main"'],
    ['non-string in route', (r) => (r.routes = { tweet: [1] }), 'routes.tweet[0]: must be a string (an upstream name)'],
    [
      'tiny memory cache',
      (r) => (r.cache = { memory: { max_bytes: 1000 } }),
      'cache.memory.max_bytes: must be an integer of at least 1048576 (1 MiB)',
    ],
    ['negative ttl', (r) => (r.cache = { ttl_seconds: { tweet: -1 } }), 'cache.ttl_seconds.tweet: must be an integer from 0 to 604800'],
    ['ttl above a week', (r) => (r.cache = { ttl_seconds: { not_found: 604801 } }), 'cache.ttl_seconds.not_found: must be an integer from 0 to 604800'],
    [
      'unknown ttl key',
      (r) => (r.cache = { ttl_seconds: { tweeet: 1 } }),
      'cache.ttl_seconds.tweeet: unknown key (keys are user, user_by_username, tweets, replies, following, tweet, not_found)',
    ],
    ['relative metrics path', (r) => (r.metrics = { path: 'metrics' }), 'metrics.path: must start with "/"'],
    ['metrics under /v1/', (r) => (r.metrics = { path: '/v1/metrics' }), 'metrics.path: must not start with "/v1/" (the API uses that prefix)'],
    ['unknown log level', (r) => (r.log = { level: 'verbose' }), 'log.level: must be one of fatal, error, warn, info, debug, trace, silent'],
    ['unknown top-level key', (r) => (r.sever = {}), 'sever: unknown key (did you mean "server"?)'],
    ['unknown nested key', (r) => (r.server = { hostname: 'x' }), 'server.hostname: unknown key (did you mean "host"?)'],
    ['unknown key with no near match', (r) => (r.server = { bind: 'x' }), 'server.bind: unknown key'],
    ['unknown key in a plan', (r) => (r.rate_limits.small.capacty = 1), 'rate_limits.small.capacty: unknown key (did you mean "capacity"?)'],
    ['unknown key in a v1 upstream', (r) => (r.upstreams.main.timeout = 1), 'upstreams.main.timeout: unknown key (did you mean "timeout_ms"?)'],
  ];
  for (const [name, mutate, expected] of cases) it(name, () => assertProblem(mutate, expected));

  it('rejects a top level that is not a mapping', () => {
    assert.deepEqual(problemsOf('- a\n- b\n'), ['(top level): must be a mapping']);
    assert.deepEqual(problemsOf(''), ['(top level): the configuration is empty']);
  });

  it('reports every problem at once', () => {
    const problems = problemsAfter((r) => {
      r.server = { port: -1 };
      r.rate_limits.small.capacity = 0;
      r.auth.keys[0].plan = 'large';
      r.routes = { tweet: ['mian'] };
      r.log = { levle: 'info' };
    });
    assert.deepEqual([...problems].sort(), [
      'auth.keys[0].plan: names no entry of rate_limits ("large")',
      'log.levle: unknown key (did you mean "level"?)',
      'rate_limits.small.capacity: must be an integer from 1 to 999999999999999',
      'routes.tweet[0]: names no configured upstream ("mian")',
      'server.port: must be an integer from 0 to 65535',
    ]);
  });

  it('lists every problem in the error message, one per line', () => {
    const error = configError(() => parseConfig('server: { port: -1, hots: x }\n', {}));
    const lines = error.message.split('\n');
    assert.equal(lines[0], 'invalid configuration:');
    assert.deepEqual(
      lines.slice(1).map((line) => line.trim()),
      error.problems,
    );
    assert.ok(error.problems.length >= 5);
  });

  it('never puts a secret in a problem message', () => {
    const secrets = ['shortsecret', 'hunter2pass', 'header-secret-value', ALPHA_SECRET];
    const raw = base();
    raw.auth.keys = [
      { id: 'a', key: 'shortsecret', plan: 'small' },
      { id: 'b', key: ALPHA_SECRET, plan: 'small' },
      { id: 'c', key: ALPHA_SECRET, plan: 'nope' },
    ];
    raw.upstreams.main.url = 'https://user:hunter2pass@provider.example/path';
    raw.upstreams.main.headers = { Connection: 'header-secret-value', 'X-Key': 'header-secret-value\n' };
    const error = configError(() => parseConfig(stringify(raw), {}));
    assert.ok(error.problems.length >= 6);
    for (const secret of secrets) assert.equal(error.message.includes(secret), false, secret);
  });
});

describe('parseConfig and loadConfigFile: input errors', () => {
  it('reports a YAML syntax error with its position', () => {
    assert.deepEqual(problemsOf('server:\n  host: x\n port: 3\n'), [
      'YAML syntax, line 3, column 1: All mapping items must start at the same column',
    ]);
  });

  it('reports a duplicate key as a YAML error', () => {
    assert.deepEqual(problemsOf(`${MINIMAL}log: { level: info }\nlog: { level: warn }\n`), [
      'YAML syntax, line 10, column 1: Map keys must be unique',
    ]);
  });

  it('reports a missing file by path', () => {
    const error = configError(() => loadConfigFile('/nonexistent/perch.yaml', {}));
    assert.deepEqual(error.problems, ['/nonexistent/perch.yaml: cannot read the configuration file (ENOENT)']);
  });

  it('names the file in the message of an invalid file', () => {
    const error = configError(() => loadConfigFile(FULL_FIXTURE, { UPSTREAM_KEY: 'k' }));
    assert.ok(error.message.startsWith(`invalid configuration in ${FULL_FIXTURE}:\n`));
    assert.deepEqual(error.problems, ['auth.keys[0].key: environment variable ALPHA_KEY is not set']);
  });
});
