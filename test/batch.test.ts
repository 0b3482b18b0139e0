// Batch lookups (issue 44): misses of user, user_by_username and tweet that wait for X at the
// same time go as one call to /2/users?ids=, /2/users/by?usernames= or /2/tweets?ids=, each
// answered as if it had been asked alone. Over real HTTP against a stand-in for X (fake-x.ts),
// the clock and timers in the test's hand.
import assert from 'node:assert/strict';
import { request as httpRequest } from 'node:http';
import { test, type TestContext } from 'node:test';
import { parseConfig } from '../src/config/load.js';
import { createBatching } from '../src/upstream/batch.js';
import { NO_EVENTS } from '../src/upstream/events.js';
import { CLOCK_GRANULARITY_MS } from '../src/upstream/guard/provider-state.js';
import type { Attempt, UpstreamResult } from '../src/upstream/upstream.js';
import { ManualClock } from './helpers/clock.js';
import { fakeX, type FakeX } from './helpers/fake-x.js';
import { captureLogs } from './helpers/log-capture.js';
import { KEY, OTHER_KEY, metric, startPerch, testConfig, waitFor, type RunningPerch } from './helpers/perch.js';
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

test("seats that waited for company wait over the cap from when the cap refuses their call, queue_timeout_ms from then", { timeout: 10_000 }, async (t) => {
  const s = await setup(t, 'max_requests_per_second: 1, burst: 1, queue_timeout_ms: 500, batch: { window_ms: 10 }');
  const first = await queued(s, ['/v1/users/1'], 2);
  s.clock.advance(10);
  assert.equal((await first[0]!).status, 200);
  // Three in a window (its timer and one each, for their deadlines).
  const pending = await queued(s, ['/v1/users/2', '/v1/users/3', '/v1/users/4'], 1 + 3);
  // The window ends: 2 leads a call the cap refuses (its wait and the queue's wake-up), and the
  // seats of 3 and 4 wait over the cap from now.
  s.clock.advance(10);
  await waitFor(() => s.clock.waiting === 2 + 2);
  // A refusal is counted as it is made: none yet.
  s.clock.advance(499);
  assert.equal(await metric(s.perch, 'perch_upstream_refused_total{upstream="x",route="user",reason="over_cap"}'), undefined);
  s.clock.advance(1);
  assert.deepEqual(
    (await Promise.all(pending)).map((r) => [r.status, r.headers.get('retry-after')]),
    [
      [429, '1'],
      [429, '1'],
      [429, '1'],
    ],
  );
  assert.equal(s.upstream.requests.length, 1);
});

test('over the cap, at most queue_size misses wait beyond the seats of the next call: past that the one due last is refused at once', { timeout: 10_000 }, async (t) => {
  // queue_size 2 and 4 items a call: six may wait for a seat while the cap refuses.
  const s = await setup(t, 'max_requests_per_second: 1, burst: 1, queue_timeout_ms: 5000, queue_size: 2, batch: { max_items: 4 }');
  assert.equal((await s.perch.request('/v1/users/100')).status, 200);
  // One after another: 1 leads a call that waits under the cap (its wait and the queue's
  // wake-up), 2-4 take its seats, 5 leads a second call (the last in fair order), 6-8 its seats.
  const crawler = [];
  for (const [id, timers] of [[1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 8], [8, 9]] as const) {
    crawler.push(s.perch.request(`/v1/users/${id}`));
    await waitFor(() => s.clock.waiting === timers);
  }
  // Six wait for a seat: the next is refused without waiting.
  const refused = await s.perch.request('/v1/users/9');
  assert.deepEqual([refused.status, refused.headers.get('retry-after')], [429, '1']);
  assert.equal(s.clock.waiting, 9);
  // bravo's miss is due before alpha's last: that one makes room.
  const app = s.perch.request('/v1/users/10', { key: OTHER_KEY });
  assert.equal((await crawler[7]!).status, 429);
  s.clock.advance(1000 + CLOCK_GRANULARITY_MS);
  await waitFor(() => s.upstream.requests.length === 2);
  s.clock.advance(1000 + CLOCK_GRANULARITY_MS);
  assert.deepEqual(
    (await Promise.all([...crawler.slice(0, 7), app])).map((r) => r.status),
    [200, 200, 200, 200, 200, 200, 200, 200],
  );
  assert.deepEqual(sent(s.upstream).slice(1), [`/2/users?ids=1,10,2,3&${USER_QUERY}`, `/2/users?ids=5,4,6,7&${USER_QUERY}`]);
});

test('waiting for company is not waiting over the cap: misses in the window are not bounded by queue_size, nor by queue_timeout_ms', { timeout: 10_000 }, async (t) => {
  const s = await setup(t, 'queue_size: 2, queue_timeout_ms: 10, batch: { max_items: 3, window_ms: 20 }');
  const ids = ['1', '2', '3', '4', '5', '6', '7', '8'];
  // The window and a timer each, for its deadline.
  const pending = await queued(s, ids.map((id) => `/v1/users/${id}`), 1 + 8);
  s.clock.advance(20);
  assert.deepEqual(
    (await Promise.all(pending)).map((r) => [r.status, r.json().id]),
    ids.map((id) => [200, id]),
  );
  assert.deepEqual(sent(s.upstream), [`/2/users?ids=1,2,3&${USER_QUERY}`, `/2/users?ids=8,4,5&${USER_QUERY}`, `/2/users?ids=7,6&${USER_QUERY}`]);
  // A lone lookup of each kind, each alone in its window.
  const lone = await queued(s, ['/v1/users/20', '/v1/users/by/username/alice', '/v1/tweets/21'], 3 * 2);
  s.clock.advance(20);
  assert.deepEqual(
    (await Promise.all(lone)).map((r) => r.status),
    [200, 200, 200],
  );
  const metrics = await (await fetch(`${s.perch.url}/metrics`)).text();
  assert.doesNotMatch(metrics, /perch_upstream_refused_total\{upstream="x"/);
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
  // The new set's call waits under the same cap and in the same guard queue: the provider's
  // state and its queue outlive a reload, so the new set adds its seat's timers, not a queue's.
  const after = await queued(s, ['/v1/users/5', '/v1/users/6'], 2 + 2 + 2);
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
  // A lone miss waits its window within its deadline, which must leave its call twice the floor
  // and at least MIN_CALL_MS (50 ms).
  const deadline = (ms: number, window = 50) => x(`batch: { window_ms: ${window} }`).replace('server: { host: 127.0.0.1, port: 0 }', `server: { host: 127.0.0.1, port: 0, miss_deadline_ms: ${ms} }`);
  assert.throws(() => parseConfig(deadline(55), {}), /upstreams\.x\.batch\.window_ms: leaves a lone miss less than the 50 ms a call needs of server\.miss_deadline_ms \(55\): at most 5/);
  assert.throws(() => parseConfig(deadline(99), {}), /server\.miss_deadline_ms \(99\): at most 49/);
  assert.throws(() => parseConfig(deadline(20, 18), {}), /server\.miss_deadline_ms \(20\): at most 0/);
  assert.equal(parseConfig(deadline(100), {}).server.miss_deadline_ms, 100);
  assert.equal(parseConfig(deadline(55, 5), {}).server.miss_deadline_ms, 55);
  const config = parseConfig(x(''), {});
  const upstream = config.upstreams.x!;
  assert.ok(upstream.kind === 'x_v2');
  assert.deepEqual(upstream.batch, { enabled: true, max_items: 100, window_ms: 0 });
});

// Issue 59: batch lookups under every setting.

test('with queue_timeout_ms: 0 and the cap in Redis, misses that arrive during the lead\'s admission ride along, none refused', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const x = fakeX();
  const upstream = await startUpstream(t, x.behaviour);
  // The system clock and timers: the lead's admission is a real round trip to Redis.
  const perch = await startPerch(t, testConfig(xUpstream(upstream.url, 'queue_timeout_ms: 0, max_concurrent: 50'), `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 2000 }`));
  const ids = Array.from({ length: 40 }, (_, i) => String(100 + i));
  const results = await Promise.all(ids.map((id) => perch.request(`/v1/users/${id}`)));
  assert.deepEqual(
    results.map((r) => [r.status, r.json().id]),
    ids.map((id) => [200, id]),
  );
  assert.equal(await metric(perch, 'perch_upstream_refused_total{upstream="x",route="user",reason="over_cap"}'), undefined);
  assert.deepEqual(asked(upstream).sort(), ids);
});

/**
 * X behind a primary that hangs on user 1 until its timeout (2 s) and fails the others at once,
 * with a miss deadline of 3 s: user 1 reaches X with about 1 of its 3 seconds left, the others
 * with all of theirs.
 */
async function behindSlowPrimary(t: TestContext, settings = '') {
  const clock = new ManualClock();
  const primary = await startUpstream(t, (req, res) => {
    if (req.url !== '/v1/users/1') res.writeHead(500).end();
  });
  const x = fakeX();
  const upstream = await startUpstream(t, x.behaviour);
  const yaml = testConfig(
    `primary: { kind: v1, url: "${primary.url}", timeout_ms: 2000, retries: 0 }\nx: { kind: x_v2, url: "${upstream.url}", bearer_token: "${TOKEN}", timeout_ms: 10000, retries: 1, ${settings === '' ? '' : `${settings}, `}batch: { window_ms: 50 } }`,
    'routes: { user: [primary, x] }',
  ).replace('server: { host: 127.0.0.1, port: 0 }', 'server: { host: 127.0.0.1, port: 0, miss_deadline_ms: 3000 }');
  const perch = await startPerch(t, yaml, { clock, timers: clock });
  return { clock, x, upstream, perch };
}

test('a rider near its deadline does not cut the call short: it is answered 504 alone, the call goes on for the others, and no call leaves without time', { timeout: 30_000 }, async (t) => {
  const { clock, x, upstream, perch } = await behindSlowPrimary(t);
  // A miss of bravo's first, so that bravo's next is due after alpha's first in fair order.
  const warm = perch.request('/v1/users/100', { key: OTHER_KEY });
  await waitFor(() => clock.waiting === 2);
  clock.advance(50);
  assert.equal((await warm).status, 200);
  // bravo's user 1 fails over into a window (its own timer and the window's), then alpha's
  // fresh misses: user 2 leads the call, user 1 rides in it with the least time.
  const started = performance.now();
  const old = perch.request('/v1/users/1', { key: OTHER_KEY });
  await waitFor(() => clock.waiting === 2, 10_000);
  const fresh = [];
  for (const id of [2, 3, 4, 5, 6]) {
    fresh.push(perch.request(`/v1/users/${id}`));
    await waitFor(() => clock.waiting === id + 1);
  }
  x.hold = true;
  clock.advance(50);
  await waitFor(() => x.held.length === 1);
  assert.equal(sent(upstream)[1], `/2/users?ids=2,1,3,4,5,6&${USER_QUERY}`);
  // Time passes until user 1's deadline (about 1 s away), short of the others' (about 3 s): its
  // timer, the first of the riders' to fall due, has run.
  const riders = clock.waiting;
  for (let ms = 0; clock.waiting === riders && ms < 2000; ms += 250) clock.advance(250);
  assert.equal(clock.waiting, riders - 1, 'one rider answered alone');
  const late = await old;
  assert.deepEqual([late.status, late.json().error.code], [504, 'E504']);
  // X answers once user 1's deadline has passed for real too (it started a little after the
  // request did).
  await waitFor(() => performance.now() > started + 3000 + 200);
  x.hold = false;
  x.held.shift()!();
  assert.deepEqual(
    (await Promise.all(fresh)).map((r) => [r.status, r.json().id]),
    ['2', '3', '4', '5', '6'].map((id) => [200, id]),
  );
  // One batch call, answered: none that perch gave up on.
  assert.equal(upstream.requests.length, 2);
  assert.deepEqual(x.abandoned, []);
});

test("a batch call's retry is weighed against its latest rider's deadline, not its lead's", { timeout: 30_000 }, async (t) => {
  // A backoff of 0: the retry goes at once.
  const { clock, x, upstream, perch } = await behindSlowPrimary(t, 'retry_backoff_ms: 1, retry_backoff_max_ms: 1');
  // The retry budget's floor grows a retry per 100 ms from the start.
  clock.advance(1000);
  const started = performance.now();
  // User 1 leads the call (first in its window), the fresh misses ride in it.
  const old = perch.request('/v1/users/1');
  await waitFor(() => clock.waiting === 2, 10_000);
  const fresh = [];
  for (const id of [2, 3, 4, 5]) {
    fresh.push(perch.request(`/v1/users/${id}`));
    await waitFor(() => clock.waiting === id + 1);
  }
  x.hold = true;
  clock.advance(50);
  await waitFor(() => x.held.length === 1);
  assert.equal(sent(upstream)[0], `/2/users?ids=1,2,3,4,5&${USER_QUERY}`);
  // The lead's deadline passes (its rider's timer, then the real time, which started a little
  // after the request did), the others' does not.
  clock.advance(1500);
  assert.equal((await old).status, 504);
  await waitFor(() => performance.now() > started + 3000 + 200);
  // X answers the call 502: the retry goes, for the riders that still have time.
  x.failWith = { status: 502 };
  x.hold = false;
  x.held.shift()!();
  x.failWith = undefined;
  assert.deepEqual(
    (await Promise.all(fresh)).map((r) => [r.status, r.json().id]),
    ['2', '3', '4', '5'].map((id) => [200, id]),
  );
  assert.deepEqual(sent(upstream), [`/2/users?ids=1,2,3,4,5&${USER_QUERY}`, `/2/users?ids=1,2,3,4,5&${USER_QUERY}`]);
  assert.deepEqual(x.abandoned, []);
});

/** 100 misses (`users/1000`..`1099`, or `n`) of alpha in one window, answered; X's calls, and the statuses in order. */
async function windowOf(t: TestContext, x: FakeX, settings = '', n = 100) {
  const s = await setup(t, `batch: { window_ms: 10 }${settings}`, '', x);
  const ids = Array.from({ length: n }, (_, i) => String(1000 + i));
  const pending = await queued(s, ids.map((id) => `/v1/users/${id}`), 1 + n);
  s.clock.advance(10);
  const statuses = (await Promise.all(pending)).map((r) => r.status);
  return { s, ids, statuses };
}

test('a batch X refuses whole for k items is searched in at most k * (ceil(log2 n) + 2) + 1 calls: every valid item answered', { timeout: 30_000 }, async (t) => {
  for (const [atFault, calls] of [
    [[], 1],
    [['1050'], 9],
    [['1010', '1050', '1090'], 25],
    // The worst placement of three among 100: the bound, 3 * (7 + 2) + 1.
    [['1001', '1030', '1070'], 28],
  ] as const) {
    const x = fakeX();
    for (const id of atFault) x.malformed.add(id);
    const { s, ids, statuses } = await windowOf(t, x);
    assert.deepEqual(
      statuses,
      ids.map((id) => ((atFault as readonly string[]).includes(id) ? 502 : 200)),
    );
    assert.equal(s.upstream.requests.length, calls, `${atFault.length} at fault`);
    // Each item at fault was asked alone, as its single lookup.
    for (const id of atFault) assert.ok(sent(s.upstream).includes(`/2/users/${id}?${USER_QUERY}`));
  }
});

test('when X refuses every call, a batch counts for the breaker as the single lookups would: it opens as soon', { timeout: 30_000 }, async (t) => {
  const breakerOpens = async (batching: boolean) => {
    const x = fakeX();
    x.failWith = { status: 400 };
    const s = await setup(t, `batch: { enabled: ${batching}, window_ms: 10 }`, '', x);
    const ids = Array.from({ length: 100 }, (_, i) => `/v1/users/${1000 + i}`);
    const pending = batching ? await queued(s, ids, 1 + 100) : ids.map((p) => s.perch.request(p));
    s.clock.advance(10);
    assert.deepEqual(new Set((await Promise.all(pending)).map((r) => r.status)), new Set([502]));
    assert.ok((await metric(s.perch, 'perch_upstream_refused_total{upstream="x",route="user",reason="breaker_open"}'))! > 0);
    return s.upstream.requests.length;
  };
  const alone = await breakerOpens(false);
  // Twenty failures in a row open the breaker (its default): one batch and nineteen calls of its search.
  assert.equal(await breakerOpens(true), 20);
  assert.ok(alone >= 20, `batching off: ${alone} calls`);
});

test("a split's 400s count as failures only until a call of it is answered: items at fault do not open the breaker of an X that serves", { timeout: 10_000 }, async (t) => {
  const x = fakeX();
  x.malformed.add('1004').add('1005');
  // Three failures in a row would open it; the split's answered calls come between.
  const { s, ids, statuses } = await windowOf(t, x, ', breaker: { consecutive_failures: 3 }', 8);
  assert.deepEqual(
    statuses,
    ids.map((id) => (id === '1004' || id === '1005' ? 502 : 200)),
  );
  assert.deepEqual(
    sent(s.upstream).map((url) => new URL(url, 'http://x').searchParams.get('ids') ?? /^\/2\/users\/([0-9]+)/.exec(url)![1]),
    ['1000,1001,1002,1003,1004,1005,1006,1007', '1000,1001,1002,1003', '1004,1005', '1004', '1006,1007,1005', '1006,1007', '1005'],
  );
  assert.equal(await metric(s.perch, 'perch_upstream_refused_total{upstream="x",route="user",reason="breaker_open"}'), undefined);
});

test("the throttle counts a batch's 400 neither way: the search's own calls are not shed", { timeout: 10_000 }, async (t) => {
  const x = fakeX();
  x.malformed.add('1000');
  const upstream = await startUpstream(t, x.behaviour);
  const clock = new ManualClock();
  // Three failures would make the throttle shed every call (its draw is 0); the breaker waits for 100.
  const settings = 'batch: { window_ms: 10 }, throttle: { min_calls: 3 }, breaker: { consecutive_failures: 100 }';
  const perch = await startPerch(t, testConfig(xUpstream(upstream.url, settings)), { clock, timers: clock, random: () => 0 });
  const s = { clock, x, upstream, perch };
  const ids = Array.from({ length: 8 }, (_, i) => String(1000 + i));
  const pending = await queued(s, ids.map((id) => `/v1/users/${id}`), 1 + 8);
  clock.advance(10);
  assert.deepEqual(
    (await Promise.all(pending)).map((r) => r.status),
    ids.map((id) => (id === '1000' ? 502 : 200)),
  );
  // The batch, its first half, its first quarter, 1000 alone, and the rest together.
  assert.equal(upstream.requests.length, 5);
  assert.equal(await metric(perch, 'perch_upstream_refused_total{upstream="x",route="user",reason="throttled"}'), undefined);
});

test('the search stops where the deadline does: items whose deadlines passed are answered 504, and no call is made for them', { timeout: 30_000 }, async (t) => {
  const x = fakeX();
  x.malformed.add('1002');
  const s = await setup(t, 'batch: { window_ms: 10 }', '', x);
  const pending = await queued(s, ['/v1/users/1000', '/v1/users/1001', '/v1/users/1002', '/v1/users/1003'], 1 + 4);
  x.hold = true;
  s.clock.advance(10);
  await waitFor(() => x.held.length === 1);
  x.held.shift()!();
  // The batch's 400; its first half is asked.
  await waitFor(() => x.held.length === 1);
  // Past every deadline (miss_deadline_ms, 10 s): each rider is answered alone.
  s.clock.advance(10_000);
  assert.deepEqual(
    (await Promise.all(pending)).map((r) => r.status),
    [504, 504, 504, 504],
  );
  x.hold = false;
  x.held.shift()!();
  // A later miss's call follows whatever the search would still have asked.
  const [later] = await queued(s, ['/v1/users/2000'], 2);
  s.clock.advance(10);
  assert.equal((await later!).status, 200);
  assert.deepEqual(sent(s.upstream), [`/2/users?ids=1000,1001,1002,1003&${USER_QUERY}`, `/2/users?ids=1000,1001&${USER_QUERY}`, `/2/users/2000?${USER_QUERY}`]);
});

test('per-key calls and spend count each miss once, whatever its call\'s retries and splits', { timeout: 30_000 }, async (t) => {
  const x = fakeX();
  x.malformed.add('1050');
  const { s, statuses } = await windowOf(t, x, ', price_per_call: 0.01', 101);
  assert.equal(statuses.filter((status) => status === 200).length, 100);
  // A call of 100 and its search (9 calls), the 101st alone.
  assert.equal(s.upstream.requests.length, 10);
  assert.equal(await metric(s.perch, 'perch_key_upstream_calls_total{key_id="alpha",upstream="x"}'), 101);
  assert.equal(await metric(s.perch, 'perch_key_upstream_spend_total{key_id="alpha",upstream="x"}'), Array.from({ length: 101 }, () => 0.01).reduce((a, b) => a + b));
  assert.equal(await metric(s.perch, 'perch_key_upstream_calls_saved_total{key_id="alpha",reason="batched"}'), 99);
  assert.equal(await metric(s.perch, 'perch_upstream_batch_size_count{upstream="x",route="user"}'), 1);

  // A batch call X fails once (a 502) is retried: its items are counted once.
  let failures = 1;
  const flaky = fakeX();
  // A backoff of 0: the retry goes at once.
  const r = await setup(t, 'retries: 1, retry_backoff_ms: 1, retry_backoff_max_ms: 1, batch: { window_ms: 10 }', '', flaky);
  r.upstream.behaviour = (req, res) => (failures-- > 0 ? res.writeHead(502).end() : flaky.behaviour(req, res));
  // The retry budget's floor grows a retry per 100 ms from the start.
  r.clock.advance(1000);
  const pending = await queued(r, ['/v1/users/1', '/v1/users/2', '/v1/users/3'], 1 + 3);
  r.clock.advance(10);
  assert.deepEqual(
    (await Promise.all(pending)).map((res) => res.status),
    [200, 200, 200],
  );
  assert.equal(r.upstream.requests.length, 2);
  assert.equal(await metric(r.perch, 'perch_key_upstream_calls_total{key_id="alpha",upstream="x"}'), 3);
});

/** Every exchange with X perch counted, by outcome, and the duration histogram's count. */
async function exchanges(perch: RunningPerch) {
  const text = await (await fetch(`${perch.url}/metrics`)).text();
  const outcomes: Record<string, number> = {};
  for (const [, outcome, value] of text.matchAll(/^perch_upstream_requests_total\{upstream="x",route="user",outcome="([a-z_0-9]+)"\} (\d+)$/gm)) outcomes[outcome!] = Number(value);
  const timed = /^perch_upstream_duration_seconds_count\{upstream="x",route="user"\} (\d+)$/m.exec(text);
  return { outcomes, timed: timed === null ? 0 : Number(timed[1]) };
}

test('a batch call is counted once as an exchange when every rider was answered before it, and so is each call of a search', { timeout: 30_000 }, async (t) => {
  const s = await setup(t, 'batch: { window_ms: 10 }');
  const pending = await queued(s, ['/v1/users/2', '/v1/users/3', '/v1/users/4'], 1 + 3);
  s.x.hold = true;
  s.clock.advance(10);
  await waitFor(() => s.x.held.length === 1);
  // Every rider's deadline passes while X holds the call: each is answered 504 alone.
  s.clock.advance(10_000);
  assert.deepEqual(
    (await Promise.all(pending)).map((r) => r.status),
    [504, 504, 504],
  );
  s.x.hold = false;
  s.x.held.shift()!();
  // X answers the call all the same: one exchange, answered.
  await waitFor(async () => (await exchanges(s.perch)).timed === 1).catch(async () => assert.fail(JSON.stringify(await exchanges(s.perch))));
  assert.deepEqual(await exchanges(s.perch), { outcomes: { ok: 1 }, timed: 1 });

  // A batch X refuses whole, and the four calls of its search: five exchanges.
  const x = fakeX();
  x.malformed.add('13');
  const r = await setup(t, 'batch: { window_ms: 10 }', '', x);
  const split = await queued(r, ['/v1/users/2', '/v1/users/13', '/v1/users/4', '/v1/users/5'], 1 + 4);
  r.clock.advance(10);
  assert.deepEqual(
    (await Promise.all(split)).map((res) => res.status),
    [200, 502, 200, 200],
  );
  assert.equal(r.upstream.requests.length, 5);
  await waitFor(async () => (await exchanges(r.perch)).timed === 5).catch(async () => assert.fail(JSON.stringify(await exchanges(r.perch))));
  // The batch and its first half refused whole, two halves answered, 13 alone refused.
  assert.deepEqual(await exchanges(r.perch), { outcomes: { bad_request: 2, ok: 2, unexpected_status: 1 }, timed: 5 });
});

/**
 * The batch layer alone over a call that seals its items and answers each, on a ManualClock:
 * the window's end and a miss's wait for company race only on its timers (their lengths come
 * from the real time left, read at once).
 */
function batchLayer(windowMs: number) {
  const clock = new ManualClock();
  const calls: string[][] = [];
  const call = createBatching({ upstream: 'x', config: { enabled: true, max_items: 100, window_ms: windowMs }, queueTimeoutMs: 1000, queueSize: 10, timers: clock, events: NO_EVENTS, logger: captureLogs().logger })(async (attempt) => {
    const { requests } = attempt.batch!.seal();
    calls.push(requests.map((r) => r.params.user_id!));
    const ok: UpstreamResult = { kind: 'ok', body: Buffer.from('{}') };
    return requests.length === 1 ? ok : { ...ok, items: requests.map(() => ok) };
  });
  const miss = (id: string, deadlineMs: number, floorMs: number): Promise<UpstreamResult> =>
    call({ request: { endpoint: 'user', params: { user_id: id }, path: `/v1/users/${id}` }, deadline: performance.now() + deadlineMs, minCallMs: floorMs } satisfies Attempt);
  return { clock, calls, miss };
}

test('a window ends with at least twice the floor and 50 ms of its miss deadline left: the miss leads its call rather than wait out its time', { timeout: 10_000 }, async () => {
  // A lone miss of 55 ms (floor 5) in a 50 ms window: its wait for company runs out at 49 ms;
  // the window ends when it has 50 ms left (after 4 or 5 ms), not after 50.
  const lone = batchLayer(50);
  const alone = lone.miss('1', 55, 5);
  await new Promise((resolve) => setImmediate(resolve));
  lone.clock.advance(49);
  assert.equal((await alone).kind, 'ok');
  assert.deepEqual(lone.calls, [['1']]);

  // A miss failing over with 90 ms left (floor 50) joins a window opened by a fresh one: the
  // window ends now, and both ride the call, rather than it waiting 40 ms for its 504.
  const failover = batchLayer(50);
  const fresh = failover.miss('2', 10_000, 50);
  await new Promise((resolve) => setImmediate(resolve));
  const late = failover.miss('3', 90, 50);
  await new Promise((resolve) => setImmediate(resolve));
  failover.clock.advance(50);
  assert.deepEqual([(await fresh).kind, (await late).kind], ['ok', 'ok']);
  assert.deepEqual(failover.calls, [['2', '3']]);
});

test('X refusing every batch call and serving single lookups: the search finds it in a few calls, and misses go alone for a minute', { timeout: 30_000 }, async (t) => {
  const x = fakeX();
  x.refusesBatches = true;
  const { s, ids, statuses } = await windowOf(t, x);
  assert.deepEqual(
    statuses,
    ids.map(() => 200),
  );
  const sizes = sent(s.upstream).map((url) => new URL(url, 'http://x').searchParams.get('ids')?.split(',').length ?? 1);
  // The refused batch and its halvings down to a pair, the pair's items alone: no item at fault,
  // so X refuses the form. The 98 others go alone, at once: 107 calls, 100 with batching off.
  assert.deepEqual(sizes.slice(0, 9), [100, 50, 25, 13, 7, 4, 2, 1, 1]);
  assert.deepEqual(sizes.slice(9), Array.from({ length: 98 }, () => 1));
  assert.deepEqual([...asked(s.upstream).slice(-100)].sort(), ids);
  // X serves the single lookups: its breaker stays closed. Each miss is billed once.
  assert.equal(await metric(s.perch, 'perch_upstream_refused_total{upstream="x",route="user",reason="breaker_open"}'), undefined);
  assert.equal(await metric(s.perch, 'perch_key_upstream_calls_total{key_id="alpha",upstream="x"}'), 100);
  assert.equal(s.perch.logs.text().split('\n').filter((l) => l.includes('provider refuses batch calls')).length, 1);

  // For a minute, misses go alone at once, without a window.
  const calls = s.upstream.requests.length;
  const pending = ['/v1/users/1', '/v1/users/2', '/v1/users/3'].map((p) => s.perch.request(p));
  await waitFor(() => s.upstream.requests.length === calls + 3).catch(() => assert.fail('the misses waited for a window'));
  const alone = await Promise.all(pending);
  assert.deepEqual(
    alone.map((r) => r.status),
    [200, 200, 200],
  );
  assert.deepEqual(sent(s.upstream).slice(calls).sort(), ['1', '2', '3'].map((id) => `/2/users/${id}?${USER_QUERY}`));
  // Then a batch is tried again.
  s.clock.advance(60_000);
  x.refusesBatches = false;
  const again = await queued(s, ['/v1/users/4', '/v1/users/5'], 1 + 2);
  s.clock.advance(10);
  assert.deepEqual(
    (await Promise.all(again)).map((r) => r.status),
    [200, 200],
  );
  assert.deepEqual(sent(s.upstream).slice(calls + 3), [`/2/users?ids=4,5&${USER_QUERY}`]);
});
