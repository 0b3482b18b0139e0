import assert from 'node:assert/strict';
import { test } from 'node:test';
import { unsharedCapUpstreams } from '../src/config/advice.js';
import { parseConfig } from '../src/config/load.js';
import { testConfig, v1 } from './helpers/perch.js';

const T = { timeout: 5000 };
const URL = 'http://127.0.0.1:9';
const REDIS = 'cache: { redis: { url: "redis://127.0.0.1:6390" } }';

function unshared(upstreams: string, extra: string): string[] {
  return unsharedCapUpstreams(parseConfig(testConfig(upstreams, extra), {}));
}

test('a capped upstream sharing its caps through Redis with redis_down_share 1 is named at start-up', T, () => {
  assert.deepEqual(unshared(v1('main', URL, 'max_requests_per_second: 10'), REDIS), ['main']);
  assert.deepEqual(unshared(v1('main', URL, 'max_concurrent: 4'), `rate_limits_redis: { url: "redis://127.0.0.1:6390" }`), ['main']);
  assert.deepEqual(unshared(`${v1('main', URL, 'quota: { requests: 900, per_seconds: 900 }')}\nspare: { kind: fixture }`, REDIS), ['main']);
});

test('no warning with a share below 1, without a cap, or without Redis', T, () => {
  assert.deepEqual(unshared(v1('main', URL, 'max_requests_per_second: 10, redis_down_share: 0.5'), REDIS), []);
  assert.deepEqual(unshared(v1('main', URL), REDIS), []);
  assert.deepEqual(unshared(v1('main', URL, 'max_requests_per_second: 10'), ''), []);
});
