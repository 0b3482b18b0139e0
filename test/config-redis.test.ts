import assert from 'node:assert/strict';
import { test } from 'node:test';
import { stringify } from 'yaml';
import { ConfigError, parseConfig } from '../src/config/load.js';
import { createRedisClient } from '../src/redis/redis-client.js';

function withRedis(redis: Record<string, unknown>, key: 'cache' | 'rate_limits_redis' = 'cache'): string {
  return stringify({
    auth: { keys: [{ id: 'alpha', key: 'a'.repeat(24), plan: 'small' }] },
    rate_limits: { small: { capacity: 5, refill_per_second: 1 } },
    upstreams: { main: { kind: 'v1', url: 'https://provider.example' } },
    ...(key === 'cache' ? { cache: { redis } } : { rate_limits_redis: redis }),
  });
}

function problems(redis: Record<string, unknown>, key: 'cache' | 'rate_limits_redis' = 'cache'): readonly string[] {
  try {
    parseConfig(withRedis(redis, key), {});
  } catch (error) {
    assert.ok(error instanceof ConfigError, String(error));
    return error.problems;
  }
  return [];
}

test('sentinels take credentials and TLS for the master and the sentinels', () => {
  const config = parseConfig(
    withRedis({
      sentinels: ['10.0.0.1:26379'],
      name: 'main',
      username: 'perch',
      password: '${REDIS_PASSWORD}',
      sentinel_username: 'watcher',
      sentinel_password: 's3cret',
      tls: '${REDIS_TLS}',
      sentinel_tls: true,
      tls_ca_file: '/etc/perch/redis-ca.pem',
    }),
    { REDIS_PASSWORD: 'from-env', REDIS_TLS: 'true' },
  );
  assert.deepEqual(config.cache.redis, {
    sentinels: ['10.0.0.1:26379'],
    name: 'main',
    username: 'perch',
    password: 'from-env',
    sentinel_username: 'watcher',
    sentinel_password: 's3cret',
    tls: true,
    sentinel_tls: true,
    tls_ca_file: '/etc/perch/redis-ca.pem',
    prefix: 'perch:',
    command_timeout_ms: 50,
  });
});

test('cluster seeds keep user, password and TLS; every form they may take is checked, with its key path', () => {
  assert.deepEqual(problems({ cluster: ['rediss://u:p@10.0.0.1:6379', 'rediss://u:p@10.0.0.2:6379/0'], tls_ca_file: '/ca.pem' }), []);
  assert.deepEqual(problems({ cluster: ['redis://:p@10.0.0.1:6379', 'redis://:other@10.0.0.2:6379', 'rediss://:p@10.0.0.3:6379'] }), [
    'cache.redis.cluster[1]: must have the same scheme, user and password as the first seed',
    'cache.redis.cluster[2]: must have the same scheme, user and password as the first seed',
  ]);
  assert.deepEqual(problems({ cluster: ['redis://10.0.0.1:6379/2', 'redis://10.0.0.2:6379/x'] }), [
    'cache.redis.cluster[0]: Redis Cluster has database 0 only',
    'cache.redis.cluster[1]: database (the URL path) must be a number',
  ]);
  assert.deepEqual(problems({ url: 'redis://:%E0%A4%A@host:6379' }), ['cache.redis.url: has a badly percent-encoded user or password']);
});

test('sentinel-only keys elsewhere, a CA without TLS, non-boolean TLS and unknown keys are config errors', () => {
  assert.deepEqual(problems({ url: 'redis://host:6379', password: 'p', tls: true }, 'rate_limits_redis'), [
    'rate_limits_redis.password: is only used with sentinels (put credentials and rediss:// in the URL)',
    'rate_limits_redis.tls: is only used with sentinels (put credentials and rediss:// in the URL)',
  ]);
  assert.deepEqual(problems({ url: 'redis://host:6379', tls_ca_file: '/ca.pem' }), ['cache.redis.tls_ca_file: is only used with TLS (rediss://, tls or sentinel_tls)']);
  assert.deepEqual(problems({ sentinels: ['h:26379'], name: 'm', tls: 'yes' }), ['cache.redis.tls: must be true or false']);
  assert.equal(problems({ sentinels: ['h:26379'], name: 'm', sentinel_pass: 'x' }).length, 1);
  assert.match(problems({ sentinels: ['h:26379'], name: 'm', sentinel_pass: 'x' })[0]!, /^cache\.redis\.sentinel_pass: /);
});

test('an unreadable tls_ca_file fails at start-up, naming its key', () => {
  assert.throws(
    () => createRedisClient({ url: 'rediss://127.0.0.1:1', tls_ca_file: '/nonexistent/ca.pem', prefix: 'p:', command_timeout_ms: 50 }, 'test', 'rate_limits_redis'),
    /^Error: rate_limits_redis\.tls_ca_file: cannot read \/nonexistent\/ca\.pem \(ENOENT\)$/,
  );
});
