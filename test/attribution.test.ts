import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { ManualClock } from './helpers/clock.js';
import { OTHER_KEY, metric, startPerch, testConfig, v1, waitFor } from './helpers/perch.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

// Who spends the provider: the key whose miss makes a call pays for it (calls, spend); hits,
// stale answers and coalesced followers are calls saved, and the access line says which.

test('calls and spend are charged to the key whose miss made them; hits, stale and coalesced followers are saved calls', { timeout: 20_000 }, async (t) => {
  const clock = new ManualClock();
  const held: (() => void)[] = [];
  let holding = false;
  const upstream = await startUpstream(t, (req: IncomingMessage, res: ServerResponse) => (holding ? held.push(() => sampleProvider(req, res)) : sampleProvider(req, res)));
  const cache = 'cache: { stale_seconds: 600, ttl_seconds: { user: 60 } }';
  const perch = await startPerch(t, testConfig(v1('main', upstream.url, 'price_per_call: 0.25'), cache), { clock });
  const series = (name: string, labels: string) => metric(perch, `${name}{${labels}}`);

  // alpha's three misses: three calls, 0.75 spent. bravo's repeat of one is a hit.
  for (const id of [1, 2, 3]) assert.equal((await perch.request(`/v1/users/${id}`)).status, 200);
  assert.equal((await perch.request('/v1/users/1', { key: OTHER_KEY })).headers.get('cache-status'), 'perch; hit; ttl=60');
  // A miss both keys ask for at once: alpha's call, bravo a coalesced follower.
  holding = true;
  const leader = perch.request('/v1/users/4');
  await waitFor(() => held.length === 1);
  const follower = perch.request('/v1/users/4', { key: OTHER_KEY });
  await waitFor(() => perch.received() === 6);
  holding = false;
  held.shift()!();
  assert.deepEqual([(await leader).status, (await follower).status], [200, 200]);
  // Past the TTL bravo gets alpha's stale entry at once, and its refresh is bravo's call.
  clock.advance(61_000);
  assert.equal((await perch.request('/v1/users/2', { key: OTHER_KEY })).headers.get('cache-status'), 'perch; fwd=stale; ttl=-1');
  await waitFor(() => upstream.requests.length === 5);

  assert.equal(await series('perch_key_upstream_calls_total', 'key_id="alpha",upstream="main"'), 4);
  assert.equal(await series('perch_key_upstream_calls_total', 'key_id="bravo",upstream="main"'), 1, 'the stale entry\'s refresh');
  assert.equal(await series('perch_key_upstream_spend_total', 'key_id="alpha",upstream="main"'), 1);
  assert.equal(await series('perch_key_upstream_spend_total', 'key_id="bravo",upstream="main"'), 0.25);
  assert.equal(await series('perch_key_upstream_calls_saved_total', 'key_id="bravo",reason="hit"'), 1);
  assert.equal(await series('perch_key_upstream_calls_saved_total', 'key_id="bravo",reason="coalesced"'), 1);
  assert.equal(await series('perch_key_upstream_calls_saved_total', 'key_id="bravo",reason="stale"'), 1);
  assert.equal(await series('perch_key_upstream_calls_saved_total', 'key_id="alpha",reason="coalesced"'), undefined);

  const lines = perch.logs.lines().filter((l) => l.msg === 'request');
  assert.deepEqual(
    lines.map((l) => [l.key_id, l.cache, l.upstream_call]),
    [
      ['alpha', 'miss', true],
      ['alpha', 'miss', true],
      ['alpha', 'miss', true],
      ['bravo', 'hit', false],
      ['alpha', 'miss', true],
      ['bravo', 'coalesced', false],
      ['bravo', 'stale', false],
    ],
  );
});

test('a miss the call cap refused made no call: upstream_call false, nothing charged', { timeout: 20_000 }, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url, 'max_requests_per_second: 0.001, burst: 1, queue_timeout_ms: 0')));
  assert.equal((await perch.request('/v1/users/1')).status, 200);
  assert.equal((await perch.request('/v1/users/2')).status, 429);
  const lines = perch.logs.lines().filter((l) => l.msg === 'request');
  assert.deepEqual(lines.map((l) => [l.status, l.upstream_call]), [[200, true], [429, false]]);
  assert.equal(await metric(perch, 'perch_key_upstream_calls_total{key_id="alpha",upstream="main"}'), 1);
  assert.equal(await metric(perch, 'perch_key_upstream_spend_total{key_id="alpha",upstream="main"}'), undefined, 'no price_per_call: no spend');
});
