// Documented claims (README.md and docs/) held against real processes and real HTTP servers: `perch --health-check` over
// HTTPS and on `::`, and `server.miss_deadline_ms` as the bound of a whole miss. The claims about
// signals are in readme-claims-signals.test.ts.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { startPerch, testConfig, v1, type TestResponse } from './helpers/perch.js';
import { freePort, hasIpv6Loopback, runCli, spawnPerch } from './helpers/perch-process.js';
import { tempDir } from './helpers/temp-dir.js';
import { selfSignedCertificate } from './helpers/tls-files.js';
import { json, sampleProvider, startUpstream } from './helpers/upstream-server.js';

const KEYS_YAML = `
auth: { keys: [ { id: a, key: "qz7-test-key-0123456789", plan: p } ] }
rate_limits: { p: { capacity: 100, refill_per_second: 100 } }
upstreams: { demo: { kind: fixture } }
`;

function writeConfig(t: TestContext, text: string): string {
  const path = join(tempDir(t, 'perch-claims-'), 'perch.yaml');
  writeFileSync(path, text);
  return path;
}

// docs/cli.md: "--health-check reads the same configuration as the server and asks
// /healthz on its server.host (loopback for 0.0.0.0 / ::), server.port and scheme (with
// server.tls, HTTPS without verifying the certificate)".
test('perch --health-check asks over HTTPS when server.tls is set: 1 while down, 0 once perch serves', { timeout: 30_000 }, async (t) => {
  const tls = await selfSignedCertificate(t);
  const port = await freePort();
  const path = writeConfig(t, `server: { host: 127.0.0.1, port: ${port}, tls: { cert_file: ${tls.cert}, key_file: ${tls.key} } }\n${KEYS_YAML}`);
  const down = await runCli(t, ['--health-check', '--config', path]);
  assert.equal(down.code, 1);
  assert.match(down.stderr, /^perch: unhealthy: .*ECONNREFUSED/);

  const perch = await spawnPerch(t, path);
  assert.equal(perch.url, `https://127.0.0.1:${port}`);
  const up = await runCli(t, ['--health-check', '--config', path]);
  assert.deepEqual([up.code, up.stdout, up.stderr], [0, '', '']);
});

test('perch --health-check finds a perch bound to server.host "::" on the IPv6 loopback', { timeout: 30_000 }, async (t) => {
  if (!(await hasIpv6Loopback())) {
    t.skip('this machine has no IPv6 loopback');
    return;
  }
  const port = await freePort('::');
  const path = writeConfig(t, `server: { host: "::", port: ${port} }\n${KEYS_YAML}`);
  const down = await runCli(t, ['--health-check', '--config', path]);
  assert.equal(down.code, 1);
  assert.match(down.stderr, /^perch: unhealthy: .*ECONNREFUSED/);

  const perch = await spawnPerch(t, path);
  assert.equal(perch.url, `http://[::]:${port}`);
  const up = await runCli(t, ['--health-check', '--config', path]);
  assert.deepEqual([up.code, up.stdout, up.stderr], [0, '', '']);
});

// docs/configuration.md, Reference: "server.miss_deadline_ms: bound on everything a miss waits for
// upstream: the call cap's queue, retries and their backoff, failover along the route".

const DEADLINE_MS = 700;
/** Upper slack on the deadline for the HTTP exchanges around it on a loaded machine. */
const SLACK_MS = 300;

/** An upstream behaviour that never answers (startUpstream still records the request). */
const hanging = () => {};

/**
 * `testConfig` with the deadline, the given routes, and a short shutdown grace, so a test that
 * fails with a miss still waiting stops at once.
 */
function deadlineConfig(upstreams: string, routes: string): string {
  return testConfig(upstreams, `routes: { ${routes} }\n`).replace('port: 0 }', `port: 0, miss_deadline_ms: ${DEADLINE_MS}, shutdown_grace_ms: 500 }`);
}

async function timed(perchRequest: () => Promise<TestResponse>) {
  const started = performance.now();
  const res = await perchRequest();
  return { res, ms: performance.now() - started };
}

function assertWithinDeadline(ms: number): void {
  assert.ok(ms >= DEADLINE_MS - 50, `answered after ${ms.toFixed(0)} ms, before the deadline's ${DEADLINE_MS}: it gave up early`);
  assert.ok(ms < DEADLINE_MS + SLACK_MS, `answered after ${ms.toFixed(0)} ms, past the deadline's ${DEADLINE_MS} ms`);
}

test('server.miss_deadline_ms bounds the wait in the call cap\'s queue', { timeout: 10_000 }, async (t) => {
  const provider = await startUpstream(t, sampleProvider);
  // One call per 100 s, and a queue that would wait a minute for the next one.
  const perch = await startPerch(
    t,
    deadlineConfig(v1('capped', provider.url, 'max_requests_per_second: 0.01, burst: 1, queue_timeout_ms: 60000, timeout_ms: 60000'), 'user: [capped]'),
  );
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  const { res, ms } = await timed(() => perch.request('/v1/users/2'));
  assert.equal(res.status, 429);
  assert.equal(res.json().error.code, 'E429');
  assertWithinDeadline(ms);
  assert.equal(provider.requests.length, 1);
});

test('server.miss_deadline_ms bounds retries: the attempt under way is cut at the deadline', { timeout: 10_000 }, async (t) => {
  const arrivals: number[] = [];
  const provider = await startUpstream(t, () => void arrivals.push(performance.now()));
  // Eleven attempts of 600 ms would take 6.6 s; the deadline leaves room for the first and 100 ms of the second.
  const retrying =
    'timeout_ms: 600, retries: 10, retry_backoff_ms: 1, retry_backoff_max_ms: 1, retry_budget_percent: 100, retry_budget_min_per_second: 10000';
  const perch = await startPerch(t, deadlineConfig(v1('flaky', provider.url, retrying), 'tweet: [flaky]'));
  const started = performance.now();
  const { res, ms } = await timed(() => perch.request('/v1/tweets/1'));
  assert.equal(res.status, 504);
  assert.equal(res.json().error.code, 'E504');
  assertWithinDeadline(ms);
  // The first attempt and the retry that the deadline cut short. (A timer firing a fraction of a
  // millisecond before the deadline may still let a last retry out with a 1 ms timeout.)
  assert.equal(arrivals.filter((at) => at - started < DEADLINE_MS - 20).length, 2);
  assert.equal(provider.requests.length, arrivals.length);
});

test('server.miss_deadline_ms bounds retry backoff: a retry whose backoff would end past the deadline is not started', { timeout: 10_000 }, async (t) => {
  const arrivals: number[] = [];
  const fail503 = json(503, {});
  const provider = await startUpstream(t, (req, res) => {
    arrivals.push(performance.now());
    fail503(req, res);
  });
  // Backoffs drawn up to 60 s: whatever the draws, no wait may run past the deadline.
  const retrying =
    'retries: 10, retry_backoff_ms: 60000, retry_backoff_max_ms: 60000, retry_budget_percent: 100, retry_budget_min_per_second: 10000';
  const perch = await startPerch(t, deadlineConfig(v1('failing', provider.url, retrying), 'tweet: [failing]'));
  const started = performance.now();
  const { res, ms } = await timed(() => perch.request('/v1/tweets/1'));
  assert.equal(res.status, 502);
  assert.equal(res.json().error.code, 'E502');
  assert.ok(ms < DEADLINE_MS + SLACK_MS, `answered after ${ms.toFixed(0)} ms, past the deadline's ${DEADLINE_MS} ms`);
  assert.ok(arrivals.length >= 1);
  assert.deepEqual(
    arrivals.filter((at) => at - started >= DEADLINE_MS),
    [],
    'no attempt starts past the deadline',
  );
});

test('server.miss_deadline_ms bounds failover: the next upstream gets only what is left of the deadline', { timeout: 10_000 }, async (t) => {
  const first = await startUpstream(t, hanging);
  const second = await startUpstream(t, hanging);
  const perch = await startPerch(
    t,
    deadlineConfig(`${v1('first', first.url, 'timeout_ms: 500')}\n${v1('second', second.url, 'timeout_ms: 60000')}`, 'tweets: [first, second]'),
  );
  const { res, ms } = await timed(() => perch.request('/v1/users/1/tweets'));
  assert.equal(res.status, 504);
  assert.equal(res.json().error.code, 'E504');
  assertWithinDeadline(ms);
  assert.deepEqual([first.requests.length, second.requests.length], [1, 1]);
});

test('server.miss_deadline_ms bounds one miss end to end: retries, failover, then the next upstream\'s queue', { timeout: 10_000 }, async (t) => {
  const flaky = await startUpstream(t, hanging);
  const capped = await startUpstream(t, sampleProvider);
  const upstreams = [
    v1('flaky', flaky.url, 'timeout_ms: 200, retries: 1, retry_backoff_ms: 1, retry_backoff_max_ms: 1, retry_budget_percent: 100, retry_budget_min_per_second: 10000'),
    v1('capped', capped.url, 'max_requests_per_second: 0.01, burst: 1, queue_timeout_ms: 60000, timeout_ms: 60000'),
  ].join('\n');
  const perch = await startPerch(t, deadlineConfig(upstreams, 'user: [capped], following: [flaky, capped]'));
  // Spends the capped upstream's one call of the next 100 s.
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  // 2 x 200 ms on flaky, then the rest of the deadline in capped's queue (which would wait 60 s).
  const { res, ms } = await timed(() => perch.request('/v1/users/1/following'));
  assert.equal(res.status, 429);
  assert.equal(res.json().error.code, 'E429');
  assertWithinDeadline(ms);
  assert.deepEqual([flaky.requests.length, capped.requests.length], [2, 1]);
});
