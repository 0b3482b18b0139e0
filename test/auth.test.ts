import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { Agent, request } from 'node:http';
import { test } from 'node:test';
import { KEY, OTHER_KEY, startPerch } from './helpers/perch.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

const E401 = '{"error":{"message":"Invalid API key","code":"E401"}}';

function config(url: string): string {
  const digest = createHash('sha256').update('hashed-key-chx9-0123').digest('hex').toUpperCase();
  return `
server: { port: 0 }
auth:
  keys:
    - { id: alpha, key: "${KEY}", plan: p }
    - { id: charlie, sha256: "${digest}", plan: p }
rate_limits: { p: { capacity: 1000, refill_per_second: 1000 } }
upstreams: { main: { kind: v1, url: "${url}", headers: { X-API-Key: "upstrm-secret-value" } } }
`;
}

test('a missing, empty, unknown or repeated key is 401 with exactly the spec body, before anything else', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, config(upstream.url));
  const attempts: [string, { key?: string | null; method?: string; headers?: Record<string, string> }][] = [
    ['/v1/users/1', { key: null }],
    ['/v1/users/1', { key: '' }],
    ['/v1/users/1', { key: 'not-a-key' }],
    ['/v1/users/1', { key: KEY.toUpperCase() }],
    ['/v1/users/1', { key: KEY.slice(0, -1) }],
    ['/v1/users/1', { key: OTHER_KEY }],
    ['/v1/users/1', { key: null, headers: { 'x-api-key': `${KEY}, ${KEY}` } }],
    ['/nowhere', { key: null }],
    ['/v1/users/abc', { key: 'wrong' }],
    ['/v1/users/1', { key: null, method: 'POST' }],
  ];
  for (const [path, options] of attempts) {
    const res = await perch.request(path, options);
    assert.equal(res.status, 401, `${path} ${JSON.stringify(options)}`);
    assert.equal(res.text, E401);
  }
  assert.equal(upstream.requests.length, 0);
});

test('keys given as a literal or as a sha256 digest both authenticate', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, config(upstream.url));
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/2', { key: 'hashed-key-chx9-0123' })).status, 200);
  const keyIds = perch.logs.lines().filter((l) => l.msg === 'request').map((l) => l.key_id);
  assert.deepEqual(keyIds, ['alpha', 'charlie']);
});

test("the client's key never reaches the upstream; the configured provider headers do", async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, config(upstream.url));
  await perch.request('/v1/users/1', { headers: { authorization: 'Bearer client-token', cookie: 'a=b' } });
  const headers = upstream.requests[0]!.headers;
  assert.equal(headers['x-api-key'], 'upstrm-secret-value');
  assert.equal(headers.authorization, undefined);
  assert.equal(headers.cookie, undefined);
  assert.ok(!JSON.stringify(headers).includes(KEY));
});

test('neither client keys nor provider secrets appear in logs; logs name the key id', async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, config(upstream.url));
  await perch.request('/v1/users/1');
  await perch.request('/v1/users/1', { key: 'wrong-key-guess-value' });
  await perch.request('/v1/tweets/1', { key: 'hashed-key-chx9-0123' });
  const text = perch.logs.text();
  for (const secret of [KEY, 'wrong-key-guess-value', 'hashed-key-chx9-0123', 'upstrm-secret-value']) {
    assert.ok(!text.includes(secret), `log contains ${secret}`);
  }
  const lines = perch.logs.lines().filter((l) => l.msg === 'request');
  assert.deepEqual(lines.map((l) => [l.status, l.key_id]), [[200, 'alpha'], [401, null], [200, 'charlie']]);
});

test('one keep-alive connection that changes its key is judged on the key it sends now', { timeout: 10_000 }, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, config(upstream.url));
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  onCleanup(t, () => agent.destroy());
  const sockets = new Set<unknown>();
  const get = (key: string) =>
    new Promise<number>((resolve, reject) => {
      const req = request(`${perch.url}/v1/users/1`, { agent, headers: { 'x-api-key': key } }, (res) => {
        sockets.add(req.socket);
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      });
      req.on('error', reject);
      req.end();
    });
  assert.deepEqual(
    [await get(KEY), await get(KEY), await get(`${KEY}x`), await get(KEY), await get('hashed-key-chx9-0123'), await get(KEY)],
    [200, 200, 401, 200, 200, 200],
  );
  assert.equal(sockets.size, 1, 'all on one connection');
  const ids = perch.logs.lines().filter((l) => l.msg === 'request').map((l) => l.key_id);
  assert.deepEqual(ids, ['alpha', 'alpha', null, 'alpha', 'charlie', 'alpha']);
});
