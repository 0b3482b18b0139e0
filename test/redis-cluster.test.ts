import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import calculateSlot from 'cluster-key-slot';
import { ManualClock } from './helpers/clock.js';
import { OTHER_KEY, pollFor, startPerch, testConfig, v1, waitFor, type RunningPerch } from './helpers/perch.js';
import { startRedisCluster, type TestRedisCluster } from './helpers/redis-cluster.js';
import { sampleProvider, startUpstream, type TestUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';

/** Generous: 2 shared cores run three redis-servers, two perch instances and the test. */
const COMMAND_TIMEOUT_MS = 1000;
/**
 * With a node dead, each Redis call for its slots waits out the command timeout (ioredis queues
 * commands for a cluster node rather than failing them), so the node-loss test uses a shorter one.
 */
const DEAD_NODE_COMMAND_TIMEOUT_MS = 250;
/** At most GET, lease and store each time out, plus the upstream; loose for loaded machines. */
const SLOW_MS = 5000;

const PATHS = Array.from({ length: 12 }, (_, i) => `/v1/users/${i + 1}`);

function clusterYaml(cluster: TestRedisCluster, commandTimeoutMs: number): string {
  const seeds = cluster.urls.map((url) => `"${url}"`).join(', ');
  return `cache: { stale_seconds: 0, ttl_seconds: { user: 300, tweets: 300 }, redis: { cluster: [${seeds}], prefix: "t:", command_timeout_ms: ${commandTimeoutMs} } }`;
}

async function startShared(
  t: TestContext,
  cluster: TestRedisCluster,
  upstream: TestUpstream,
  clock: ManualClock,
  commandTimeoutMs = COMMAND_TIMEOUT_MS,
): Promise<RunningPerch> {
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), clusterYaml(cluster, commandTimeoutMs)), { clock });
  await waitFor(() => perch.cache.redisConnected === true, 10_000);
  return perch;
}

/**
 * ioredis connects to each cluster node lazily, on the first command for one of its slots; that
 * first command waits for the connection. Lookups of absent keys spread over every node's slots
 * open all connections, so a test's timing does not depend on which request comes first.
 */
async function warmUp(perch: RunningPerch): Promise<void> {
  await Promise.all(Array.from({ length: 30 }, (_, i) => perch.cache.remote(`/warm-up/${i}`)));
}

/** SET commands the cluster has run, all nodes together (a lease is a SET NX). */
/** Scripts run, over every node: a lease attempt is one. */
async function evalCalls(cluster: TestRedisCluster): Promise<number> {
  const stats = await Promise.all(cluster.nodes.map((node) => cluster.cli(node.port, 'info', 'commandstats')));
  return stats.reduce((sum, text) => sum + Number(/cmdstat_eval:calls=(\d+)/.exec(text)?.[1] ?? 0), 0);
}

async function setup(t: TestContext, behaviour: UpstreamBehaviour = sampleProvider) {
  const clock = new ManualClock();
  const cluster = await startRedisCluster(t);
  const upstream = await startUpstream(t, behaviour);
  return { clock, cluster, upstream };
}

/** Per node (in `cluster.nodes` order): the keys it holds matching `pattern`. */
async function keysByNode(cluster: TestRedisCluster, pattern: string): Promise<string[][]> {
  return Promise.all(
    cluster.nodes.map(async (node) => (await cluster.cli(node.port, '--scan', '--pattern', pattern)).split('\n').filter((k) => k !== '')),
  );
}

test('cluster: entries stored by one instance, spread over several nodes, are Redis hits on a fresh instance', async (t) => {
  const { clock, cluster, upstream } = await setup(t);
  const first = await startShared(t, cluster, upstream, clock);
  const misses = new Map<string, string>();
  for (const path of PATHS) {
    const response = await first.request(path);
    assert.equal(response.status, 200, path);
    assert.equal(response.headers.get('cache-status'), 'perch; fwd=miss; stored', path);
    misses.set(path, response.text);
  }
  assert.equal(upstream.requests.length, PATHS.length);

  // The entries really are sharded: several nodes hold some, and together they hold all.
  // By id only: each user is also stored under its username (cross-population).
  const byNode = await keysByNode(cluster, 't:c:/v1/users/[0-9]*');
  assert.equal(byNode.flat().length, PATHS.length, JSON.stringify(byNode));
  assert.ok(byNode.filter((keys) => keys.length > 0).length >= 2, `entries on one node only: ${JSON.stringify(byNode)}`);

  const second = await startShared(t, cluster, upstream, clock);
  for (const path of PATHS) {
    const response = await second.request(path);
    assert.equal(response.status, 200, path);
    assert.equal(response.text, misses.get(path), path);
    assert.match(response.headers.get('cache-status') ?? '', /^perch; hit; ttl=\d+; detail=redis$/, path);
  }
  assert.equal(upstream.requests.length, PATHS.length);
  assert.deepEqual(second.cache.redisStats, { errors: 0, skipped: 0, cleanupErrors: 0 });
});

test('cluster: 2 instances x 20 concurrent identical misses make exactly 1 upstream request', async (t) => {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const { clock, cluster, upstream } = await setup(t, (req, res) => void gate.then(() => sampleProvider(req, res)));
  const a = await startShared(t, cluster, upstream, clock);
  const b = await startShared(t, cluster, upstream, clock);
  await Promise.all([warmUp(a), warmUp(b)]);
  const path = '/v1/users/9/tweets?cursor=c1';
  const responses = [a, b].flatMap((perch) => Array.from({ length: 20 }, () => perch.request(path)));
  await waitFor(() => upstream.requests.length === 1 && a.received() === 20 && b.received() === 20, 10_000);
  // The lease is a single-key SET NX (in a script) in whichever node owns its slot.
  assert.equal((await keysByNode(cluster, 't:lock:*')).flat().length, 1);
  // Let the instance without the lease reach its polling loop before the holder answers: the
  // holder's lease is taken (its call is out), and one more lease attempt ran since, which only
  // the other instance makes.
  const evalsBefore = await evalCalls(cluster);
  await waitFor(async () => (await evalCalls(cluster)) > evalsBefore, 10_000);
  release();
  const results = await Promise.all(responses);
  assert.equal(upstream.requests.length, 1);
  assert.ok(results.every((r) => r.status === 200 && r.text === results[0]!.text));
  const statuses = results.map((r) => r.headers.get('cache-status') ?? '');
  // Which path each request took depends on scheduling (the rate limit itself is a Redis round
  // trip here, so a request may first look at the cache after the entry exists); what must hold
  // is that exactly one request fetched (a fetch is what `stored` without `collapsed` reports)
  // and that the other instance never fetched: it waited on the lease or found the entry.
  // The clock stands still: a hit has the endpoint's whole TTL left.
  const hit = new RegExp(`^perch; hit; ttl=${a.config.cache.ttl_seconds.tweets}(; detail=redis)?$`);
  const groups = [statuses.slice(0, 20), statuses.slice(20)];
  const holder = groups.findIndex((group) => group.includes('perch; fwd=miss; stored'));
  assert.notEqual(holder, -1, JSON.stringify(statuses));
  const [fetched, waited] = [groups[holder]!, groups[1 - holder]!];
  assert.equal(fetched.filter((s) => s === 'perch; fwd=miss; stored').length, 1, JSON.stringify(fetched));
  assert.ok(fetched.every((s) => s === 'perch; fwd=miss; stored' || s === 'perch; fwd=miss; collapsed; stored' || hit.test(s)), JSON.stringify(fetched));
  assert.ok(waited.every((s) => s === 'perch; fwd=miss; collapsed; detail=redis' || hit.test(s)), JSON.stringify(waited));
  // The holder freed its lease (a one-key EVAL routed to the lease's node; release is not awaited).
  await waitFor(async () => (await keysByNode(cluster, 't:lock:*')).flat().length === 0);
  assert.deepEqual([a.cache.redisStats, b.cache.redisStats], [{ errors: 0, skipped: 0, cleanupErrors: 0 }, { errors: 0, skipped: 0, cleanupErrors: 0 }]);
});

test('cluster: with one node killed, every request is still answered 200, from memory, Redis or upstream', async (t) => {
  const { clock, cluster, upstream } = await setup(t);
  const a = await startShared(t, cluster, upstream, clock, DEAD_NODE_COMMAND_TIMEOUT_MS);
  const b = await startShared(t, cluster, upstream, clock, DEAD_NODE_COMMAND_TIMEOUT_MS);
  const bodies = new Map<string, string>();
  for (const path of PATHS) bodies.set(path, (await a.request(path)).text);
  // By id only: each user is also stored under its username (cross-population).
  const byNode = await keysByNode(cluster, 't:c:/v1/users/[0-9]*');
  const victim = byNode.findIndex((keys) => keys.length > 0);
  const lost = new Set(byNode[victim]!.map((key) => key.slice('t:c:'.length)));
  assert.ok([...lost].every((path) => PATHS.includes(path)), JSON.stringify(byNode));
  assert.ok(lost.size < PATHS.length, 'every entry on one node');
  await cluster.nodes[victim]!.kill();

  const check = async (perch: RunningPerch, path: string) => {
    const started = performance.now();
    const response = await perch.request(path);
    const ms = performance.now() - started;
    assert.equal(response.status, 200, path);
    assert.ok(ms < SLOW_MS, `${path} took ${ms} ms`);
    return response;
  };

  // a: everything is in its memory, Redis is not needed.
  for (const path of PATHS) {
    const response = await check(a, path);
    assert.equal(response.text, bodies.get(path));
    assert.match(response.headers.get('cache-status') ?? '', /^perch; hit; ttl=\d+$/, path);
  }
  assert.equal(upstream.requests.length, PATHS.length);

  // b (empty memory): entries on live nodes may come from Redis, the dead node's from upstream.
  for (const path of PATHS) {
    const response = await check(b, path);
    assert.equal(response.text, bodies.get(path));
    if (lost.has(path)) assert.equal(response.headers.get('cache-status'), 'perch; fwd=miss; stored', path);
  }
  // New keys, some of whose slots belong to the dead node.
  for (let i = 100; i < 112; i++) await check(b, `/v1/users/${i}`);
  await Promise.all(Array.from({ length: 10 }, (_, i) => check(a, `/v1/users/${200 + i}`)));
  assert.ok(upstream.requests.length >= PATHS.length + lost.size + 22, `${upstream.requests.length} upstream requests`);
  // The dead node's calls failed (timed out) and were carried on without.
  assert.ok(b.cache.redisStats!.errors > 0);
});

/** The slot ranges a node serves, from `cluster nodes` as that node sees them. */
async function slotRanges(cluster: TestRedisCluster, port: number): Promise<Array<[number, number]>> {
  const me = (await cluster.cli(port, 'cluster', 'nodes')).split('\n').find((line) => line.includes('myself'))!;
  return me
    .split(' ')
    .slice(8)
    .map((range) => range.split('-').map(Number))
    .map(([from, to]) => [from!, to ?? from!] as [number, number]);
}

test('cluster: one of three masters dead, keys on the others are still stored, and a miss pays at most one command timeout', { timeout: 30_000 }, async (t) => {
  const { clock, cluster, upstream } = await setup(t);
  const perch = await startShared(t, cluster, upstream, clock, DEAD_NODE_COMMAND_TIMEOUT_MS);
  await warmUp(perch);
  const victim = cluster.nodes[1]!;
  const dead = await slotRanges(cluster, victim.port);
  const onDeadNode = (path: string) => {
    const slot = calculateSlot(`t:c:${path}`);
    return dead.some(([from, to]) => slot >= from && slot <= to);
  };
  await victim.kill();

  const paths = Array.from({ length: 30 }, (_, i) => `/v1/users/${300 + i}`);
  const timeouts: number[] = [];
  const durations: number[] = [];
  for (const path of paths) {
    const before = perch.cache.redisStats!.errors;
    const started = performance.now();
    const response = await perch.request(path);
    durations.push(performance.now() - started);
    assert.equal(response.status, 200, path);
    assert.equal(response.headers.get('cache-status'), 'perch; fwd=miss; stored', path);
    timeouts.push(perch.cache.redisStats!.errors - before);
  }
  // The clock stands still, so the dead node's breaker stays open after its first failure: one
  // miss pays one timeout, every later one skips the node. The rate limits share the cache's
  // connection and node breakers, so whichever call meets the dead node first (here the client's
  // bucket lives on it) opens it for both: the cache then never waits on it at all.
  assert.ok(timeouts.every((n) => n <= 1), JSON.stringify(timeouts));
  const slow = durations.filter((ms) => ms >= DEAD_NODE_COMMAND_TIMEOUT_MS);
  assert.equal(slow.length, 1, `misses of ${durations.map((ms) => ms.toFixed(0)).join(', ')} ms`);
  assert.ok(slow[0]! < 2 * DEAD_NODE_COMMAND_TIMEOUT_MS, `the slow miss took ${slow[0]!.toFixed(0)} ms: more than one timeout`);

  const live = cluster.nodes.filter((node) => node !== victim);
  const stored = new Set(
    (await Promise.all(live.map((node) => cluster.cli(node.port, '--scan', '--pattern', 't:c:/v1/users/3[0-9][0-9]'))))
      .flatMap((out) => out.split('\n'))
      .filter((key) => key !== '')
      .map((key) => key.slice('t:c:'.length)),
  );
  const expected = paths.filter((path) => !onDeadNode(path));
  const sorted = [...durations].sort((a, b) => a - b);
  t.diagnostic(
    `${stored.size} of ${paths.length} new keys stored; misses with a Redis timeout: ${timeouts.filter((n) => n > 0).length}; ` +
      `miss ms median ${sorted[15]!.toFixed(0)}, max ${sorted.at(-1)!.toFixed(0)} (command timeout ${DEAD_NODE_COMMAND_TIMEOUT_MS})`,
  );
  assert.deepEqual([...stored].sort(), [...expected].sort());
  assert.ok(expected.length >= 0.6 * paths.length, `${expected.length} of ${paths.length} keys on live nodes`);
  // Only the dead node is skipped.
  assert.equal(perch.cache.redisState, 'open');
  assert.equal(perch.logs.lines().filter((l) => l.msg === 'circuit breaker open: skipping dependency' && l.dependency === 'redis cache').length, 1);
});

test('cluster: a master killed while it has a replica: perch follows the promotion, and entries written after it land on the new master', { timeout: 60_000 }, async (t) => {
  const clock = new ManualClock();
  const cluster = await startRedisCluster(t, { replicas: 1, nodeTimeoutMs: 1000 });
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startShared(t, cluster, upstream, clock, DEAD_NODE_COMMAND_TIMEOUT_MS);
  await warmUp(perch);
  const victim = cluster.nodes[0]!;
  const ranges = await slotRanges(cluster, victim.port);
  const onVictim = (path: string) => {
    const slot = calculateSlot(`t:c:${path}`);
    return ranges.some(([from, to]) => slot >= from && slot <= to);
  };
  const paths = Array.from({ length: 1500 }, (_, i) => `/v1/users/${i + 1}`).filter(onVictim);
  // Its replica: the node whose master is the victim, in the victim's own view of the cluster.
  // That view learns the replica by gossip, which may not have reached it yet when the cluster
  // first reports itself ok (a Node 24 CI run once found no such line).
  const replicaPort = await pollFor(async () => {
    const lines = (await cluster.cli(victim.port, 'cluster', 'nodes')).split('\n');
    const victimId = lines.find((line) => line.includes('myself'))?.split(' ')[0];
    const replica = lines.find((line) => victimId !== undefined && line.split(' ')[3] === victimId);
    const port = replica === undefined ? undefined : Number(/:(\d+)@/.exec(replica)?.[1]);
    return port !== undefined && port > 0 ? port : undefined;
  }, 20_000);
  const exists = async (port: number, path: string) => (await cluster.cli(port, 'exists', `t:c:${path}`)) === '1';

  let next = 0;
  const request = async () => {
    const path = paths[next++]!;
    const started = performance.now();
    const response = await perch.request(path);
    assert.equal(response.status, 200, path);
    assert.ok(performance.now() - started < SLOW_MS, path);
    return path;
  };
  assert.ok(await exists(victim.port, await request()), 'stored on the master before');
  // A replica that never synced takes no failover (its data's age is unknown): wait for the link.
  await waitFor(async () => (await cluster.cli(replicaPort, 'role')).includes('connected'), 20_000);
  await victim.kill();
  // Traffic goes on through the failover: each is answered, from upstream, while the slots have no master.
  await waitFor(async () => {
    await request();
    return (await cluster.cli(replicaPort, 'role')).startsWith('master');
  }, 30_000);
  // perch finds the new master by itself: a new key of those slots is stored there.
  await waitFor(async () => exists(replicaPort, await request()), 30_000);
  for (let i = 0; i < 5; i++) assert.ok(await exists(replicaPort, await request()), 'every entry after it, on the new master');
});

test('cluster: the node of one key\'s bucket dead, the rate limits log falling back once for it, whatever the other nodes answer', { timeout: 60_000 }, async (t) => {
  const { clock, cluster, upstream } = await setup(t);
  const masters = cluster.nodes.slice(0, 3);
  const ranges = await Promise.all(masters.map((node) => slotRanges(cluster, node.port)));
  const nodeOf = (key: string) => ranges.findIndex((node) => node.some(([from, to]) => calculateSlot(key) >= from && calculateSlot(key) <= to));
  const victim = nodeOf('perch:rl:alpha');
  const other = ['bravo', 'charlie', 'delta', 'echo', 'foxtrot', 'golf', 'hotel'].find((id) => nodeOf(`perch:rl:${id}`) !== victim)!;
  const seeds = cluster.urls.map((url) => `"${url}"`).join(', ');
  // A bucket small enough that each key asks Redis for a lease again once its last one ends (1 s).
  const yaml = testConfig(v1('main', upstream.url), `rate_limits_redis: { cluster: [${seeds}], command_timeout_ms: ${DEAD_NODE_COMMAND_TIMEOUT_MS} }`)
    .replace('id: bravo', `id: ${other}`)
    .replace('big: { capacity: 100000, refill_per_second: 100000 }', 'big: { capacity: 40, refill_per_second: 0.001 }');
  const perch = await startPerch(t, yaml, { clock });
  for (let i = 0; i < 3; i++) {
    await perch.request(`/v1/users/${i}`);
    await perch.request(`/v1/users/${i}`, { key: OTHER_KEY });
  }
  await masters[victim]!.kill();
  const statuses: number[] = [];
  for (let i = 0; i < 10; i++) {
    statuses.push((await perch.request(`/v1/users/1${i}`)).status);
    statuses.push((await perch.request(`/v1/users/1${i}`, { key: OTHER_KEY })).status);
    clock.advance(1100);
  }
  const switches = perch.logs.lines().filter((l) => String(l.msg).startsWith('rate limits:'));
  t.diagnostic(`switch lines for 20 requests: ${switches.length}`);
  assert.deepEqual(statuses, Array(20).fill(200));
  assert.deepEqual(
    switches.map((l) => [l.msg, l.node]),
    [['rate limits: Redis failed, falling back to per-instance memory buckets', `127.0.0.1:${masters[victim]!.port}`]],
  );
});
