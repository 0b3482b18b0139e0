import assert from 'node:assert/strict';
import { test } from 'node:test';
import { guardedUpstream, limitedOnce } from './helpers/guarded-upstream.js';
import { json, sampleProvider } from './helpers/upstream-server.js';

const SECRET_A = 'upstrm-secret-aaaa-0001';
const SECRET_B = 'upstrm-secret-bbbb-0002';

const POOL = `credentials: [{ id: one, headers: { X-Key: "${SECRET_A}" } }, { id: two, headers: { X-Key: "${SECRET_B}" } }]`;

test('a spent usage cap is its own state: logged at error, the credential stopped on every endpoint for usage_cap_seconds', { timeout: 10_000 }, async (t) => {
  const problem = { title: 'UsageCapExceeded', type: 'https://api.twitter.com/2/problems/usage-capped', detail: 'Usage cap exceeded' };
  const { clock, upstream, perch } = await guardedUpstream(
    t,
    limitedOnce({ 'x-rate-limit-remaining': '250', 'x-rate-limit-reset': String(Date.UTC(2026, 0, 1) / 1000 + 60) }, problem),
    'cooldown_scope: endpoint, usage_cap_seconds: 3600',
  );
  const res = await perch.request('/v1/users/1');
  assert.deepEqual([res.status, res.headers.get('retry-after')], [429, '3600']);
  assert.equal((await perch.request('/v1/tweets/1')).status, 429, 'every endpoint, not just the one that drew it');
  clock.advance(600_000);
  assert.equal((await perch.request('/v1/users/1/following')).status, 429);
  assert.equal(upstream.requests.length, 1);
  const errors = perch.logs.lines().filter((l) => l.level === 50);
  assert.deepEqual(
    errors.map((l) => [l.msg, l.upstream, l.credential]),
    [['provider usage cap spent: credential stopped on every endpoint', 'main', 'default']],
  );
  clock.advance(3_000_000);
  assert.equal((await perch.request('/v1/users/9')).status, 200);
});

test('calls rotate over the credentials', { timeout: 10_000 }, async (t) => {
  const { upstream, perch } = await guardedUpstream(t, sampleProvider, POOL);
  for (let i = 1; i <= 4; i++) assert.equal((await perch.request(`/v1/users/${i}`)).status, 200);
  assert.deepEqual(
    upstream.requests.map((r) => r.headers['x-key']),
    [SECRET_A, SECRET_B, SECRET_A, SECRET_B],
  );
});

test('a credential answered 429 cools down alone, and the request is made again on the next one', { timeout: 10_000 }, async (t) => {
  const { clock, upstream, perch } = await guardedUpstream(
    t,
    (req, res) => (req.headers['x-key'] === SECRET_A ? json(429, {}, { 'retry-after': '60' })(req, res) : sampleProvider(req, res)),
    POOL,
  );
  assert.equal((await perch.request('/v1/users/1')).status, 200, 'the client does not pay for the spent credential');
  for (let i = 2; i <= 5; i++) assert.equal((await perch.request(`/v1/users/${i}`)).status, 200);
  assert.deepEqual(
    upstream.requests.map((r) => r.headers['x-key']),
    [SECRET_A, SECRET_B, SECRET_B, SECRET_B, SECRET_B, SECRET_B],
  );
  clock.advance(60_000);
  // Its stop over, the credential is tried again (and, still spent, stops again).
  await perch.request('/v1/users/6');
  await perch.request('/v1/users/7');
  assert.deepEqual(upstream.requests.slice(6).map((r) => r.headers['x-key']), [SECRET_A, SECRET_B, SECRET_B]);
  const metrics = await (await fetch(`${perch.url}/metrics`)).text();
  assert.match(metrics, /perch_upstream_credential_state\{upstream="main",credential="one",state="cooling_down"\} 1/);
  assert.match(metrics, /perch_upstream_credential_state\{upstream="main",credential="two",state="active"\} 1/);
});

test('a credential answered 401 leaves the rotation until its recheck: rejected again, the wait doubles; answered, it is back', { timeout: 10_000 }, async (t) => {
  let aRevoked = true;
  const { clock, upstream, perch } = await guardedUpstream(
    t,
    (req, res) => (req.headers['x-key'] === SECRET_A && aRevoked ? json(401, {})(req, res) : sampleProvider(req, res)),
    POOL,
  );
  const start = clock.now();
  let user = 0;
  const miss = async () => assert.equal((await perch.request(`/v1/users/${++user}`)).status, 200, 'the client never pays for the revoked credential');
  const callsOnA = () => upstream.requests.filter((r) => r.headers['x-key'] === SECRET_A).length;
  for (let i = 0; i < 6; i++) await miss();
  assert.equal(callsOnA(), 1);
  assert.deepEqual(
    perch.logs.lines().filter((l) => l.level === 50).map((l) => [l.msg, l.credential, l.recheck_at]),
    [['provider rejected a credential: out of the rotation until its recheck', 'one', new Date(start + 300_000).toISOString()]],
  );
  // Due at 300 s, then 600 s later, then 1200 s later: each recheck is one call on it, and the
  // request it rides on is served by the other credential.
  const rechecks: unknown[][] = [];
  for (const wait of [300_000, 600_000]) {
    clock.advance(wait - 1);
    await miss();
    assert.equal(callsOnA(), 1 + rechecks.length, 'not before its time');
    clock.advance(1);
    await miss();
    rechecks.push(['rejected', new Date(clock.now() + wait * 2).toISOString()]);
    assert.equal(callsOnA(), 1 + rechecks.length);
  }
  const lines = perch.logs.lines().filter((l) => l.msg === 'credential recheck: still out of the rotation');
  assert.deepEqual(lines.map((l) => [l.outcome, l.recheck_at]), rechecks);
  aRevoked = false;
  clock.advance(1_200_000);
  await miss();
  assert.equal(callsOnA(), 4, 'the recheck that restores it');
  assert.equal(perch.logs.lines().filter((l) => l.msg === 'credential recheck: the provider answers it again, back in the rotation').length, 1);
  for (let i = 0; i < 4; i++) await miss();
  assert.equal(callsOnA(), 6, 'back in the rotation: every other call');
  assert.ok(!perch.logs.text().includes(SECRET_A) && !perch.logs.text().includes(SECRET_B));
  const metrics = await (await fetch(`${perch.url}/metrics`)).text();
  assert.match(metrics, /perch_upstream_credential_rechecks_total\{upstream="main",credential="one",result="rejected"\} 2/);
  assert.match(metrics, /perch_upstream_credential_rechecks_total\{upstream="main",credential="one",result="restored"\} 1/);
  assert.match(metrics, /perch_upstream_credential_state\{upstream="main",credential="one",state="active"\} 1/);
  assert.ok(!metrics.includes(SECRET_A));
});

test('a credential the provider keeps rejecting is rechecked at 300, 600, 1200, 2400, 3600, 3600 s: the wait stops at an hour', { timeout: 10_000 }, async (t) => {
  const { clock, upstream, perch } = await guardedUpstream(t, json(401, {}), '');
  const start = clock.now();
  assert.equal((await perch.request('/v1/users/1')).status, 502);
  let at = start;
  const gaps: number[] = [];
  for (const wait of [300_000, 600_000, 1_200_000, 2_400_000, 3_600_000, 3_600_000]) {
    clock.advance(wait - 1);
    assert.equal((await perch.request('/v1/users/1')).status, 502);
    const before = upstream.requests.length;
    clock.advance(1);
    assert.equal((await perch.request('/v1/users/1')).status, 502);
    assert.equal(upstream.requests.length, before + 1, 'exactly one call, the recheck');
    gaps.push(clock.now() - at);
    at = clock.now();
  }
  assert.deepEqual(gaps, [300_000, 600_000, 1_200_000, 2_400_000, 3_600_000, 3_600_000]);
  const ready = (await (await fetch(`${perch.url}/readyz`)).json()) as { checks: Record<string, string> };
  assert.equal(ready.checks['upstream:main'], `no_credential until ${new Date(at + 3_600_000).toISOString()}`);
});

test('a 503 with Retry-After stops the whole upstream, every credential', { timeout: 10_000 }, async (t) => {
  let calls = 0;
  const { upstream, perch } = await guardedUpstream(t, (req, res) => (calls++ === 0 ? json(503, {}, { 'retry-after': '20' })(req, res) : sampleProvider(req, res)), POOL);
  const res = await perch.request('/v1/users/1');
  assert.deepEqual([res.status, res.headers.get('retry-after')], [429, '20']);
  assert.equal((await perch.request('/v1/users/2')).status, 429);
  assert.equal(upstream.requests.length, 1);
});
