import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test, type TestContext } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { KEY, metric, startPerch } from './helpers/perch.js';
import { json, startUpstream, type TestUpstream } from './helpers/upstream-server.js';
import { xFixtureText } from './helpers/x-v2-fixtures.js';

const X_TOKEN = 'AAAAAAAAAAAAAAAAAAAAAKnownAnswerToken%2B';

/** A fake X that serves one user to its token. */
async function fakeX(t: TestContext): Promise<TestUpstream> {
  return startUpstream(t, (req: IncomingMessage, res: ServerResponse) => {
    if (req.headers.authorization !== `Bearer ${X_TOKEN}`) return json(401, { title: 'Unauthorized' })(req, res);
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(xFixtureText('user'));
  });
}

test('an impossible id costs no provider budget, no call-cap place and no upstream exchange metric', { timeout: 20_000 }, async (t) => {
  const x = await fakeX(t);
  const clock = new ManualClock();
  const perch = await startPerch(
    t,
    `
server: { host: 127.0.0.1, port: 0 }
auth: { keys: [{ id: alpha, key: "${KEY}", plan: trial }] }
rate_limits: { trial: { capacity: 1000, refill_per_second: 1000, provider_calls: { limit: 1, window: day } } }
upstreams: { main: { kind: x_v2, url: "${x.url}", timeout_ms: 2000, bearer_token: "${X_TOKEN}", max_requests_per_second: 1, burst: 1, queue_timeout_ms: 0 } }
`,
    { clock, timers: clock },
  );
  for (let i = 0; i < 3; i++) assert.equal((await perch.request(`/v1/users/1234567890123456789${i}`)).status, 404);
  assert.equal(await metric(perch, 'perch_upstream_requests_total{upstream="main",route="user",outcome="not_found"}'), undefined);
  // The day's one call and the second's one place are still there.
  assert.equal((await perch.request('/v1/users/2244994945')).status, 200);
  assert.equal(x.requests.length, 1);
});

test('a request X cannot match is answered above the breaker: 404 while the breaker is open, and no call', { timeout: 20_000 }, async (t) => {
  const x = await startUpstream(t, json(500, { title: 'Internal' }));
  const perch = await startPerch(
    t,
    `
server: { host: 127.0.0.1, port: 0 }
auth: { keys: [{ id: alpha, key: "${KEY}", plan: big }] }
rate_limits: { big: { capacity: 1000, refill_per_second: 1000 } }
upstreams: { main: { kind: x_v2, url: "${x.url}", timeout_ms: 2000, bearer_token: "${X_TOKEN}", retries: 0, breaker: { consecutive_failures: 1, half_open_after_ms: 3600000, half_open_max_ms: 3600000 } } }
`,
  );
  assert.equal((await perch.request('/v1/users/2244994945')).status, 502);
  assert.equal((await perch.request('/v1/users/2244994946')).status, 502, 'the breaker is open');
  assert.equal(x.requests.length, 1);
  assert.equal((await perch.request('/v1/users/12345678901234567890')).status, 404);
  assert.equal((await perch.request('/v1/tweets/12345678901234567890')).status, 404);
  assert.equal(x.requests.length, 1);
});
