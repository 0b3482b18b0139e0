import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { Redis } from 'ioredis';
import { LEASE_LIFE_MS } from '../src/ratelimit/leased-limiter.js';
import { systemTimers, type Timers } from '../src/timers.js';
import { KEY, OTHER_KEY, pollFor, startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { spawnPerch } from './helpers/perch-process.js';
import { withPlan } from './helpers/plans.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { startTcpProxy } from './helpers/tcp-proxy.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';
import { tempDir } from './helpers/temp-dir.js';
import { onCleanup } from './helpers/cleanup.js';

/**
 * The shared buckets under real refill rates and real faults, over a real redis-server: leases
 * that lapse below capacity, a Redis that freezes, an instance killed with SIGKILL, a reload that
 * lowers a capacity. Every perch here runs on the real clock, as in production.
 */

function yamlFor(redis: Pick<TestRedis, 'url'>, upstreamUrl: string, plan: string, timeoutMs = 2000): string {
  return withPlan(testConfig(v1('main', upstreamUrl), `rate_limits_redis: { url: "${redis.url}", command_timeout_ms: ${timeoutMs} }`), plan);
}

function inspector(t: TestContext, redis: TestRedis): Redis {
  const client = new Redis(redis.url);
  onCleanup(t, () => client.disconnect());
  return client;
}

/** One GET with the test key (or `key`): its status. */
async function get(url: string, key = KEY): Promise<number> {
  const res = await fetch(`${url}/v1/users/1`, { headers: { 'x-api-key': key } });
  await res.arrayBuffer();
  return res.status;
}

/** `n` requests one after the other on `perch`: how many were allowed. */
async function sequential(perch: Pick<RunningPerch, 'url'>, n: number): Promise<number> {
  let allowed = 0;
  for (let i = 0; i < n; i++) if ((await get(perch.url)) === 200) allowed++;
  return allowed;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The test key's shared bucket. */
const BUCKET = 'perch:rl:alpha';

/** Redis's clock (ms), on which the bucket refills and its records lapse. */
async function redisNow(client: Redis): Promise<number> {
  const [seconds, micros] = await client.time();
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}

/**
 * Requests with the test key on `perch`, one after the other, until the shared bucket has no
 * more to give: how many were allowed. After a refusal it asks again once the bucket holds a
 * token (its refill of `refillPerSecond` counted) or once a lease record in it has lapsed (the
 * next call reclaims the record's reserve); it stops at a refusal when neither is left to come.
 */
async function spendAll(perch: Pick<RunningPerch, 'url'>, client: Redis, refillPerSecond = 0.01): Promise<number> {
  let allowed = 0;
  for (;;) {
    if ((await get(perch.url)) === 200) {
      allowed++;
      continue;
    }
    const more = await pollFor(async () => {
      const [fields, now] = await Promise.all([client.hgetall(BUCKET), redisNow(client)]);
      // An absent bucket is a full one.
      if (fields.tokens === undefined) return true;
      if (Number(fields.tokens) + ((now - Number(fields.at)) * refillPerSecond) / 1000 >= 1) return true;
      const records = Object.entries(fields).filter(([field]) => field.startsWith('l:'));
      if (records.length === 0) return false;
      return records.some(([, lapses]) => Number(lapses) <= now) ? true : undefined;
    }, 10_000);
    if (!more) return allowed;
  }
}

/** Requests with another key on `perch` until its log says Redis answers its rate limits again. */
async function answersAgain(perch: Pick<RunningPerch, 'url' | 'logs'>): Promise<void> {
  await waitFor(async () => {
    await get(perch.url, OTHER_KEY);
    return perch.logs.text().includes('rate limits: Redis answers again');
  }, 10_000);
}

/**
 * Spends `before` requests with the test key on `perch` (all allowed), `during` more while the
 * fault `begin` starts holds (it returns the fault's end), then all the shared bucket has left
 * once Redis decides again (the other key's requests find it back), lapsed lease records
 * reclaimed included: so what the client gets last is what the shared bucket kept, not what this
 * instance's memory bucket allows. Returns how many were allowed in all, and while the fault held.
 */
async function spendAcross(t: TestContext, perch: RunningPerch, redis: TestRedis, before: number, during: number, begin: () => () => void): Promise<{ admitted: number; during: number }> {
  assert.equal(await sequential(perch, before), before);
  const end = begin();
  const allowed = await sequential(perch, during);
  end();
  await answersAgain(perch);
  return { admitted: before + allowed + (await spendAll(perch, inspector(t, redis))), during: allowed };
}

/** Instance A started cut off from Redis (through a relay, command timeout 100 ms) and B on it, both on `plan`. */
async function aCutOff(t: TestContext, plan: string) {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const proxy = await startTcpProxy(t, redis.port);
  proxy.cut();
  const a = await startPerch(t, yamlFor(proxy, upstream.url, plan, 100));
  const b = await startPerch(t, yamlFor(redis, upstream.url, plan));
  return { redis, proxy, a, b };
}

/** The system timers, counting those that have yet to run: a test waits for one to run rather than guessing when it falls due. */
function countedTimers(): Timers & { pending(): ReadonlySet<object> } {
  const pending = new Set<object>();
  return {
    after(ms, fn) {
      const entry = {};
      pending.add(entry);
      const cancel = systemTimers.after(ms, () => {
        pending.delete(entry);
        fn();
      });
      return () => {
        pending.delete(entry);
        cancel();
      };
    },
    pending: () => new Set(pending),
  };
}

for (const n of [2, 4]) {
  test(`a client under its refill keeps a full bucket: 80 req/s over ${n} instances for 16 s, then a burst gets at least 900 of a plan of 1000`, { timeout: 90_000 }, async (t) => {
    const redis = await startRedis(t);
    const upstream = await startUpstream(t, sampleProvider);
    // 100 tokens a second back, 80 spent: every lease lapses with tokens unspent and the bucket
    // below capacity, where giving back less than the unspent loses tokens for good.
    const yaml = yamlFor(redis, upstream.url, '{ capacity: 1000, refill_per_second: 100 }');
    const perches: RunningPerch[] = [];
    for (let i = 0; i < n; i++) perches.push(await startPerch(t, yaml));
    const started = performance.now();
    const steady: Promise<number>[] = [];
    for (let i = 0; i < 1280; i++) {
      const due = started + i * 12.5;
      const wait = due - performance.now();
      // The scenario itself: a client spending at a rate against Redis's own clock and refill.
      if (wait > 0) await sleep(wait);
      steady.push(get(perches[i % n]!.url));
    }
    const steadyStatuses = await Promise.all(steady);
    assert.equal(steadyStatuses.filter((s) => s === 200).length, 1280, 'all allowed: the client spends less than its refill');
    // The burst: 1500 requests, 16 at a time, round robin.
    let next = 0;
    let allowed = 0;
    const burstStarted = performance.now();
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        while (next < 1500) {
          const i = next++;
          if ((await get(perches[i % n]!.url)) === 200) allowed++;
        }
      }),
    );
    const seconds = (performance.now() - burstStarted) / 1000;
    t.diagnostic(`${n} instances: burst ${allowed} of 1500 allowed in ${seconds.toFixed(2)} s (refill meanwhile ${Math.round(seconds * 100)})`);
    assert.ok(allowed >= 900, `${allowed} allowed`);
    // What the bucket held when the burst began (its refill during the burst aside): all of it,
    // where lost give-backs left it a few hundred short.
    const refill = Math.ceil(seconds * 100);
    assert.ok(allowed - refill >= 950, `${allowed} allowed, ${refill} of them refilled during the burst`);
    // The bucket's 1000, its refill during the burst, and at most a second of refill more (the
    // documented bound: leased tokens out while a full bucket refilled).
    assert.ok(allowed <= 1000 + 100 + Math.ceil(seconds * 100), `${allowed} allowed in ${seconds} s`);
  });
}

test('a lease Redis would grant after the instance stopped waiting takes nothing: a frozen Redis costs the client no tokens', { timeout: 60_000 }, async (t) => {
  const redis = await startRedis(t);
  onCleanup(t, () => redis.thaw());
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, yamlFor(redis, upstream.url, '{ capacity: 1000, refill_per_second: 0.01 }', 100));
  // 150 is more than the instance holds (two leases of 100 at most): once they are spent, each
  // request asks Redis for a lease of 100 until the breaker opens; those leases time out here and
  // wait in Redis's socket. The memory buckets answer.
  const { admitted, during } = await spendAcross(t, perch, redis, 400, 150, () => {
    redis.freeze();
    return () => redis.thaw();
  });
  t.diagnostic(`admitted ${admitted} on a plan of 1000 (${during} while Redis was frozen)`);
  assert.ok(admitted >= 950, `${admitted} admitted`);
  // The memory buckets answered the outage from the bucket as Redis last reported it, and what
  // they allowed was taken off the shared bucket once Redis answered again: never more than the plan.
  assert.ok(admitted <= 1000, `${admitted} admitted`);
});

test('a lease whose answer came after the timeout, yet ran in Redis, is undone by the next call: no token lost', { timeout: 60_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const proxy = await startTcpProxy(t, redis.port);
  // Redis answers at once, but its replies are held on the way back: each script ran well within
  // its deadline, and the instance gave up on it all the same (a slow or jittery network does this
  // to the calls whose answer is slower than the one the clock offset was learned from).
  const perch = await startPerch(t, yamlFor(proxy, upstream.url, '{ capacity: 1000, refill_per_second: 0.01 }', 200));
  const { admitted, during } = await spendAcross(t, perch, redis, 300, 300, () => {
    proxy.hold();
    return () => proxy.release();
  });
  t.diagnostic(`admitted ${admitted} on a plan of 1000 (${during} while the replies were held)`);
  assert.ok(admitted >= 990, `${admitted} admitted`);
  assert.ok(admitted <= 1000, `${admitted} admitted`);
});

test('a lease that lapses while the breaker is open (another key failed) gives its tokens back once Redis answers', { timeout: 60_000 }, async (t) => {
  const redis = await startRedis(t);
  onCleanup(t, () => redis.thaw());
  const upstream = await startUpstream(t, sampleProvider);
  const timers = countedTimers();
  const perch = await startPerch(t, yamlFor(redis, upstream.url, '{ capacity: 1000, refill_per_second: 0.01 }', 100), { timers });
  // The client holds a lease with tokens unspent; then Redis freezes and another key's calls
  // time out, which opens the breaker (one per Redis node, not per key) before the lease lapses.
  let admitted = await sequential(perch, 200);
  assert.equal(admitted, 200);
  // The client's leases' lapses (the only timers this perch arms on its own).
  const lapses = timers.pending();
  assert.ok(lapses.size > 0, 'a lease with tokens unspent');
  redis.freeze();
  let other = 0;
  while (!perch.logs.text().includes('falling back to per-instance memory buckets') || other < 10) {
    await get(perch.url, OTHER_KEY);
    other++;
  }
  // The leases lapse, their give-back kept from Redis by the open breaker.
  await waitFor(() => ![...timers.pending()].some((timer) => lapses.has(timer)), LEASE_LIFE_MS + 1000);
  redis.thaw();
  await answersAgain(perch);
  admitted += await spendAll(perch, inspector(t, redis));
  t.diagnostic(`admitted ${admitted} on a plan of 1000`);
  assert.equal(admitted, 1000);
});

test('what an instance allowed from memory is taken off the shared bucket once Redis answers, even if the client never comes back to it', { timeout: 60_000 }, async (t) => {
  // A is cut off from Redis and serves the client from its memory bucket; then the client moves
  // to B for good. A's link comes back and A serves another key only.
  const { redis, proxy, a, b } = await aCutOff(t, '{ capacity: 1000, refill_per_second: 0.01 }');
  assert.equal(await sequential(a, 300), 300);
  proxy.restore();
  await answersAgain(a);
  // What A allowed is owed to the shared bucket: 700 left for B.
  const client = inspector(t, redis);
  await waitFor(async () => Math.round(Number(await client.hget('perch:rl:alpha', 'tokens'))) !== 1000, 3000).catch(() => {});
  const allowed = await spendAll(b, client);
  t.diagnostic(`B got ${allowed} after A allowed 300 from memory`);
  assert.equal(allowed, 700);
});

test('what memory allowed while its bucket refilled to full is not owed: a client under its refill across an outage keeps its bucket', { timeout: 60_000 }, async (t) => {
  // Under 20 tokens: no leases, every request asks Redis, and memory answers for A while it is cut off.
  const { redis, proxy, a, b } = await aCutOff(t, '{ capacity: 15, refill_per_second: 5 }');
  assert.equal(await sequential(a, 10), 10);
  // 10 tokens at 5 a second: A's memory bucket, and the plan's, are full again after 2 s.
  await sleep(3000);
  proxy.restore();
  await answersAgain(a);
  // Settled: the key's bucket was written (the owed tokens charged, if any were still owed).
  const client = inspector(t, redis);
  await waitFor(async () => (await client.hget('perch:rl:alpha', 'tokens')) !== null, 3000).catch(() => {});
  const answers = await Promise.all(Array.from({ length: 20 }, () => get(b.url)));
  const allowed = answers.filter((s) => s === 200).length;
  t.diagnostic(`a burst right after Redis came back: ${allowed} of 20 allowed on a plan of 15`);
  // The plan is full: 15, and what refilled while the burst ran; charging the 10 would leave about 5.
  assert.ok(allowed >= 14, `${allowed} allowed`);
  assert.ok(allowed <= 17, `${allowed} allowed`);
});

test('the memory fallback carries on from the bucket as Redis last reported it, not from a full one', { timeout: 60_000 }, async (t) => {
  const redis = await startRedis(t);
  onCleanup(t, () => redis.thaw());
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, yamlFor(redis, upstream.url, '{ capacity: 50, refill_per_second: 0.01 }', 100));
  assert.equal(await sequential(perch, 60), 50);
  const last = await perch.request('/v1/users/1');
  assert.equal(last.status, 429);
  assert.match(last.headers.get('ratelimit')!, /r=0;/);
  redis.freeze();
  const started = performance.now();
  const during = await sequential(perch, 60);
  const seconds = (performance.now() - started) / 1000;
  redis.thaw();
  t.diagnostic(`Redis frozen: ${during} of 60 allowed in ${seconds.toFixed(2)} s`);
  // What the plan had left: the refill since, 0.01 a second; at most 5 beyond it.
  assert.ok(during <= 5, `${during} allowed`);
  assert.ok(perch.logs.text().includes('falling back to per-instance memory buckets'));
});

test('a perch process killed with SIGKILL: its lease records lapse, their tokens come back and it leaves the count of instances', { timeout: 60_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const dir = tempDir(t, 'perch-kill-');
  const path = join(dir, 'perch.yaml');
  writeFileSync(path, yamlFor(redis, upstream.url, '{ capacity: 1000, refill_per_second: 0.01 }'));
  const a = await spawnPerch(t, path);
  const b = await spawnPerch(t, path);
  const client = inspector(t, redis);
  const registered = async () => Object.keys(await client.hgetall(BUCKET)).filter((f) => f.startsWith('i:'));
  assert.equal(await sequential(b, 1), 1);
  const [mine] = await registered();
  assert.equal(await sequential(a, 300), 300);
  a.process.kill('SIGKILL');
  await a.exited;
  const killed = performance.now();
  // What the plan leaves: 1000 - 301 (and 0.01 a second). B spends it all, A's records reclaimed.
  const allowed = await spendAll(b, client);
  t.diagnostic(`B got ${allowed} after A's SIGKILL (the plan leaves 699) in ${Math.round(performance.now() - killed)} ms`);
  assert.ok(allowed >= 690, `${allowed} allowed`);
  assert.ok(allowed <= 699, `${allowed} allowed: a token handed out twice`);
  // A's entry lapses (Redis time) without A to renew it; B's next call drops it.
  await waitFor(async () => {
    const [fields, now] = await Promise.all([client.hgetall(BUCKET), redisNow(client)]);
    return Object.entries(fields).every(([field, lapses]) => !field.startsWith('i:') || field === mine || Number(lapses) <= now);
  }, 10_000);
  assert.equal(await get(b.url), 429);
  const fields = Object.keys(await client.hgetall(BUCKET));
  assert.deepEqual(fields.filter((f) => f.startsWith('i:')), [mine], `only B counts: ${fields.join(' ')}`);
});

test('a reload that lowers a capacity gives the leases back clipped at the new capacity: no bucket above it', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, yamlFor(redis, upstream.url, '{ capacity: 1000, refill_per_second: 0.01 }'));
  assert.equal(await sequential(perch, 10), 10);
  const client = inspector(t, redis);
  // Leases of 1, 2, 4 and 8: 985 left in the bucket, 5 unspent here, the newest on record.
  await waitFor(async () => Math.round(Number(await client.hget('perch:rl:alpha', 'tokens'))) === 985);
  perch.reload(yamlFor(redis, upstream.url, '{ capacity: 100, refill_per_second: 0.01 }'));
  // The give-back removes the lease's record: then the bucket is what it holds.
  await waitFor(async () => !Object.keys(await client.hgetall('perch:rl:alpha')).some((f) => f.startsWith('l:')));
  const tokens = Number(await client.hget('perch:rl:alpha', 'tokens'));
  assert.ok(tokens <= 100, `${tokens} tokens in a bucket of 100`);
  const res = await perch.request('/v1/users/1');
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('ratelimit-policy'), '"small";q=100;w=10000');
  assert.match(res.headers.get('ratelimit')!, /^"small";r=99;/);
});
