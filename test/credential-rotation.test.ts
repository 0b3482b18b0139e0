import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { keyStopsBySecret } from '../src/upstream/guard/credential-keyed-state.js';
import { ANY } from '../src/upstream/guard/provider-state.js';
import { RedisProviderState } from '../src/upstream/guard/redis-state.js';
import { onCleanup } from './helpers/cleanup.js';
import { KEY, testConfig, v1, waitFor } from './helpers/perch.js';
import { spawnPerch } from './helpers/perch-process.js';
import { startRedis } from './helpers/redis-server.js';
import { tempDir } from './helpers/temp-dir.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

// A provider credential rotated under the same id (a changed secret file and a SIGHUP) starts
// without the old secret's stop: stops belong to the secret, not only to the id.

const OLD = 'Qz8xK3vW0pLm2Nn7Rt5Yb1';
const NEW = 'Hj4sD9fG6kA1wE3rT8yU2i';

async function rotation(t: TestContext, redisUrl?: string): Promise<void> {
  const upstream = await startUpstream(t, (req, res) => {
    if (req.headers['x-api-key'] === OLD) {
      res.writeHead(429, { 'retry-after': '3600', 'content-type': 'application/json' });
      res.end('{}');
    } else sampleProvider(req, res);
  });
  const dir = tempDir(t, 'perch-rotation-');
  const secret = join(dir, 'provider_key');
  writeFileSync(secret, `${OLD}\n`);
  const path = join(dir, 'perch.yaml');
  const extra = redisUrl === undefined ? '' : `rate_limits_redis: { url: "${redisUrl}", command_timeout_ms: 2000 }`;
  writeFileSync(path, testConfig(v1('main', upstream.url, `headers: { X-API-Key: "\${file:${secret}}" }`), extra));
  const perch = await spawnPerch(t, path);
  const get = async (id: number) => (await fetch(`${perch.url}/v1/users/${id}`, { headers: { 'x-api-key': KEY } })).status;

  assert.equal(await get(1), 429, 'the old key draws the provider\'s 429');
  assert.equal(await get(2), 429);
  assert.equal(upstream.requests.length, 1, 'the stop holds: no second call with the old key');

  const reloads = perch.output().split('configuration reloaded').length;
  writeFileSync(secret, `${NEW}\n`);
  perch.process.kill('SIGHUP');
  await waitFor(() => perch.output().split('configuration reloaded').length > reloads);
  assert.equal(await get(3), 200, 'the rotated key is called at once');
  assert.deepEqual(
    upstream.requests.map((r) => r.headers['x-api-key']),
    [OLD, NEW],
  );
  assert.ok(!perch.output().includes(OLD) && !perch.output().includes(NEW), 'no secret in the logs');
}

test('a rotated provider key and a SIGHUP: the next miss calls the provider with the new key', { timeout: 30_000 }, async (t) => {
  await rotation(t);
});

test('the same with the stops in Redis, whose keys hold a fingerprint, never the secret', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  await rotation(t, redis.url);
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  const keys = await inspector.keys('*stop*');
  assert.equal(keys.length, 1, keys.join(' '));
  assert.match(keys[0]!, /:stop:default@[0-9a-f]{16}:\*$/);
  for (const key of await inspector.keys('*')) assert.ok(!key.includes(OLD) && !key.includes(NEW), key);
});

test('a stop written under the bare credential id (before an upgrade) still holds the credential in Redis', { timeout: 10_000 }, async (t) => {
  const redis = await startRedis(t);
  const client = new Redis(redis.url);
  onCleanup(t, () => client.disconnect());
  const raw = new RedisProviderState(client, { prefix: 'perch:', now: () => Date.now(), commandTimeoutMs: 2000 });
  const credentials = [{ id: 'default', headers: { 'X-API-Key': OLD } }];
  const state = keyStopsBySecret(raw, credentials);
  const untilMs = Date.now() + 3_600_000;
  await raw.stop({ upstream: 'main', credential: 'default', scope: ANY, untilMs, state: 'cooling_down' });
  const query = { upstream: 'main', scope: 'user', candidates: ['default'], cap: {}, localCap: {}, leaseId: 'l1', leaseMs: 1000, payer: { id: 'k', weight: 1, label: 'k' } };
  assert.deepEqual(await state.admit(query), { kind: 'stopped', untilMs, state: 'cooling_down' });
  const rotated = keyStopsBySecret(raw, [{ id: 'default', headers: { 'X-API-Key': NEW } }]);
  await state.stop({ upstream: 'main', credential: 'default', scope: ANY, untilMs: untilMs + 1000, state: 'cooling_down' });
  await client.del((await client.keys('*:stop:default:*'))[0]!);
  assert.deepEqual(await rotated.admit({ ...query, leaseId: 'l2' }), { kind: 'admitted', credential: 'default' }, "the old secret's stop is not the new one's");
  assert.equal((await state.admit({ ...query, leaseId: 'l3' })).kind, 'stopped');
});
