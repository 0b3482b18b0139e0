import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { Agent, request, type IncomingMessage, type ServerResponse } from 'node:http';
import { test } from 'node:test';
import { Redis } from 'ioredis';
import { onCleanup } from './helpers/cleanup.js';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { metric, waitFor } from './helpers/perch.js';
import { spawnPerch } from './helpers/perch-process.js';
import { tempDir } from './helpers/temp-dir.js';
import { startRedis } from './helpers/redis-server.js';
import { json, sampleProvider, startUpstream } from './helpers/upstream-server.js';

// Its own file: node --test bounds a whole file by --test-timeout, and this one test takes much of
// it. perch runs as a process of its own, so that it and the client each have a core.

const KEYS = 100_000;
const CONNECTIONS = 64;
const GOOD = 'ck-good-alpha-0123456789';

/** A key nobody issued. */
function madeUpKey(): string {
  return `made-up-${randomBytes(16).toString('hex')}`;
}

/** A v1 provider that serves its one good key and answers 401 to any other. */
function checking(req: IncomingMessage, res: ServerResponse): void {
  if (req.headers['x-api-key'] === GOOD) return sampleProvider(req, res);
  return json(401, { title: 'Unauthorized' })(req, res);
}

/** GET /v1/users/1 with `key`, the body drained; resolves with the status. */
function get(agent: Agent, port: number, key: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: '/v1/users/1', agent, headers: { 'x-api-key': key } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    req.end();
  });
}

test('100,000 made-up keys leave bounded state: verdicts within remembered_keys, Redis back to a few keys', { timeout: 115_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, checking);
  const yaml = `
server: { host: 127.0.0.1, port: 0 }
auth: { mode: upstream, default_plan: resale, verify_burst: 50, verify_rate_per_second: 0.001, verify_source_share: 1, remembered_keys: 1000, reject_ttl_seconds: 5 }
rate_limits: { resale: { capacity: 10, refill_per_second: 100 } }
rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 10000 }
upstreams: { main: { kind: v1, url: "${upstream.url}", timeout_ms: 2000 } }
log: { level: warn }
`;
  const config = join(tempDir(t, 'perch-churn-'), 'perch.yaml');
  writeFileSync(config, yaml);
  const perch = await spawnPerch(t, config);
  const client = new Redis(redis.url);
  onCleanup(t, () => client.disconnect());
  const before = await client.dbsize();
  // Plain node:http on keep-alive connections: the client must cost less than the server.
  const agent = new Agent({ keepAlive: true, maxSockets: CONNECTIONS });
  onCleanup(t, () => agent.destroy());
  const { port } = new URL(perch.url);
  let next = 0;
  const started = performance.now();
  const statuses = new Map<number, number>();
  await Promise.all(
    Array.from({ length: CONNECTIONS }, async () => {
      while (next < KEYS) {
        next++;
        const status = await get(agent, Number(port), madeUpKey());
        statuses.set(status, (statuses.get(status) ?? 0) + 1);
      }
    }),
  );
  t.diagnostic(`${KEYS} keys in ${Math.round(performance.now() - started)} ms`);
  const called = upstream.requests.length;
  assert.ok(called <= 50, `${called} calls`);
  assert.deepEqual([statuses.get(401), statuses.get(429)], [called, KEYS - called]);
  assert.equal(await metric(perch, 'perch_pass_through_keys{verdict="accepted"}'), 0);
  assert.equal(await metric(perch, 'perch_pass_through_keys{verdict="rejected"}'), called);
  // Each key's bucket lapses in Redis once it is full again (capacity / refill: 0.1 s), on Redis's
  // own clock, and each rejection the fleet shares once reject_ttl_seconds pass: what stays is
  // perch's own few keys, the shared verification bucket among them.
  await waitFor(async () => (await client.dbsize()) <= before + 5, 10_000);
  t.diagnostic(`Redis keys after: ${(await client.keys('*')).join(' ')}`);
});
