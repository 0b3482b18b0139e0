import assert from 'node:assert/strict';
import { test } from 'node:test';
import { classBytes, classOf } from '../src/cache/slab-pool.js';
import { KEY, startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { refusedPort, sampleProvider, startUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

/** The value of one sample line, e.g. `perch_requests_total{route="user",status="200",cache="miss"}`. */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

async function scrape(url: string): Promise<string> {
  const res = await fetch(url);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type') ?? '', /^text\/plain/);
  return res.text();
}

test('requests, durations, upstream exchanges, coalescing and cache size are exported without a key', async (t) => {
  const perch = await startPerch(t, testConfig('demo: { kind: fixture }'));
  const user = await perch.request('/v1/users/1');
  assert.equal(user.status, 200);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/1', { key: 'wrong-key-0123456789' })).status, 401);
  assert.equal((await perch.request('/nope')).status, 404);

  const text = await scrape(`${perch.url}/metrics`);
  assert.equal(sample(text, 'perch_requests_total{route="user",status="200",cache="miss"}'), 1);
  assert.equal(sample(text, 'perch_requests_total{route="user",status="200",cache="hit"}'), 1);
  assert.equal(sample(text, 'perch_requests_total{route="none",status="401",cache="none"}'), 1);
  assert.equal(sample(text, 'perch_requests_total{route="none",status="404",cache="none"}'), 1);
  assert.equal(sample(text, 'perch_request_duration_seconds_count{route="user",cache="hit"}'), 1);
  assert.equal(sample(text, 'perch_upstream_requests_total{upstream="demo",route="user",outcome="ok"}'), 1);
  assert.equal(sample(text, 'perch_upstream_duration_seconds_count{upstream="demo",route="user"}'), 1);
  // The user, and the same user under its username (cross-population).
  assert.equal(sample(text, 'perch_cache_entries{tier="memory"}'), 2);
  // Each entry is charged its body's region (the body rounded up to its slab class), its key (two
  // bytes a character) and 640 bytes of overhead.
  const twin = `/v1/users/by/username/${String(user.json().username).toLowerCase()}`;
  const region = classBytes(classOf(Buffer.byteLength(user.text)));
  assert.ok(region > Buffer.byteLength(user.text), 'this body is not a class size: rounding shows');
  const charged = 2 * (region + 640) + 2 * ('/v1/users/1'.length + twin.length);
  assert.equal(sample(text, 'perch_cache_bytes{tier="memory"}'), charged);
  assert.ok(sample(text, 'process_cpu_seconds_total') !== undefined, 'default process metrics');
  // The scrape itself is not an API request.
  assert.doesNotMatch(text, /route="none",status="200"/);
  // Label values come from closed sets: no raw path or id, whatever the sample values hold.
  for (const [, name, value] of text.matchAll(/[{,](\w+)="([^"]*)"/g)) {
    assert.ok(!value!.includes('/'), `${name}="${value}"`);
    if (name === 'status') assert.match(value!, /^\d{3}$/);
    if (name === 'route') assert.match(value!, /^(user|user_by_username|tweets|replies|following|tweet|none)$/);
  }
});

test('requests that join an in-flight upstream request count as coalesced', async (t) => {
  let release = () => {};
  const gate = new Promise<void>((resolve) => (release = resolve));
  const upstream = await startUpstream(t, (req, res) => void gate.then(() => sampleProvider(req, res)));
  const perch = await startPerch(t, testConfig(v1('slow', upstream.url)));
  const answers = Promise.all([1, 2, 3].map(() => perch.request('/v1/tweets/77')));
  await waitFor(() => perch.received() === 3 && upstream.requests.length === 1);
  release();
  assert.deepEqual((await answers).map((r) => r.status), [200, 200, 200]);
  const text = await scrape(`${perch.url}/metrics`);
  assert.equal(sample(text, 'perch_coalesced_requests_total{route="tweet"}'), 2);
  assert.equal(sample(text, 'perch_requests_total{route="tweet",status="200",cache="coalesced"}'), 2);
  assert.equal(sample(text, 'perch_upstream_requests_total{upstream="slow",route="tweet",outcome="ok"}'), 1);
});

test('upstream failures are labelled by failure kind, failover attempts included', async (t) => {
  const port = await refusedPort();
  const perch = await startPerch(t, testConfig(`${v1('dead', `http://127.0.0.1:${port}`)}\ndemo: { kind: fixture }`, 'routes: { user: [dead, demo] }'));
  assert.equal((await perch.request('/v1/users/5')).status, 200);
  const text = await scrape(`${perch.url}/metrics`);
  assert.equal(sample(text, 'perch_upstream_requests_total{upstream="dead",route="user",outcome="connection"}'), 1);
  assert.equal(sample(text, 'perch_upstream_requests_total{upstream="demo",route="user",outcome="ok"}'), 1);
});

test("perch's own 429s count per key id, and /metrics costs no token", async (t) => {
  const perch = await startPerch(
    t,
    testConfig('demo: { kind: fixture }').replace('big: { capacity: 100000, refill_per_second: 100000 }', 'big: { capacity: 1, refill_per_second: 0.001 }'),
  );
  await scrape(`${perch.url}/metrics`);
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/1')).status, 429);
  const text = await scrape(`${perch.url}/metrics`);
  assert.equal(sample(text, 'perch_rate_limited_total{key_id="alpha"}'), 1);
  assert.equal(sample(text, 'perch_requests_total{route="none",status="429",cache="none"}') ?? sample(text, 'perch_requests_total{route="user",status="429",cache="none"}'), 1);
});

test('two instances in one process keep separate registries', async (t) => {
  const a = await startPerch(t, testConfig('demo: { kind: fixture }'));
  const b = await startPerch(t, testConfig('demo: { kind: fixture }'));
  await a.request('/v1/users/1');
  assert.equal(sample(await scrape(`${a.url}/metrics`), 'perch_requests_total{route="user",status="200",cache="miss"}'), 1);
  assert.equal(sample(await scrape(`${b.url}/metrics`), 'perch_requests_total{route="user",status="200",cache="miss"}'), undefined);
});

test('metrics.port moves metrics to their own listener and off the API one', async (t) => {
  const { parseConfig } = await import('../src/config/load.js');
  const { createPerch } = await import('../src/app/perch.js');
  const { captureLogs } = await import('./helpers/log-capture.js');
  const config = parseConfig(testConfig('demo: { kind: fixture }', 'metrics: { path: /m, port: 0 }'), {});
  const perch = createPerch({ config, logger: captureLogs().logger });
  const api = await perch.listen();
  onCleanup(t, () => perch.close());
  const metricsPort = perch.metricsAddress()!.port;
  assert.notEqual(metricsPort, api.port);
  assert.match(await scrape(`http://127.0.0.1:${metricsPort}/m`), /perch_requests_total/);
  assert.equal((await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).status, 404);
  // On the API listener the path is just an unknown route behind authentication.
  assert.equal((await fetch(`http://127.0.0.1:${api.port}/m`, { headers: { 'x-api-key': KEY } })).status, 404);
  assert.equal((await fetch(`http://127.0.0.1:${api.port}/m`)).status, 401);
});
