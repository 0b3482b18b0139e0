import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { json, startUpstream } from './helpers/upstream-server.js';

test('with Redis, one instance of a fleet rechecks a revoked credential: two instances due at once make one call', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, json(401, {}));
  const clock = new ManualClock();
  const yaml = testConfig(v1('main', upstream.url), `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 2000 }\n`);
  const a = await startPerch(t, yaml, { clock, timers: clock });
  const b = await startPerch(t, yaml, { clock, timers: clock });
  // Both learn the rejection from a call of their own (a 401 is not a shared stop).
  assert.equal((await a.request('/v1/users/1')).status, 502);
  assert.equal((await b.request('/v1/users/2')).status, 502);
  assert.equal(upstream.requests.length, 2);

  clock.advance(300_000);
  const answers = await Promise.all([a.request('/v1/users/3'), b.request('/v1/users/4')]);
  assert.deepEqual(answers.map((r) => r.status), [502, 502]);
  assert.equal(upstream.requests.length, 3, 'one recheck for the fleet');
  const lines = [...a.logs.lines(), ...b.logs.lines()].filter((l) => l.msg === 'credential recheck: still out of the rotation');
  assert.deepEqual(lines.map((l) => [l.outcome, l.recheck_at]), [['rejected', new Date(clock.now() + 600_000).toISOString()]]);
  await waitFor(() => upstream.requests.length === 3);
});
