import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { onCleanup } from './helpers/cleanup.js';
import { ADMIN_YAML, purge } from './helpers/admin.js';
import { ManualClock } from './helpers/clock.js';
import { pollFor, startPerch, testConfig, v1, waitFor, type RunningPerch, type TestResponse } from './helpers/perch.js';
import { startRedis } from './helpers/redis-server.js';
import { sampleTweet, sampleUser } from './helpers/sample-bodies.js';
import { startTcpProxy } from './helpers/tcp-proxy.js';
import { json, startUpstream, type TestUpstream } from './helpers/upstream-server.js';

// A purge answered 200 is a miss on the next GET on every instance, and a flight in progress
// does not carry the old data past it; caching off takes no lease; Last-Modified never goes back;
// a user's two routes never serve two versions side by side (issue 58).

const TWEET = '/v1/tweets/1';
const TWEET_SCOPE = { endpoint: 'tweet', tweet_id: '1' };

/**
 * A provider whose tweet text is `data.text` when the request arrives, and which holds its
 * answer while `data.hold` is set (each held answer waits for `release`).
 */
interface Provider {
  readonly upstream: TestUpstream;
  text: string;
  hold: boolean;
  /** Answers every held request. */
  release(): void;
}

async function provider(t: TestContext, delayMs = 0): Promise<Provider> {
  const held: (() => void)[] = [];
  const state = {
    text: 'old',
    hold: false,
    release() {
      for (const answer of held.splice(0)) answer();
    },
  };
  const upstream = await startUpstream(t, (req: IncomingMessage, res: ServerResponse) => {
    const body = { ...sampleTweet('1'), text: state.text };
    const answer = () => json(200, body)(req, res);
    if (state.hold) held.push(answer);
    else setTimeout(answer, delayMs);
  });
  onCleanup(t, () => state.release());
  return Object.assign(state, { upstream });
}

function yamlFor(url: string, redisUrl?: string, extra = ''): string {
  const redis = redisUrl === undefined ? '' : `, redis: { url: "${redisUrl}", prefix: "c:" }`;
  return testConfig(v1('main', url), `${ADMIN_YAML}\ncache: { stale_seconds: 60${redis}${extra} }`);
}

async function shared(t: TestContext, yaml: string): Promise<RunningPerch> {
  const perch = await startPerch(t, yaml);
  await waitFor(() => perch.cache.redisConnected === true);
  return perch;
}

const textOf = (r: TestResponse) => (r.json() as { text: string }).text;

for (const redis of [false, true]) {
  const label = redis ? 'with Redis, two instances' : 'memory only';

  test(`${label}: a GET sent after a purge answered 200 never joins a miss begun before it`, { timeout: 20_000 }, async (t) => {
    const p = await provider(t);
    const url = redis ? (await startRedis(t)).url : undefined;
    const a = redis ? await shared(t, yamlFor(p.upstream.url, url)) : await startPerch(t, yamlFor(p.upstream.url));
    const b = redis ? await shared(t, yamlFor(p.upstream.url, url)) : a;
    p.hold = true;
    const before = a.request(TWEET);
    await waitFor(() => p.upstream.requests.length === 1);
    p.text = 'new';
    p.hold = false;
    assert.equal((await purge(b, TWEET_SCOPE)).status, 200);
    // Both instances answer while the flight begun before the purge still waits on the provider:
    // neither joins it, nor waits on its fleet lease.
    const afterA = await a.request(TWEET);
    assert.equal(textOf(afterA), 'new');
    assert.equal(afterA.headers.get('cache-status'), 'perch; fwd=miss; stored');
    const sent = performance.now();
    const afterB = await b.request(TWEET);
    assert.equal(textOf(afterB), 'new');
    assert.ok(performance.now() - sent < 1000, 'B waited on a lease taken before the purge');
    p.release();
    assert.equal(textOf(await before), 'old', 'the request sent before the purge');
    // The old answer was not stored either.
    assert.equal(textOf(await a.request(TWEET)), 'new');
    assert.equal(textOf(await b.request(TWEET)), 'new');
    assert.equal(p.upstream.requests.length, 2);
  });

  test(`${label}: a GET sent after a purge answered 200 never joins a refresh begun before it`, { timeout: 20_000 }, async (t) => {
    const clock = new ManualClock(Date.now());
    const p = await provider(t);
    const url = redis ? (await startRedis(t)).url : undefined;
    const start = async () => {
      const perch = await startPerch(t, yamlFor(p.upstream.url, url, ', ttl_seconds: { tweet: 10 }'), { clock });
      if (redis) await waitFor(() => perch.cache.redisConnected === true);
      return perch;
    };
    const a = await start();
    const b = redis ? await start() : a;
    assert.equal(textOf(await a.request(TWEET)), 'old');
    await a.cache.settled();
    clock.advance(11_000);
    p.hold = true;
    const stale = await a.request(TWEET);
    assert.equal(stale.headers.get('cache-status'), 'perch; fwd=stale; ttl=-1');
    await waitFor(() => p.upstream.requests.length === 2);
    p.text = 'new';
    p.hold = false;
    assert.equal((await purge(b, TWEET_SCOPE)).status, 200);
    const after = await a.request(TWEET);
    assert.equal(textOf(after), 'new', after.headers.get('cache-status') ?? '');
    assert.equal(textOf(await b.request(TWEET)), 'new');
    p.release();
  });
}

test('a purge of another scope leaves a flight joinable: one call for a miss asked twice', { timeout: 20_000 }, async (t) => {
  const p = await provider(t);
  const perch = await startPerch(t, yamlFor(p.upstream.url));
  p.hold = true;
  const first = perch.request(TWEET);
  await waitFor(() => p.upstream.requests.length === 1);
  assert.equal((await purge(perch, { endpoint: 'tweet', tweet_id: '2' })).status, 200);
  const second = perch.request(TWEET);
  // The first GET, the purge, the second GET: the second has joined a flight or started one.
  await waitFor(() => perch.received() === 3);
  p.release();
  assert.equal((await second).headers.get('cache-status'), 'perch; fwd=miss; collapsed; stored');
  assert.equal((await first).status, 200);
  assert.equal(p.upstream.requests.length, 1);
});

test('a purge answers 200 only once every instance it reached applied it; 503 when one does not say so in time', { timeout: 30_000 }, async (t) => {
  const p = await provider(t);
  const redis = await startRedis(t);
  const proxy = await startTcpProxy(t, Number(new URL(redis.url).port));
  const a = await shared(t, yamlFor(p.upstream.url, proxy.url));
  const b = await shared(t, yamlFor(p.upstream.url, redis.url));
  assert.equal(textOf(await a.request(TWEET)), 'old');
  await a.cache.settled();
  p.text = 'new';
  // A hears nothing from Redis for a while: B's purge cannot be confirmed by A until it does.
  proxy.hold();
  let answered: TestResponse | undefined;
  const purged = purge(b, TWEET_SCOPE).then((r) => (answered = r));
  // B applied its purge, one confirmation of the two it waits for, then read the count again
  // twice: it saw one and went on waiting.
  const inspector = new Redis(redis.url);
  onCleanup(t, () => inspector.disconnect());
  const acks = await pollFor(async () => (await inspector.keys('c:gen:ack:*'))[0]);
  await waitFor(async () => (await inspector.mget(acks))[0] === '1');
  const reads = async () => Number(/cmdstat_get:calls=(\d+)/.exec(await inspector.info('commandstats'))?.[1] ?? 0);
  const seen = await reads();
  await waitFor(async () => (await reads()) >= seen + 2);
  assert.equal(answered, undefined, 'no 200 while A has not applied the purge');
  proxy.release();
  assert.equal((await purged).status, 200);
  assert.equal(textOf(await a.request(TWEET)), 'new');

  proxy.hold();
  const late = await purge(b, TWEET_SCOPE);
  proxy.release();
  assert.equal(late.status, 503);
  assert.equal(late.headers.get('retry-after'), '1');
  assert.equal(late.json().error.code, 'E503');
  assert.match(late.json().error.message, /not every instance confirmed/);
});

test('another client subscribed to the purge channel is not waited for: a purge answers 200 at once, applied everywhere', { timeout: 30_000 }, async (t) => {
  const p = await provider(t);
  const redis = await startRedis(t);
  const a = await shared(t, yamlFor(p.upstream.url, redis.url));
  const b = await shared(t, yamlFor(p.upstream.url, redis.url));
  // An operator watching the channel: a SUBSCRIBE and a PSUBSCRIBE, each counted by PUBLISH.
  const watchers = [new Redis(redis.url), new Redis(redis.url)];
  onCleanup(t, () => watchers.forEach((w) => w.disconnect()));
  await watchers[0]!.subscribe('c:purge');
  await watchers[1]!.psubscribe('*');
  // Both instances listen as ones a purge waits for.
  const probe = new Redis(redis.url);
  onCleanup(t, () => probe.disconnect());
  await waitFor(async () => ((await probe.pubsub('NUMSUB', 'c:purge:instances')) as [string, number])[1] === 2);
  assert.equal(textOf(await a.request(TWEET)), 'old');
  await a.cache.settled();
  p.text = 'new';
  const sent = performance.now();
  const purged = await purge(b, TWEET_SCOPE);
  assert.equal(purged.status, 200, purged.text);
  assert.ok(performance.now() - sent < 1000, `the purge waited ${Math.round(performance.now() - sent)} ms`);
  assert.equal(textOf(await a.request(TWEET)), 'new');
});

test('caching off (TTL 0) takes no fleet lease: three instances each answer within 1.6 s of a 1 s provider, twice', { timeout: 30_000 }, async (t) => {
  const p = await provider(t, 1000);
  const redis = await startRedis(t);
  const yaml = yamlFor(p.upstream.url, redis.url, ', ttl_seconds: { tweet: 0 }');
  const fleet = [await shared(t, yaml), await shared(t, yaml), await shared(t, yaml)];
  for (let round = 0; round < 2; round++) {
    const started = performance.now();
    const times = await Promise.all(fleet.map(async (perch) => (await perch.request(TWEET), performance.now() - started)));
    t.diagnostic(`round ${round}: ${times.map((ms) => Math.round(ms)).join(', ')} ms`);
    for (const ms of times) assert.ok(ms < 1600, `round ${round}: answered after ${Math.round(ms)} ms`);
  }
  assert.equal(p.upstream.requests.length, 6);
});

test('a 404 under not_found: 0 is handed to the instances waiting on the lease: three answer within 1.6 s of a 1 s provider, twice', { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, (req, res) => setTimeout(() => json(404, { error: 'no such tweet' })(req, res), 1000));
  const redis = await startRedis(t);
  const yaml = yamlFor(upstream.url, redis.url, ', ttl_seconds: { not_found: 0 }');
  const fleet = [await shared(t, yaml), await shared(t, yaml), await shared(t, yaml)];
  for (let round = 0; round < 2; round++) {
    const started = performance.now();
    const answers = await Promise.all(fleet.map(async (perch) => ({ r: await perch.request(TWEET), ms: performance.now() - started })));
    t.diagnostic(`round ${round}: ${answers.map(({ ms }) => Math.round(ms)).join(', ')} ms`);
    for (const { r, ms } of answers) {
      assert.equal(r.status, 404);
      assert.equal(r.json().error.code, 'E404');
      assert.ok(ms < 1600, `round ${round}: answered after ${Math.round(ms)} ms`);
    }
  }
  // One call a round: the waiting instances took the leader's 404. Nothing cached, not even for
  // the hand-off's moment: each round, begun as the last ended, asked again, and so does a GET now.
  assert.equal(upstream.requests.length, 2);
  assert.equal((await fleet[0]!.request(TWEET)).headers.get('cache-status'), 'perch; fwd=miss');
  assert.equal(upstream.requests.length, 3);
});

test('Last-Modified never goes back across instances: no 304 to a date sent with other bytes', { timeout: 20_000 }, async (t) => {
  const clock = new ManualClock(Date.UTC(2026, 0, 1, 12));
  const p = await provider(t);
  const redis = await startRedis(t);
  const yaml = testConfig(v1('main', p.upstream.url), `cache: { stale_seconds: 0, ttl_seconds: { tweet: 10 }, redis: { url: "${redis.url}", prefix: "c:" } }`);
  const start = async () => {
    const perch = await startPerch(t, yaml, { clock });
    await waitFor(() => perch.cache.redisConnected === true);
    return perch;
  };
  const a = await start();
  const b = await start();
  /** A GET of `perch` once Redis dated what it stored: a hit sending Last-Modified. */
  const dated = async (perch: RunningPerch) => {
    await perch.cache.settled();
    const r = await perch.request(TWEET);
    assert.ok(r.headers.get('last-modified') !== null, r.headers.get('cache-status') ?? '');
    return r;
  };
  // B stores X at T1.
  const x = await b.request(TWEET);
  assert.equal(x.headers.get('last-modified'), null, 'not dated before Redis has the date');
  const t1 = (await dated(b)).headers.get('last-modified')!;
  // A stores Y at T2, which B serves from Redis.
  clock.advance(11_000);
  p.text = 'new';
  await a.request(TWEET);
  const y = await dated(a);
  const t2 = y.headers.get('last-modified')!;
  assert.notEqual(t2, t1);
  clock.advance(11_000);
  // The provider goes back to X: B refetches it, and must not date it T1 from its own memory.
  p.text = 'old';
  const back = await b.request(TWEET, { headers: { 'if-modified-since': t2 } });
  assert.equal(back.status, 200);
  assert.equal(textOf(back), 'old');
  for (const perch of [b, a]) {
    const r = await perch.request(TWEET, { headers: { 'if-modified-since': t2 } });
    assert.equal(r.status, 200, 'a client holding Y, dated T2, gets X');
    assert.equal(textOf(r), 'old');
    assert.ok(Date.parse(r.headers.get('last-modified')!) > Date.parse(t2), `${r.headers.get('last-modified')} after ${t2}`);
  }
  // The same bytes keep their date: a 304 for a date sent with them.
  const current = (await b.request(TWEET)).headers.get('last-modified')!;
  assert.equal((await a.request(TWEET, { headers: { 'if-modified-since': current } })).status, 304);
});

test('new bytes refetched within the second of the date sent with other bytes go out undated, never 304 by that date', { timeout: 20_000 }, async (t) => {
  const clock = new ManualClock(Date.UTC(2026, 0, 1, 12));
  const p = await provider(t);
  const redis = await startRedis(t);
  const yaml = testConfig(v1('main', p.upstream.url), `${ADMIN_YAML}\ncache: { stale_seconds: 0, redis: { url: "${redis.url}", prefix: "c:" } }`);
  const a = await shared(t, yaml);
  const b = await shared(t, yaml);
  void clock;
  await a.request(TWEET);
  await a.cache.settled();
  const first = await a.request(TWEET);
  const date = first.headers.get('last-modified')!;
  assert.ok(date !== null);
  p.text = 'new';
  assert.equal((await purge(a, TWEET_SCOPE)).status, 200);
  // B refetches at once: most likely the same second as `date`, and never dated at or before it.
  await b.request(TWEET);
  await b.cache.settled();
  const refetched = await b.request(TWEET, { headers: { 'if-modified-since': date } });
  assert.equal(refetched.status, 200);
  assert.equal(textOf(refetched), 'new');
  const sent = refetched.headers.get('last-modified');
  assert.ok(sent === null || Date.parse(sent) > Date.parse(date), `${sent} after ${date}`);
});

test('cross-population never leaves two versions of a user: the other route is written only where empty, else purged fleet-wide', { timeout: 20_000 }, async (t) => {
  let name = 'alice';
  const upstream = await startUpstream(t, (req, res) => json(200, sampleUser('1', req.url?.includes('/by/username/') === true ? req.url.split('/').pop()! : name))(req, res));
  const redis = await startRedis(t);
  const yaml = testConfig(v1('main', upstream.url), `cache: { ttl_seconds: { user: 3600, user_by_username: 3600 }, redis: { url: "${redis.url}", prefix: "c:" } }`);
  const a = await shared(t, yaml);
  const b = await shared(t, yaml);
  // B holds /v1/users/1 fresh, old name.
  assert.equal((await b.request('/v1/users/1')).json().username, 'alice');
  await b.cache.settled();
  assert.match((await b.request('/v1/users/1')).headers.get('cache-status') ?? '', /^perch; hit; ttl=\d+$/);
  // The user is renamed; A fetches the new name.
  name = 'alicia';
  const fresh = await a.request('/v1/users/by/username/alicia');
  assert.equal(fresh.json().username, 'alicia');
  const servedAt = performance.now();
  // Within a second, no instance serves the old name by id any more.
  for (const perch of [b, a]) {
    const r = await pollFor(async () => {
      const got = await perch.request('/v1/users/1');
      return got.json().username === 'alicia' ? got : undefined;
    }, 1000);
    assert.equal(r.json().username, 'alicia');
  }
  assert.ok(performance.now() - servedAt < 1000);
  // And it stays so.
  assert.equal((await b.request('/v1/users/1')).json().username, 'alicia');
  assert.equal((await a.request('/v1/users/1')).json().username, 'alicia');
});

test('memory only: cross-population drops the other route where it holds another version', { timeout: 20_000 }, async (t) => {
  let name = 'alice';
  const upstream = await startUpstream(t, (req, res) => json(200, sampleUser('1', req.url?.includes('/by/username/') === true ? req.url.split('/').pop()! : name))(req, res));
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), 'cache: { ttl_seconds: { user: 3600, user_by_username: 3600 } }'));
  assert.equal((await perch.request('/v1/users/1')).json().username, 'alice');
  name = 'alicia';
  assert.equal((await perch.request('/v1/users/by/username/alicia')).json().username, 'alicia');
  const byId = await perch.request('/v1/users/1');
  assert.equal(byId.json().username, 'alicia');
  assert.equal(byId.headers.get('cache-status'), 'perch; fwd=miss; stored');
});

for (const redis of [false, true]) {
  test(`${redis ? 'with Redis, two instances' : 'memory only'}: routes that answer different bytes for one user do not purge each other on every miss`, { timeout: 20_000 }, async (t) => {
    // The by-username route carries one more follower: both are the provider's current answer.
    const upstream = await startUpstream(t, (req, res) => {
      const user = sampleUser('1', 'alice');
      json(200, req.url?.includes('/by/username/') === true ? { ...user, followers_count: user.followers_count + 1 } : user)(req, res);
    });
    const url = redis ? (await startRedis(t)).url : undefined;
    const cache = `cache: { ttl_seconds: { user: 3600, user_by_username: 3600 }${url === undefined ? '' : `, redis: { url: "${url}", prefix: "c:" }`} }`;
    const yaml = testConfig(v1('main', upstream.url), `${ADMIN_YAML}\n${cache}`);
    const a = redis ? await shared(t, yaml) : await startPerch(t, yaml);
    const b = redis ? await shared(t, yaml) : a;
    const probe = url === undefined ? undefined : new Redis(url);
    onCleanup(t, () => probe?.disconnect());
    // Once both instances applied a purge of `scope` (its n-th) that a fetch made of itself.
    const applied = (scope: string, n: number) => (probe === undefined ? Promise.resolve() : waitFor(async () => (await probe.get(`c:gen:ack:0 ${n} ${scope}`)) === '2'));
    const byId = '/v1/users/1';
    const byName = '/v1/users/by/username/alice';
    assert.equal((await a.request(byId)).headers.get('cache-status'), 'perch; fwd=miss; stored');
    await a.cache.settled();
    assert.equal((await purge(a, { endpoint: 'user_by_username', username: 'alice' })).status, 200);
    // The by-username route's first answer is other bytes than its twin: the by-id entry goes.
    assert.equal((await b.request(byName)).headers.get('cache-status'), 'perch; fwd=miss; stored');
    await b.cache.settled();
    await applied('user:1', 1);
    assert.equal((await a.request(byId)).headers.get('cache-status'), 'perch; fwd=miss; stored');
    await a.cache.settled();
    // By id the provider answered what it did before: nothing changed, nothing more is purged.
    assert.equal(upstream.requests.length, 3);
    for (let i = 0; i < 6; i++) {
      const r = await [a, b][i % 2]!.request(i % 4 < 2 ? byName : byId);
      assert.match(r.headers.get('cache-status') ?? '', /^perch; hit/, `GET ${i}`);
    }
    assert.equal(upstream.requests.length, 3);
  });
}

test('an entry Redis could not take goes out undated: its ETag alone, until Redis dates it', { timeout: 20_000 }, async (t) => {
  const p = await provider(t);
  const redis = await startRedis(t);
  const proxy = await startTcpProxy(t, Number(new URL(redis.url).port));
  const a = await shared(t, yamlFor(p.upstream.url, proxy.url));
  proxy.cut();
  const miss = await a.request(TWEET);
  assert.equal(miss.status, 200);
  await a.cache.settled();
  const hit = await a.request(TWEET);
  assert.equal(hit.headers.get('cache-status')?.startsWith('perch; hit'), true);
  assert.ok(hit.headers.get('etag') !== null);
  assert.equal(hit.headers.get('last-modified'), null);
  assert.equal((await a.request(TWEET, { headers: { 'if-modified-since': new Date(Date.now() + 60_000).toUTCString() } })).status, 200);
  assert.equal((await a.request(TWEET, { headers: { 'if-none-match': hit.headers.get('etag')! } })).status, 304);
});
