import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Redis } from 'ioredis';
import { ANY, CLOCK_GRANULARITY_MS } from '../src/upstream/guard/provider-state.js';
import { RedisProviderState } from '../src/upstream/guard/redis-state.js';
import { ManualClock } from './helpers/clock.js';
import { KEY, OTHER_KEY, startPerch, waitFor, type RunningPerch, type TestResponse } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { sampleProvider, startUpstream, type TestUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

// The provider's call cap shared among client keys (admission-queue.ts), end to end: real perch,
// real upstream, the clock and timers in the test's hand, so the order of calls is exact.

function config(url: string, cap: string, weights = { alpha: 1, bravo: 1 }): string {
  return `
server: { host: 127.0.0.1, port: 0 }
auth:
  keys:
    - { id: crawler, key: "${KEY}", plan: alpha }
    - { id: app, key: "${OTHER_KEY}", plan: bravo }
rate_limits:
  alpha: { capacity: 100000, refill_per_second: 100000, provider_weight: ${weights.alpha} }
  bravo: { capacity: 100000, refill_per_second: 100000, provider_weight: ${weights.bravo} }
upstreams:
  main: { kind: v1, url: "${url}", timeout_ms: 2000, ${cap} }
`;
}

/**
 * Sends one miss for `key` and waits until it is either at the upstream or queued (one more
 * timer); its response, in a box so that awaiting `send` does not await the response.
 */
async function send(perch: RunningPerch, clock: ManualClock, upstream: TestUpstream, key: string, id: number): Promise<{ response: Promise<TestResponse> }> {
  const [calls, waiting] = [upstream.requests.length, clock.waiting];
  const response = perch.request(`/v1/users/${id}`, { key }).finally(() => answered++);
  await waitFor(() => upstream.requests.length > calls || clock.waiting > waiting);
  return { response };
}

/** A one-second cap window, and the millisecond a call's mark may lag its answer (provider-state.ts). */
const WINDOW_MS = 1000 + CLOCK_GRANULARITY_MS;

/** Responses answered so far, over every `send`. */
let answered = 0;

/**
 * Moves the clock one cap window at a time until the upstream has had `calls` calls. Each step
 * starts once every call made has its answer at the client: a call still in flight holds its
 * place in the cap's window until its answer, whatever the clock says.
 */
async function release(clock: ManualClock, upstream: TestUpstream, intervalMs: number, calls: number): Promise<void> {
  while (upstream.requests.length < calls) {
    const before = upstream.requests.length;
    await waitFor(() => answered >= before);
    clock.advance(intervalMs);
    await waitFor(() => upstream.requests.length > before);
  }
}

const ids = (upstream: TestUpstream) => upstream.requests.map((r) => Number(r.url.split('/').pop()));

test('a crawler\'s backlog does not starve another key: its miss is the next call the cap allows', { timeout: 10_000 }, async (t) => {
  answered = 0;
  const clock = new ManualClock();
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, config(upstream.url, 'max_requests_per_second: 2, queue_timeout_ms: 10000'), { clock, timers: clock });
  const pending: Promise<TestResponse>[] = [];
  // Crawler misses 1-8: the burst of 2 goes at once, 6 wait.
  for (let id = 1; id <= 8; id++) pending.push((await send(perch, clock, upstream, KEY, id)).response);
  assert.deepEqual(ids(upstream), [1, 2]);
  pending.push((await send(perch, clock, upstream, OTHER_KEY, 100)).response);
  // The cap's window lets 2 calls a second: the next second's first is the app's.
  await release(clock, upstream, WINDOW_MS, 3);
  assert.deepEqual(ids(upstream).slice(0, 3), [1, 2, 100], 'the app is next, ahead of the crawler\'s six');
  await release(clock, upstream, WINDOW_MS, 9);
  const statuses = (await Promise.all(pending)).map((r) => r.status);
  assert.deepEqual(statuses, [200, 200, 200, 200, 200, 200, 200, 200, 200]);
  assert.deepEqual(ids(upstream), [1, 2, 100, 3, 4, 5, 6, 7, 8]);
});

test('a cap kept busy sends its calls a refill apart, so a key owed the next call waits one refill, not the rest of a window', { timeout: 10_000 }, async (t) => {
  answered = 0;
  const clock = new ManualClock();
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, config(upstream.url, 'max_requests_per_second: 10, queue_timeout_ms: 10000'), { clock, timers: clock });
  const pending: Promise<TestResponse>[] = [];
  for (let id = 1; id <= 20; id++) pending.push((await send(perch, clock, upstream, KEY, id)).response);
  assert.equal(upstream.requests.length, 10, 'the burst of 10 goes at once');
  await waitFor(() => answered >= 10);
  clock.advance(WINDOW_MS);
  await waitFor(() => answered >= 11);
  // The app's miss is queued (send returns once it waits), so the cap refused it: the window let
  // one crawler call go, not the clump of ten its first second had.
  pending.push((await send(perch, clock, upstream, OTHER_KEY, 100)).response);
  assert.deepEqual(ids(upstream).slice(10), [11]);
  clock.advance(100);
  await waitFor(() => upstream.requests.length > 11);
  assert.deepEqual(ids(upstream).slice(10), [11, 100], 'the app has the next refill');
  await release(clock, upstream, WINDOW_MS, 21);
  assert.deepEqual(
    (await Promise.all(pending)).map((r) => r.status),
    Array<number>(21).fill(200),
  );
});

test('provider_weight: a key of a plan of weight 3 gets three calls to one of weight 1 while both wait', { timeout: 10_000 }, async (t) => {
  answered = 0;
  const clock = new ManualClock();
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, config(upstream.url, 'max_requests_per_second: 1, burst: 1, queue_timeout_ms: 30000', { alpha: 3, bravo: 1 }), { clock, timers: clock });
  const pending: Promise<TestResponse>[] = [];
  // Crawler (weight 3): 1 goes at once; then app 101, crawler 2-4, app 102 wait, in that order.
  pending.push((await send(perch, clock, upstream, KEY, 1)).response);
  pending.push((await send(perch, clock, upstream, OTHER_KEY, 101)).response);
  for (let id = 2; id <= 4; id++) pending.push((await send(perch, clock, upstream, KEY, id)).response);
  pending.push((await send(perch, clock, upstream, OTHER_KEY, 102)).response);
  await release(clock, upstream, WINDOW_MS, 6);
  await Promise.all(pending);
  // Start tags: crawler 1/3, 2/3, 1 for 2-4 (its first call took 0 to 1/3), app 0 and 1: the
  // app's second call waits for the crawler's three. With equal weights it would go before 3.
  assert.deepEqual(ids(upstream), [1, 101, 2, 3, 4, 102]);
});

test('fleet-wide: in Redis a place under the cap goes to the least-served payer waiting on any instance', { timeout: 15_000 }, async (t) => {
  const redis = await startRedis(t);
  const clients = [new Redis(redis.url), new Redis(redis.url)] as const;
  onCleanup(t, () => clients.forEach((c) => c.disconnect()));
  const clock = new ManualClock();
  // Two instances' shared state. max_concurrent 1: a place frees only when a call finishes, so
  // the order is the test's, with no time in it.
  const [a, b] = clients.map((c) => new RedisProviderState(c, { prefix: 'perch:', now: () => clock.now(), commandTimeoutMs: 2000 }));
  const cap = { maxConcurrent: 1 };
  let lease = 0;
  const ask = (state: RedisProviderState, payer: string, weight = 1) => {
    const leaseId = `l${++lease}`;
    const query = { upstream: 'main', scope: ANY, candidates: ['a'], cap, localCap: cap, leaseId, leaseMs: 60_000, payer: { id: payer, weight, label: payer } };
    return { leaseId, admitted: async () => (await state.admit(query)).kind === 'admitted', again: async () => (await state.admit(query)).kind === 'admitted' };
  };
  /** Ends a call and waits until Redis has it (commands on one connection run in order). */
  const finish = async (state: RedisProviderState, client: Redis, leaseId: string) => {
    state.finish('main', leaseId);
    await client.ping();
  };

  // Instance A's crawler holds the place; its next call and B's app both wait.
  const c1 = ask(a!, 'crawler');
  assert.equal(await c1.admitted(), true);
  const c2 = ask(a!, 'crawler');
  assert.equal(await c2.admitted(), false);
  const a1 = ask(b!, 'app');
  assert.equal(await a1.admitted(), false);
  await finish(a!, clients[0], c1.leaseId);
  // A asks first, but the place is owed to the app (start tag 0 against the crawler's 1).
  assert.equal(await c2.again(), false);
  assert.equal(await a1.again(), true);
  await finish(b!, clients[1], a1.leaseId);
  assert.equal(await c2.again(), true, 'nobody else waits: the crawler gets it');
  await finish(a!, clients[0], c2.leaseId);

  // Weights: heavy (3) and light (1) both waiting on different instances get 3 places to 1.
  const order: string[] = [];
  const holder = ask(a!, 'holder');
  assert.equal(await holder.admitted(), true);
  let held = holder.leaseId;
  let heavy = ask(a!, 'heavy', 3);
  let light = ask(b!, 'light', 1);
  assert.equal(await heavy.admitted(), false);
  assert.equal(await light.admitted(), false);
  for (let i = 0; i < 8; i++) {
    await finish(a!, clients[0], held);
    // Both ask after every place frees, the heavy one first: only the owed one is admitted.
    if (await heavy.again()) {
      order.push('heavy');
      held = heavy.leaseId;
      heavy = ask(a!, 'heavy', 3);
      assert.equal(await light.again(), false);
      assert.equal(await heavy.admitted(), false);
    } else {
      assert.equal(await light.again(), true);
      order.push('light');
      held = light.leaseId;
      light = ask(b!, 'light', 1);
      assert.equal(await light.admitted(), false);
    }
  }
  assert.deepEqual(order, ['heavy', 'light', 'heavy', 'heavy', 'heavy', 'light', 'heavy', 'heavy']);
});

test('fleet-wide, end to end: a crawler queued on instance A yields the next call to an app waiting on instance B', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const held: (() => void)[] = [];
  const upstream = await startUpstream(t, (req, res) => held.push(() => sampleProvider(req, res)));
  // max_concurrent 1: a place frees when the call in flight is answered, so the test orders calls.
  const cap = `max_concurrent: 1, queue_timeout_ms: 15000`;
  const yaml = `${config(upstream.url, cap)}rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 2000 }\n`;
  const a = await startPerch(t, yaml);
  const b = await startPerch(t, yaml);
  const crawler = [1, 2, 3].map((id) => a.request(`/v1/users/${id}`));
  await waitFor(() => upstream.requests.length === 1);
  await waitFor(() => a.received() === 3);
  const app = b.request('/v1/users/100', { key: OTHER_KEY });
  await waitFor(() => b.received() === 1);
  // B's ask has reached Redis: the app is registered as waiting before the place frees.
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  await waitFor(async () => (await inspector.zscore('perch:{up:main}:fairq', 'app')) !== null);
  for (let calls = 1; calls <= 4; calls++) {
    await waitFor(() => upstream.requests.length === calls && held.length === 1);
    held.shift()!();
  }
  assert.deepEqual(
    (await Promise.all([...crawler, app])).map((r) => r.status),
    [200, 200, 200, 200],
  );
  // The crawler's second and third requests may reach the queue in either order: one may wait
  // for its key's next rate-limit lease while the other finds the token that lease brought.
  const order = ids(upstream);
  assert.deepEqual([order.slice(0, 2), order.slice(2).sort()], [[1, 100], [2, 3]]);
});

test('fleet-wide: a key that starts waiting behind another key\'s backlog asks the fleet at once, so no instance takes its turn', { timeout: 20_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const clock = new ManualClock();
  // One call per 5 s: the crawler's second miss is told to come back in about 5 s, on a clock the
  // test holds, so the queue's own wake-up never comes while the test looks.
  const yaml = `${config(upstream.url, 'max_requests_per_second: 0.2, queue_timeout_ms: 60000')}rate_limits_redis: { url: "${redis.url}", command_timeout_ms: 2000 }\n`;
  const perch = await startPerch(t, yaml, { clock, timers: clock });
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  const waiting = (payer: string) => async () => (await inspector.zscore('perch:{up:main}:fairq', payer)) !== null;
  const first = perch.request('/v1/users/1');
  await waitFor(() => upstream.requests.length === 1);
  const second = perch.request('/v1/users/2');
  await waitFor(waiting('crawler'));
  const app = perch.request('/v1/users/100', { key: OTHER_KEY });
  // Registered in Redis on arrival: at the window's end the place is the app's, whichever
  // instance asks first.
  await waitFor(waiting('app'));
  clock.advance(60_000);
  assert.deepEqual(
    (await Promise.all([first, second, app])).map((r) => r.status),
    [200, 429, 429],
  );
  assert.deepEqual(ids(upstream), [1]);
});
