import assert from 'node:assert/strict';
import { test } from 'node:test';
import { heapNeeded, heapShortfall, oldSpaceLimitBytes, unsharedCapUpstreams } from '../src/app/advice.js';
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

test('an upstream without a cap is named when a plan has a provider_calls budget, which its calls charge', T, () => {
  const budget = (yaml: string) => yaml.replace('rate_limits:\n', 'rate_limits:\n  metered: { capacity: 10, refill_per_second: 1, provider_calls: { limit: 100, window: day } }\n');
  assert.deepEqual(unsharedCapUpstreams(parseConfig(budget(testConfig(v1('main', URL), REDIS)), {})), ['main']);
  assert.deepEqual(unsharedCapUpstreams(parseConfig(budget(testConfig(v1('main', URL, 'redis_down_share: 0.5'), REDIS)), {})), []);
});

test('no warning with a share below 1, without a cap, or without Redis', T, () => {
  assert.deepEqual(unshared(v1('main', URL, 'max_requests_per_second: 10, redis_down_share: 0.5'), REDIS), []);
  assert.deepEqual(unshared(v1('main', URL), REDIS), []);
  assert.deepEqual(unshared(v1('main', URL, 'max_requests_per_second: 10'), ''), []);
});

const MIB = 1024 * 1024;

test('a heap limit below 0.85 x max_bytes + 64 MiB is named at start-up with the heap needed', T, () => {
  const config = parseConfig(testConfig(v1('main', URL), 'cache: { memory: { max_bytes: 134217728 } }'), {});
  // 0.85 x 128 MiB + 64 MiB = 172.8 MiB, rounded up to the byte.
  const needed = Math.ceil(134217728 * 0.85) + 64 * MIB;
  assert.equal(heapNeeded(config), needed);
  assert.equal(heapShortfall(config, needed - 1), needed);
  assert.equal(heapShortfall(config, needed), undefined);
  // A round figure, max_bytes in MiB + 64 for the old space alone, clears it too.
  assert.equal(heapShortfall(config, (128 + 64) * MIB), undefined);
});

test('the old-space limit is the last --max-old-space-size of NODE_OPTIONS then node’s flags, else the heap limit', T, () => {
  const heap = 4096 * MIB;
  assert.equal(oldSpaceLimitBytes([], undefined, heap), heap);
  assert.equal(oldSpaceLimitBytes(['--max-old-space-size=192'], undefined, heap), 192 * MIB);
  assert.equal(oldSpaceLimitBytes([], '--max-semi-space-size=4 --max_old_space_size=160', heap), 160 * MIB);
  // node reads NODE_OPTIONS first, so a flag on its command line wins.
  assert.equal(oldSpaceLimitBytes(['--max-old-space-size=300'], '--max-old-space-size=100', heap), 300 * MIB);
  assert.equal(oldSpaceLimitBytes(['--max-old-space-size=lots'], undefined, heap), heap);
});
