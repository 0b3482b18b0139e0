// Batch lookups (issue 44): misses of user, user_by_username and tweet that wait for X at the
// same time go as one call to /2/users?ids=, /2/users/by?usernames= or /2/tweets?ids=, each
// answered as if it had been asked alone. Over real HTTP against a stand-in for X (fake-x.ts),
// the clock and timers in the test's hand.
import assert from 'node:assert/strict';
import { request as httpRequest } from 'node:http';
import { test, type TestContext } from 'node:test';
import { parseConfig } from '../src/config/load.js';
import { CLOCK_GRANULARITY_MS } from '../src/upstream/guard/provider-state.js';
import { ManualClock } from './helpers/clock.js';
import { fakeX, type FakeX } from './helpers/fake-x.js';
import { KEY, OTHER_KEY, startPerch, testConfig, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { startUpstream, type TestUpstream } from './helpers/upstream-server.js';

const TOKEN = 'AAAAAAAAAAAAAAAAAAAAAPerchBatchTokenOne%2Bxyz';
const USER_QUERY = 'user.fields=created_at,description,location,pinned_tweet_id,profile_image_url,profile_banner_url,protected,public_metrics,url,verified';
const TWEET_QUERY = 'tweet.fields=author_id,attachments,created_at,entities,note_tweet,public_metrics&expansions=author_id,attachments.media_keys&media.fields=preview_image_url,type,url&user.fields=profile_image_url';

interface Setup {
  readonly clock: ManualClock;
  readonly x: FakeX;
  readonly upstream: TestUpstream;
  readonly perch: RunningPerch;
}

function xUpstream(url: string, settings: string): string {
  return `x: { kind: x_v2, url: "${url}", bearer_token: "${TOKEN}", timeout_ms: 2000${settings === '' ? '' : `, ${settings}`} }`;
}

async function setup(t: TestContext, settings = '', extra = '', x: FakeX = fakeX()): Promise<Setup> {
  const clock = new ManualClock();
  const upstream = await startUpstream(t, x.behaviour);
  const perch = await startPerch(t, testConfig(xUpstream(upstream.url, settings), extra), { clock, timers: clock });
  return { clock, x, upstream, perch };
}

/** The path and query perch sent for each call, in order. */
const sent = (upstream: TestUpstream) => upstream.requests.map((r) => r.url);

/** The items of every call X got, in order. */
const asked = (upstream: TestUpstream) => upstream.requests.flatMap((r) => new URL(r.url, 'http://x').searchParams.get('ids')?.split(',') ?? [/^\/2\/users\/([0-9]+)/.exec(r.url)![1]!]);

/** Sends every path at once and waits until `timers` callbacks are pending on the clock: every miss has its seat or its call. */
async function queued(s: Setup, paths: readonly string[], timers: number, key?: string) {
  const pending = paths.map((p) => s.perch.request(p, key === undefined ? {} : { key }));
  await waitFor(() => s.clock.waiting === timers, 1000).catch(() => assert.fail(`waiting ${s.clock.waiting}, not ${timers}`));
  return pending;
}

const accessLines = (perch: RunningPerch) =>
  perch.logs
    .text()
    .split('\n')
    .filter((l) => l.includes('"msg":"request"'))
    .map((l) => JSON.parse(l));

test('misses that wait under the call cap ride together on the next call it admits', { timeout: 10_000 }, async (t) => {
  const s = await setup(t, 'max_requests_per_second: 1, burst: 1, queue_timeout_ms: 5000');
  assert.equal((await s.perch.request('/v1/users/1')).status, 200);
  const ids = Array.from({ length: 10 }, (_, i) => String(i + 2));
  // The first call open for them waits under the cap (its wait and the queue's wake-up); the
  // nine others wait in its seats (a timer each, for their own wait).
  const pending = await queued(s, ids.map((id) => `/v1/users/${id}`), 11);
  assert.equal(s.upstream.requests.length, 1);
  s.clock.advance(1000 + CLOCK_GRANULARITY_MS);
  const results = await Promise.all(pending);
  assert.deepEqual(
    results.map((r) => [r.status, r.json().id]),
    ids.map((id) => [200, id]),
  );
  assert.deepEqual(sent(s.upstream), [`/2/users/1?${USER_QUERY}`, `/2/users?ids=${ids.join(',')}&${USER_QUERY}`]);
  const metrics = await (await fetch(`${s.perch.url}/metrics`)).text();
  assert.match(metrics, /perch_upstream_batch_size_count\{upstream="x",route="user"\} 1\n/);
  assert.match(metrics, /perch_upstream_batch_size_sum\{upstream="x",route="user"\} 10\n/);
  // Nine rode in the call one of them led; all ten and the lone miss are items X bills.
  assert.match(metrics, /perch_key_upstream_calls_saved_total\{key_id="alpha",reason="batched"\} 9\n/);
  assert.match(metrics, /perch_key_upstream_calls_total\{key_id="alpha",upstream="x"\} 11\n/);
  // Two exchanges with X, not eleven.
  assert.match(metrics, /perch_upstream_requests_total\{upstream="x",route="user",outcome="ok"\} 2\n/);
  const batched = accessLines(s.perch).filter((l) => l.batch !== null);
  assert.deepEqual(
    batched.map((l) => [l.path, l.batch, l.upstream_call]),
    ids.map((id) => [`/v1/users/${id}`, 10, true]),
  );
});

test('a lone miss goes at once as the single lookup: no window unless window_ms asks for one', { timeout: 10_000 }, async (t) => {
  const s = await setup(t);
  // The clock never moves: nothing waits on a timer before the call.
  const lone = await s.perch.request('/v1/users/5');
  assert.deepEqual([lone.status, lone.json().id], [200, '5']);
  assert.deepEqual(sent(s.upstream), [`/2/users/5?${USER_QUERY}`]);
  assert.equal(accessLines(s.perch).at(-1).batch, null);

  const windowed = await setup(t, 'batch: { window_ms: 20 }');
  // Its window and its own wait.
  const [pending] = await queued(windowed, ['/v1/users/6'], 2);
  windowed.clock.advance(19);
  assert.equal(windowed.upstream.requests.length, 0);
  windowed.clock.advance(1);
  assert.equal((await pending!).status, 200);
  assert.deepEqual(sent(windowed.upstream), [`/2/users/6?${USER_QUERY}`]);
});

test('each item of a batch is answered as if asked alone: found, not found, suspended, protected, left out', { timeout: 10_000 }, async (t) => {
  const x = fakeX();
  x.notFound.add('3').add('carol');
  x.suspended.add('4');
  x.omitted.add('5');
  x.protectedTweets.add('8');
  const s = await setup(t, 'batch: { window_ms: 10 }', '', x);
  const alone = await setup(t, 'batch: { enabled: false }', '', x);
  const paths = ['/v1/users/2', '/v1/users/3', '/v1/users/4', '/v1/users/5', '/v1/users/6'];
  const names = ['/v1/users/by/username/alice', '/v1/users/by/username/Bob', '/v1/users/by/username/carol'];
  const tweets = ['/v1/tweets/7', '/v1/tweets/8', '/v1/tweets/9'];
  // One window per endpoint, and each miss's own wait.
  const pending = await queued(s, [...paths, ...names, ...tweets], 3 + 11);
  s.clock.advance(10);
  const results = await Promise.all(pending);
  assert.deepEqual(
    results.map((r) => r.status),
    [200, 404, 404, 502, 200, 200, 200, 404, 200, 404, 200],
  );
  assert.deepEqual(results[1]!.json(), { error: { code: 'E404', message: 'User not found' } });
  assert.deepEqual(results[2]!.json(), { error: { code: 'E404', message: 'User not found' } });
  assert.deepEqual(results[3]!.json().error.code, 'E502');
  assert.deepEqual(results[9]!.json().error.code, 'E404');
  assert.deepEqual(
    [...sent(s.upstream)].sort(),
    [`/2/tweets?ids=7,8,9&${TWEET_QUERY}`, `/2/users/by?usernames=alice,bob,carol&${USER_QUERY}`, `/2/users?ids=2,3,4,5,6&${USER_QUERY}`].sort(),
  );
  // The bodies are byte for byte what the single lookups make of the same X.
  for (const i of [0, 4, 5, 6, 8, 10]) {
    const path = [...paths, ...names, ...tweets][i]!;
    assert.equal(results[i]!.text, (await alone.perch.request(path)).text, path);
  }
  // Not found and suspended are cached as 404s are; the item X left out is not cached at all.
  const calls = s.upstream.requests.length;
  assert.equal((await s.perch.request('/v1/users/3')).status, 404);
  assert.equal((await s.perch.request('/v1/users/4')).status, 404);
  assert.equal(s.upstream.requests.length, calls);
  x.omitted.clear();
  const [refetched] = await queued(s, ['/v1/users/5'], 2);
  s.clock.advance(10);
  assert.equal((await refetched!).status, 200);
  assert.deepEqual(sent(s.upstream).slice(calls), [`/2/users/5?${USER_QUERY}`]);
});

test('a batch X refuses whole (400) is split until the item at fault is alone; the others are answered', { timeout: 10_000 }, async (t) => {
  const x = fakeX();
  x.malformed.add('13');
  const s = await setup(t, 'batch: { window_ms: 10 }', '', x);
  const pending = await queued(s, ['/v1/users/2', '/v1/users/13', '/v1/users/4', '/v1/users/5'], 1 + 4);
  s.clock.advance(10);
  const results = await Promise.all(pending);
  assert.deepEqual(
    results.map((r) => r.status),
    [200, 502, 200, 200],
  );
  assert.deepEqual(
    [...sent(s.upstream)].sort(),
    [`/2/users?ids=2,13,4,5&${USER_QUERY}`, `/2/users?ids=2,13&${USER_QUERY}`, `/2/users?ids=4,5&${USER_QUERY}`, `/2/users/2?${USER_QUERY}`, `/2/users/13?${USER_QUERY}`].sort(),
  );
});

test('a batch that fails whole fails each item, caches nothing, and counts once for the breaker and the cool-down', { timeout: 10_000 }, async (t) => {
  const x = fakeX();
  // Two failures in a row would open the breaker: a batch of five is one.
  const s = await setup(t, 'batch: { window_ms: 10 }, breaker: { consecutive_failures: 2 }', '', x);
  x.failWith = { status: 500 };
  let pending = await queued(s, ['/v1/users/2', '/v1/users/3', '/v1/users/4', '/v1/users/5', '/v1/users/6'], 1 + 5);
  s.clock.advance(10);
  assert.deepEqual(
    (await Promise.all(pending)).map((r) => r.status),
    [502, 502, 502, 502, 502],
  );
  assert.equal(s.upstream.requests.length, 1);
  x.failWith = undefined;
  const [retried] = await queued(s, ['/v1/users/2'], 2);
  s.clock.advance(10);
  const again = await retried!;
  assert.deepEqual([again.status, again.json().id], [200, '2']);
  assert.deepEqual(sent(s.upstream).slice(1), [`/2/users/2?${USER_QUERY}`]);

  // A 429 on a batch stops the endpoint once, for every item, with X's wait.
  x.failWith = { status: 429, headers: { 'retry-after': '30' } };
  pending = await queued(s, ['/v1/users/7', '/v1/users/8', '/v1/users/9'], 1 + 3);
  s.clock.advance(10);
  const limited = await Promise.all(pending);
  assert.deepEqual(
    limited.map((r) => [r.status, r.headers.get('retry-after')]),
    [
      [429, '30'],
      [429, '30'],
      [429, '30'],
    ],
  );
  assert.equal(s.upstream.requests.length, 3);
  // The cool-down holds: the next miss is refused without a call.
  const [next] = await queued(s, ['/v1/users/10'], 2);
  s.clock.advance(10);
  assert.equal((await next!).status, 429);
  assert.equal(s.upstream.requests.length, 3);
});

test('a batch answer in which no item could be answered weighs on the breaker as a single failure would', { timeout: 10_000 }, async (t) => {
  const x = fakeX();
  x.unknownError.add('2').add('3');
  const s = await setup(t, 'batch: { window_ms: 10 }, breaker: { consecutive_failures: 1 }', '', x);
  const pending = await queued(s, ['/v1/users/2', '/v1/users/3'], 1 + 2);
  s.clock.advance(10);
  assert.deepEqual(
    (await Promise.all(pending)).map((r) => [r.status, r.json().error.code]),
    [
      [502, 'E502'],
      [502, 'E502'],
    ],
  );
  // One failure opens this breaker: the next miss is refused without a call.
  const [next] = await queued(s, ['/v1/users/4'], 2);
  s.clock.advance(10);
  assert.equal((await next!).status, 502);
  assert.equal(s.upstream.requests.length, 1);
  const metrics = await (await fetch(`${s.perch.url}/metrics`)).text();
  assert.match(metrics, /perch_upstream_refused_total\{upstream="x",route="user",reason="breaker_open"\} 1\n/);
});

test("the seats of a batch go in fair order across keys: a key's two misses are not pushed out by another's backlog", { timeout: 10_000 }, async (t) => {
  const s = await setup(t, 'max_requests_per_second: 1, burst: 1, queue_timeout_ms: 5000, batch: { max_items: 4, window_ms: 10 }');
  // alpha's six misses, then bravo's two, all within the window.
  const crawler = await queued(s, [2, 3, 4, 5, 6, 7].map((id) => `/v1/users/${id}`), 1 + 6);
  const app = await queued(s, ['/v1/users/8', '/v1/users/9'], 1 + 8, OTHER_KEY);
  s.clock.advance(10);
  // The first call takes alpha's first miss and, in fair order, bravo's two among its seats; the
  // second call, opened behind it, is led by alpha's last.
  await Promise.all(app);
  assert.deepEqual(sent(s.upstream), [`/2/users?ids=2,8,3,9&${USER_QUERY}`]);
  // The second call under the cap (its wait and the queue's wake-up), its three seats taken.
  await waitFor(() => s.clock.waiting === 2 + 3);
  s.clock.advance(1000 + CLOCK_GRANULARITY_MS);
  await Promise.all(crawler);
  assert.deepEqual(sent(s.upstream).slice(1), [`/2/users?ids=7,4,5,6&${USER_QUERY}`]);
});

test('a backlog of 150 misses of one key leaves the next batch room for two of another', { timeout: 10_000 }, async (t) => {
  const s = await setup(t, 'max_requests_per_second: 1, burst: 1, queue_timeout_ms: 5000, batch: { window_ms: 10 }');
  const crawler = await queued(s, Array.from({ length: 150 }, (_, i) => `/v1/users/${1000 + i}`), 1 + 150);
  const app = await queued(s, ['/v1/users/8', '/v1/users/9'], 1 + 152, OTHER_KEY);
  s.clock.advance(10);
  await Promise.all(app);
  const first = new URL(sent(s.upstream)[0]!, 'http://x').searchParams.get('ids')!.split(',');
  assert.equal(first.length, 100);
  assert.deepEqual(first.slice(0, 5), ['1000', '8', '1001', '9', '1002']);
  // The second call under the cap, led by the last miss, and the 51 that wait for its seats.
  await waitFor(() => s.clock.waiting === 2 + 51);
  s.clock.advance(1000 + CLOCK_GRANULARITY_MS);
  assert.deepEqual(
    (await Promise.all(crawler)).map((r) => r.status),
    Array.from({ length: 150 }, () => 200),
  );
  assert.equal(s.upstream.requests.length, 2);
});

test("each miss in a batch is charged to its key's provider-call budget, one item each", { timeout: 10_000 }, async (t) => {
  const yaml = (url: string) =>
    testConfig(xUpstream(url, 'batch: { window_ms: 10 }'))
      .replace('{ id: alpha, key: "test-key-alpha-0123456789", plan: big }', '{ id: alpha, key: "test-key-alpha-0123456789", plan: metered }')
      .replace('rate_limits:\n', 'rate_limits:\n  metered: { capacity: 100000, refill_per_second: 100000, provider_calls: { limit: 3, window: day } }\n');
  const clock = new ManualClock();
  const x = fakeX();
  const upstream = await startUpstream(t, x.behaviour);
  const perch = await startPerch(t, yaml(upstream.url), { clock, timers: clock });
  const s = { clock, x, upstream, perch };
  const pending = await queued(s, ['/v1/users/2', '/v1/users/3', '/v1/users/4'], 1 + 3);
  clock.advance(10);
  assert.deepEqual(
    (await Promise.all(pending)).map((r) => r.status),
    [200, 200, 200],
  );
  assert.equal(upstream.requests.length, 1);
  // Three items billed: the budget of three is spent, though X saw one call.
  const spent = await perch.request('/v1/users/5');
  assert.equal(spent.status, 429);
  assert.equal(upstream.requests.length, 1);
});

test("a seat whose wait runs out gets 429 with Retry-After, as in the cap's queue", { timeout: 10_000 }, async (t) => {
  const s = await setup(t, 'max_requests_per_second: 1, burst: 1, queue_timeout_ms: 500');
  assert.equal((await s.perch.request('/v1/users/1')).status, 200);
  const pending = await queued(s, ['/v1/users/2', '/v1/users/3', '/v1/users/4'], 2 + 2);
  s.clock.advance(500);
  const results = await Promise.all(pending);
  assert.deepEqual(
    results.map((r) => [r.status, r.headers.get('retry-after')]),
    [
      [429, '1'],
      [429, '1'],
      [429, '1'],
    ],
  );
  assert.equal(s.upstream.requests.length, 1);
  const metrics = await (await fetch(`${s.perch.url}/metrics`)).text();
  assert.match(metrics, /perch_upstream_refused_total\{upstream="x",route="user",reason="over_cap"\} 3\n/);
});

test('at most queue_size misses wait beyond the seats of the next call: past that the one due last is refused at once', { timeout: 10_000 }, async (t) => {
  // queue_size 2 and 3 seats a call: five may wait.
  const s = await setup(t, 'queue_size: 2, batch: { max_items: 3, window_ms: 10 }');
  // One after another, each waiting (the window, then a timer each for its own wait).
  const crawler = [];
  for (const id of [1, 2, 3, 4, 5]) {
    crawler.push(s.perch.request(`/v1/users/${id}`));
    await waitFor(() => s.clock.waiting === 1 + id);
  }
  // The next three are refused without waiting.
  for (const id of [6, 7, 8]) {
    const refused = await s.perch.request(`/v1/users/${id}`);
    assert.deepEqual([refused.status, refused.headers.get('retry-after')], [429, '1']);
  }
  assert.equal(s.clock.waiting, 1 + 5);
  // bravo's miss is due before alpha's fifth: that one makes room.
  const app = s.perch.request('/v1/users/9', { key: OTHER_KEY });
  assert.equal((await crawler[4]!).status, 429);
  s.clock.advance(10);
  assert.deepEqual(
    (await Promise.all([...crawler.slice(0, 4), app])).map((r) => r.status),
    [200, 200, 200, 200, 200],
  );
  assert.deepEqual(sent(s.upstream).sort(), [`/2/users?ids=1,9,2&${USER_QUERY}`, `/2/users?ids=4,3&${USER_QUERY}`].sort());
  assert.equal(s.upstream.requests.length, 2);
});

test('a bug below the batch layer is 500 E500 for every miss of the call, and perch keeps serving', { timeout: 10_000 }, async (t) => {
  // The stand-in for a bug inside perch: the clock throws once the answer is being read.
  class BreakableClock extends ManualClock {
    broken = false;
    override now(): number {
      if (this.broken) throw new Error('clock exploded: secret internals');
      return super.now();
    }
  }
  const clock = new BreakableClock();
  const x = fakeX();
  const upstream = await startUpstream(t, x.behaviour);
  const perch = await startPerch(t, testConfig(xUpstream(upstream.url, 'batch: { window_ms: 10 }')), { clock, timers: clock });
  x.hold = true;
  const pending = ['/v1/users/2', '/v1/users/3'].map((p) => perch.request(p));
  await waitFor(() => clock.waiting === 1 + 2);
  clock.advance(10);
  await waitFor(() => x.held.length === 1);
  clock.broken = true;
  x.hold = false;
  x.held.shift()!();
  const results = await Promise.all(pending);
  assert.deepEqual(
    results.map((r) => [r.status, r.json().error.code]),
    [
      [500, 'E500'],
      [500, 'E500'],
    ],
  );
  clock.broken = false;
  const again = perch.request('/v1/users/4');
  await waitFor(() => clock.waiting === 2);
  clock.advance(10);
  assert.equal((await again).status, 200);
});

test('a second key on the same miss joins its flight: the item is asked once, in the batch', { timeout: 10_000 }, async (t) => {
  const s = await setup(t, 'batch: { window_ms: 10 }');
  const alpha = await queued(s, ['/v1/users/2', '/v1/users/3'], 1 + 2);
  // bravo's miss on 2 coalesces onto alpha's flight: no seat, no timer of its own.
  const bravo = s.perch.request('/v1/users/2', { key: OTHER_KEY });
  await waitFor(() => s.perch.received() === 3);
  s.clock.advance(10);
  const results = await Promise.all([...alpha, bravo]);
  assert.deepEqual(
    results.map((r) => [r.status, r.json().id, r.headers.get('cache-status')]),
    [
      [200, '2', 'perch; fwd=miss; stored'],
      [200, '3', 'perch; fwd=miss; stored'],
      [200, '2', 'perch; fwd=miss; collapsed; stored'],
    ],
  );
  assert.deepEqual(sent(s.upstream), [`/2/users?ids=2,3&${USER_QUERY}`]);
});

test('a client that leaves while its miss waits for a seat: the item still rides, and its answer is cached', { timeout: 10_000 }, async (t) => {
  const s = await setup(t, 'max_requests_per_second: 1, burst: 1, queue_timeout_ms: 5000');
  assert.equal((await s.perch.request('/v1/users/1')).status, 200);
  const staying = await queued(s, ['/v1/users/2'], 2);
  const leaving = httpRequest(`${s.perch.url}/v1/users/3`, { headers: { 'x-api-key': KEY }, agent: false });
  const closed = new Promise((resolve) => leaving.on('error', resolve).on('close', resolve));
  leaving.end();
  await waitFor(() => s.clock.waiting === 3);
  leaving.destroy();
  await closed;
  s.clock.advance(1000 + CLOCK_GRANULARITY_MS);
  assert.equal((await staying[0]!).status, 200);
  assert.deepEqual(sent(s.upstream).slice(1), [`/2/users?ids=2,3&${USER_QUERY}`]);
  const later = await s.perch.request('/v1/users/3');
  assert.deepEqual([later.status, later.json().id, later.headers.get('cache-status')?.startsWith('perch; hit')], [200, '3', true]);
  assert.equal(s.upstream.requests.length, 2);
});

test('a reload while misses wait for a seat: they ride the call of the set they joined, later misses the new set', { timeout: 10_000 }, async (t) => {
  const settings = 'max_requests_per_second: 1, burst: 1, queue_timeout_ms: 5000';
  const s = await setup(t, settings);
  assert.equal((await s.perch.request('/v1/users/1')).status, 200);
  const before = await queued(s, ['/v1/users/2', '/v1/users/3', '/v1/users/4'], 2 + 2);
  s.perch.reload(testConfig(xUpstream(s.upstream.url, `${settings}, batch: { max_items: 2 }`)));
  // The new set's call waits under the same cap: the provider's state outlives a reload.
  const after = await queued(s, ['/v1/users/5', '/v1/users/6'], 2 + 2 + 3);
  s.clock.advance(1000 + CLOCK_GRANULARITY_MS);
  await Promise.all(before);
  // The end of the old set's call wakes only the old set's queue: the new one asks again when
  // the cap's estimate, made while that call was in flight, runs out (within three seconds).
  for (let second = 0; s.upstream.requests.length < 3; second++) {
    assert.ok(second < 3, 'the new set made its call');
    s.clock.advance(1000);
    await waitFor(() => s.upstream.requests.length === 3 || s.clock.waiting === 3);
  }
  const results = await Promise.all([...before, ...after]);
  assert.deepEqual(
    results.map((r) => [r.status, r.json().id]),
    ['2', '3', '4', '5', '6'].map((id) => [200, id]),
  );
  assert.deepEqual(sent(s.upstream).slice(1).sort(), [`/2/users?ids=2,3,4&${USER_QUERY}`, `/2/users?ids=5,6&${USER_QUERY}`].sort());
});

test(`a pass-through key's misses never share a call: each key is its own credential`, { timeout: 10_000 }, async (t) => {
  const x = fakeX();
  const upstream = await startUpstream(t, x.behaviour);
  const clock = new ManualClock();
  const yaml = `
server: { host: 127.0.0.1, port: 0 }
auth: { mode: upstream, default_plan: resale }
rate_limits: { resale: { capacity: 1000, refill_per_second: 1000 } }
upstreams: { x: { kind: x_v2, url: "${upstream.url}", timeout_ms: 2000, batch: { window_ms: 10 } } }
`;
  const perch = await startPerch(t, yaml, { clock, timers: clock });
  const [one, two] = ['AAAAAAAAAAAAAAAAAAAAAPassThroughKeyOne0001', 'AAAAAAAAAAAAAAAAAAAAAPassThroughKeyTwo0002'];
  // Each key's first request verifies it (who it speaks for, then the lookup); then both keys
  // miss at once, within what would be a window.
  assert.equal((await perch.request('/v1/users/1', { key: one })).status, 200);
  assert.equal((await perch.request('/v1/users/2', { key: two })).status, 200);
  const results = await Promise.all([perch.request('/v1/users/3', { key: one }), perch.request('/v1/users/4', { key: two })]);
  assert.deepEqual(
    results.map((r) => r.status),
    [200, 200],
  );
  assert.deepEqual(
    upstream.requests.slice(4).map((r) => [r.url, r.headers.authorization]).sort(),
    [
      [`/2/users/3?${USER_QUERY}`, `Bearer ${one}`],
      [`/2/users/4?${USER_QUERY}`, `Bearer ${two}`],
    ],
  );
});

test('two instances on one Redis: an item in flight on one is not asked again by the other', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const x = fakeX();
  const upstream = await startUpstream(t, x.behaviour);
  const start = async () => {
    const perch = await startPerch(t, testConfig(xUpstream(upstream.url, 'batch: { window_ms: 50 }'), `cache: { redis: { url: "${redis.url}", prefix: "b:" } }`));
    await waitFor(() => perch.cache.redisConnected === true);
    return perch;
  };
  const a = await start();
  const b = await start();
  x.hold = true;
  const first = ['1', '2', '3'].map((id) => a.request(`/v1/users/${id}`));
  await waitFor(() => asked(upstream).length === 3);
  const second = ['2', '3', '4'].map((id) => b.request(`/v1/users/${id}`));
  await waitFor(() => asked(upstream).length === 4);
  x.hold = false;
  for (const release of x.held.splice(0)) release();
  const results = await Promise.all([...first, ...second]);
  assert.deepEqual(
    results.map((r) => [r.status, r.json().id]),
    ['1', '2', '3', '2', '3', '4'].map((id) => [200, id]),
  );
  // b asked X only for the item a was not already fetching: each item once.
  assert.deepEqual(asked(upstream).sort(), ['1', '2', '3', '4']);
  assert.ok(sent(upstream).some((url) => url.startsWith('/2/users?ids=')), 'a batched');
});

test('batch is an x_v2 key: other kinds refuse it by name, and its bounds are checked', () => {
  const v1 = (batch: string) => testConfig(`main: { kind: v1, url: "http://127.0.0.1:1", ${batch} }`);
  assert.throws(() => parseConfig(v1('batch: { enabled: true }'), {}), /upstreams\.main\.batch: batch lookups are the X API v2's .*only an x_v2 upstream takes batch/);
  assert.throws(() => parseConfig(testConfig('main: { kind: fixture, batch: {} }'), {}), /upstreams\.main\.batch: unknown key \(a fixture upstream takes no other keys\)/);
  const x = (batch: string) => testConfig(xUpstream('http://127.0.0.1:1', batch));
  assert.throws(() => parseConfig(x('batch: { max_items: 101 }'), {}), /upstreams\.x\.batch\.max_items/);
  assert.throws(() => parseConfig(x('batch: { max_items: 0 }'), {}), /upstreams\.x\.batch\.max_items/);
  assert.throws(() => parseConfig(x('batch: { window_ms: 51 }'), {}), /upstreams\.x\.batch\.window_ms/);
  const config = parseConfig(x(''), {});
  const upstream = config.upstreams.x!;
  assert.ok(upstream.kind === 'x_v2');
  assert.deepEqual(upstream.batch, { enabled: true, max_items: 100, window_ms: 0 });
});
