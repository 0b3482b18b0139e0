// Faults around the purge resync window (purge-sync.ts `current`) and pass-through verification
// waits bounded by the request's miss deadline (upstream-verifier.ts `gate`), found by attacking
// them over real Redis servers, real upstreams, relays and perch instances.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { test, type TestContext } from 'node:test';
import { connect, createConnection, createServer, type AddressInfo, type Socket } from 'node:net';
import { Redis } from 'ioredis';
import { ADMIN_YAML, outcome, purge } from './helpers/admin.js';
import { onCleanup } from './helpers/cleanup.js';
import { ManualClock } from './helpers/clock.js';
import { fakeX, type FakeX } from './helpers/fake-x.js';
import { KEY, startPerch, testConfig, v1, waitFor, type RunningPerch, type TestResponse } from './helpers/perch.js';
import { MAIN, spawnPerch } from './helpers/perch-process.js';
import { withPlan } from './helpers/plans.js';
import { tempDir } from './helpers/temp-dir.js';
import { startRedisCluster } from './helpers/redis-cluster.js';
import { startRedis, type TestRedis } from './helpers/redis-server.js';
import { refusedPort, sampleProvider, startUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';
import { answerAppOnlyWhoAmI } from './helpers/x-v2-fixtures.js';

const PATH = '/v1/users/1';

/** The sample provider, answering after `ms`. */
function slow(ms: number): UpstreamBehaviour {
  return (req, res) => void setTimeout(() => sampleProvider(req, res), ms);
}

async function admin(t: TestContext, url: string): Promise<Redis> {
  const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0 });
  await client.connect();
  onCleanup(t, () => void client.disconnect());
  return client;
}

/**
 * A relay to Redis that, once armed, acts on what a connection sends naming `marker` (any case):
 * `hold`, every reply on that connection from then on is held until `release` (one kind of
 * command stalls); `drop`, that command never reaches Redis (a subscription that never comes back).
 */
async function markerRelay(t: TestContext, port: number, marker: string, mode: 'hold' | 'drop' = 'hold') {
  let armed = false;
  let stalled = 0;
  const named = (chunk: Buffer) => chunk.toString().toUpperCase().includes(marker.toUpperCase());
  const holding = new Map<Socket, Buffer[]>();
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const target = createConnection(port, '127.0.0.1');
    sockets.add(client).add(target);
    client.on('error', () => {});
    target.on('error', () => {});
    client.on('close', () => target.destroy());
    target.on('close', () => client.destroy());
    client.on('data', (chunk: Buffer) => {
      if (armed && mode === 'drop' && named(chunk)) return void stalled++;
      if (armed && !holding.has(client) && named(chunk)) {
        holding.set(client, []);
        stalled++;
      }
      target.write(chunk);
    });
    target.on('data', (chunk: Buffer) => {
      const queue = holding.get(client);
      if (queue !== undefined) queue.push(chunk);
      else client.write(chunk);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  onCleanup(t, () => {
    for (const socket of sockets) socket.destroy();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return {
    url: `redis://127.0.0.1:${(server.address() as AddressInfo).port}`,
    arm: () => void (armed = true),
    stalled: () => stalled,
    release: () => {
      armed = false;
      for (const [client, queue] of holding) for (const chunk of queue) client.write(chunk);
      holding.clear();
    },
  };
}

const NEWCOMER = 'AAAAAAAAAAAAAAAAAAAAANewcomerOne%2Bfull';

/** X behind its token check: 401 to any token but NEWCOMER, an app-only token of the full plan. */
async function checkedX(t: TestContext) {
  const x = fakeX();
  const upstream = await startUpstream(t, (req, res) => {
    if (req.headers.authorization !== `Bearer ${NEWCOMER}`) {
      res.writeHead(401, { 'content-type': 'application/problem+json' });
      return void res.end('{"title":"Unauthorized","status":401,"detail":"Unauthorized"}');
    }
    if (answerAppOnlyWhoAmI(req, res)) return;
    x.behaviour(req, res);
  });
  return { x, upstream, calls: () => upstream.requests.filter((r) => r.headers.authorization === `Bearer ${NEWCOMER}`).length };
}

/**
 * `patient` starts the newcomer's verifying call, held at X: it holds the key's turn in Redis
 * while `other` is asked for the key.
 */
async function patientHoldsTheTurn(x: FakeX, patient: RunningPerch, other: RunningPerch): Promise<{ verifying: Promise<TestResponse> }> {
  await waitFor(() => patient.cache.redisConnected === true && other.cache.redisConnected === true);
  x.hold = true;
  const verifying = patient.request('/v1/users/1', { key: NEWCOMER });
  await waitFor(() => x.held.length === 1);
  return { verifying };
}

/** A raw connection to `perch`, open, that a test writes a request on and resets or half-closes. */
async function rawConnection(perch: RunningPerch): Promise<Socket> {
  const socket = connect(Number(new URL(perch.url).port), '127.0.0.1');
  socket.on('error', () => {});
  await new Promise((resolve) => socket.once('connect', resolve));
  return socket;
}

function passThrough(url: string, redisUrl: string, server: string, commandTimeoutMs: number, extra = ''): string {
  return `
server: { host: 127.0.0.1, port: 0, ${server} }
auth: { mode: upstream, default_plan: resale }
rate_limits: { resale: { capacity: 1000, refill_per_second: 1000 } }
upstreams: { x: { kind: x_v2, url: "${url}", timeout_ms: 2000 } }
cache: { redis: { url: "${redisUrl}", prefix: "t:", command_timeout_ms: ${commandTimeoutMs} } }
${extra}
`;
}

test(
  'an instance whose purge subscription is refused (its counters never synced) takes no lease and waits on none: it answers a shared miss within one provider call\'s time',
  { timeout: 30_000 },
  async (t) => {
    const upstream = await startUpstream(t, slow(600));
    const { a, b } = await aAndUnsyncedB(t, (url) => testConfig(v1('main', upstream.url), `cache: { stale_seconds: 0, redis: { url: "${url}", prefix: "t:", command_timeout_ms: 1000 } }`));
    assert.equal(b.logs.lines().filter((l) => l.msg === 'listening before the cache purge counters synced: until they are, each Redis read reads them too and nothing is written to Redis').length, 1);
    // A leads the fleet's flight for PATH; B misses the same path while A's call runs.
    const leading = a.request(PATH);
    await waitFor(() => upstream.requests.length === 1);
    const started = performance.now();
    const following = await b.request(PATH);
    const ms = performance.now() - started;
    assert.equal((await leading).status, 200);
    assert.equal(following.status, 200);
    const calls = upstream.requests.length;
    // B may fetch for itself (it cannot trust what A stores), but not only after A's whole flight.
    assert.ok(ms < 900, `B answered after ${Math.round(ms)} ms with a 600 ms provider (${calls} provider calls; cache-status ${following.headers.get('cache-status')})`);
  },
);

test(
  "a key's verifying turn asked of a Redis that stalled past command_timeout_ms is given back once Redis runs it: another instance's request of the key is not held until the orphan lease expires",
  { timeout: 30_000 },
  async (t) => {
    const redis = await startRedis(t);
    const { upstream: xUp, calls: xCalls } = await checkedX(t);
    const yaml = passThrough(xUp.url, redis.url, 'miss_deadline_ms: 2000', 300);
    const a = await startPerch(t, yaml);
    const b = await startPerch(t, yaml);
    await waitFor(() => a.cache.redisConnected === true && b.cache.redisConnected === true);
    const root = await admin(t, redis.url);
    // Redis stalls while A takes the newcomer's turn: A's SET NX times out (command_timeout_ms)
    // and A goes on without the fleet; the SET is still in Redis's socket buffer.
    redis.freeze();
    const aStarted = performance.now();
    const first = await a.request('/v1/users/1', { key: NEWCOMER });
    const aMs = performance.now() - aStarted;
    const aCalls = xCalls();
    redis.thaw();
    const orphan = await root.keys('t:auth:turn:*');
    const pttl = orphan.length === 0 ? -2 : await root.pttl(orphan[0]!);
    const before = xCalls();
    const started = performance.now();
    const second = await b.request('/v1/users/1', { key: NEWCOMER });
    const ms = performance.now() - started;
    assert.ok(
      second.status === 200 && ms < 1000,
      `B answered ${second.status} after ${Math.round(ms)} ms (A answered ${first.status} after ${Math.round(aMs)} ms, ${aCalls} X calls; turn keys left in Redis after the thaw: ${orphan.length}, pttl ${pttl} ms; X calls by B: ${xCalls() - before})`,
    );
  },
);

test(
  "a request waiting on its instance's verifying flight is not answered 499 when the client of the request that took the key's turn resets: it is answered (200 here, by a verifying call of its own)",
  { timeout: 30_000 },
  async (t) => {
    const redis = await startRedis(t);
    // The other instance's token buckets and verdicts through a relay that stalls the reading of a
    // verification turn (the unknown keys' bucket); everything else straight to Redis.
    const relay = await markerRelay(t, redis.port, 'perch:unverified');
    const { x, upstream, calls } = await checkedX(t);
    const yaml = (extra: string) => passThrough(upstream.url, redis.url, 'miss_deadline_ms: 20000', 10000, extra);
    const patient = await startPerch(t, yaml(`rate_limits_redis: { url: "${redis.url}", prefix: "r:", command_timeout_ms: 1000 }`));
    const other = await startPerch(t, yaml(`rate_limits_redis: { url: "${relay.url}", prefix: "r:", command_timeout_ms: 1000 }`));
    const { verifying } = await patientHoldsTheTurn(x, patient, other);
    // On the other instance: a request that will leave (it takes the key's turn next), then one of
    // the same key that waits on its flight and stays.
    const socket = await rawConnection(other);
    socket.write(`GET /v1/users/1 HTTP/1.1\r\nHost: perch\r\nx-api-key: ${NEWCOMER}\r\n\r\n`);
    await waitFor(() => other.received() === 1);
    const staying = other.request('/v1/users/2', { key: NEWCOMER });
    await waitFor(() => other.received() === 2);
    relay.arm();
    // The patient's call fails without a verdict: the turn passes to the leaving request, whose
    // verification turn (a token bucket in Redis) is read now, its reply held.
    x.failWith = { status: 503 };
    for (const release of x.held.splice(0)) release();
    assert.equal((await verifying).status, 502);
    x.failWith = undefined;
    x.hold = false;
    await waitFor(() => relay.stalled() > 0);
    socket.resetAndDestroy();
    // The leaving request learns its client left once its turn's read gives up (command_timeout_ms).
    await waitFor(() => other.logs.lines().some((l) => l.msg === 'request'), 10_000);
    relay.release();
    const answer = await staying;
    const lines = other.logs.lines().filter((l) => l.msg === 'request').map((l) => `${l.path} ${l.status} call=${l.upstream_call}`);
    assert.deepEqual(lines, ['/v1/users/1 499 call=false', '/v1/users/2 200 call=true']);
    assert.equal(answer.status, 200);
    // The patient's two (who the key speaks for, its failed verifying call), then the staying request's two.
    assert.equal(calls(), 4);
  },
);

test(
  "a client that half-closes (FIN) while its request waits on another instance's verifying turn is still answered: 504 at its miss deadline, no call",
  { timeout: 30_000 },
  async (t) => {
    const redis = await startRedis(t);
    const { x, upstream, calls } = await checkedX(t);
    const patient = await startPerch(t, passThrough(upstream.url, redis.url, 'miss_deadline_ms: 20000', 10000));
    const other = await startPerch(t, passThrough(upstream.url, redis.url, 'miss_deadline_ms: 1000', 10000));
    const { verifying } = await patientHoldsTheTurn(x, patient, other);
    const socket = await rawConnection(other);
    let reply = '';
    socket.on('data', (chunk: Buffer) => (reply += chunk.toString()));
    const started = performance.now();
    socket.end(`GET /v1/users/1 HTTP/1.1\r\nHost: perch\r\nx-api-key: ${NEWCOMER}\r\n\r\n`);
    await new Promise((resolve) => socket.once('close', resolve));
    const ms = performance.now() - started;
    for (const release of x.held.splice(0)) release();
    x.hold = false;
    assert.equal((await verifying).status, 200);
    const line = other.logs.lines().find((l) => l.msg === 'request');
    assert.ok(reply.startsWith('HTTP/1.1 504'), `half-closed client got ${JSON.stringify(reply.slice(0, 40))} after ${Math.round(ms)} ms; logged ${line?.status}; X calls ${calls()}`);
    assert.ok(ms >= 1000 && ms < 1500, `answered after ${Math.round(ms)} ms`);
    assert.equal(calls(), 2);
  },
);

test(
  'an instance whose purge counters cannot be read again after its subscription was lost says so in its log, as it does at its start, and serves nothing from Redis meanwhile',
  { timeout: 30_000 },
  async (t) => {
    const redis = await startRedis(t);
    const upstream = await startUpstream(t, sampleProvider);
    const perch = await startPerch(t, testConfig(v1('main', upstream.url), `cache: { stale_seconds: 0, redis: { url: "${redis.url}", prefix: "t:", command_timeout_ms: 1000 } }`));
    await waitFor(() => perch.logs.lines().some((l) => l.msg === 'cache purge counters synced'));
    assert.equal((await perch.request(PATH)).status, 200);
    await perch.cache.settled();
    perch.cache.memory.clear();
    assert.notEqual(await perch.cache.remote(PATH), undefined);
    // Something else under the counters' key (as in purge-sync-window.test.ts at a start), and the
    // subscription drops: every resync after it fails, perch's other commands still work.
    const root = await admin(t, redis.url);
    await root.set('t:gen', 'not a hash');
    await root.call('CLIENT', 'KILL', 'TYPE', 'pubsub');
    await waitFor(async () => (await perch.cache.remote(PATH)) === undefined);
    const warned = () => perch.logs.lines().some((l) => l.msg === 'cache purge counters not synced: until they are, each Redis read reads them too and nothing is written to Redis');
    const since = performance.now();
    let said = true;
    await waitFor(warned, 5000).catch(() => (said = false));
    const misses = upstream.requests.length;
    for (let i = 0; i < 3; i++) {
      perch.cache.memory.clear();
      await perch.request(PATH);
    }
    assert.ok(said, `nothing logged at warn in ${Math.round(performance.now() - since)} ms, while every Redis entry is a miss (provider calls for one path: ${misses} -> ${upstream.requests.length})`);
  },
);

test(
  "a perch process whose purge subscription is lost stays up when Redis answers its resubscription late (past command_timeout_ms): no unhandled rejection ends it",
  { timeout: 30_000 },
  async (t) => {
    const redis = await startRedis(t);
    const relay = await markerRelay(t, redis.port, 'subscribe');
    const upstream = await startUpstream(t, sampleProvider);
    const dir = tempDir(t, 'attack-purge-');
    const config = join(dir, 'perch.yaml');
    writeFileSync(config, testConfig(v1('main', upstream.url), `cache: { redis: { url: "${relay.url}", prefix: "t:", command_timeout_ms: 200 } }`));
    const perch = await spawnPerch(t, config);
    await waitFor(() => perch.stdout().includes('cache purge counters synced'));
    // From now on a connection's replies stall once it subscribes: the subscriber's next
    // connection answers its ready check, then nothing. Its subscription is dropped now.
    relay.arm();
    const root = await admin(t, redis.url);
    await root.call('CLIENT', 'KILL', 'TYPE', 'pubsub');
    await waitFor(() => relay.stalled() > 0);
    let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
    void perch.exited.then((exited) => (exit = exited));
    // Its own resubscriptions time out for a second (command_timeout_ms each), which it says.
    await waitFor(() => exit !== undefined || perch.stdout().includes('cache purge counters not synced'), 10_000);
    assert.equal(exit, undefined, `perch exited ${JSON.stringify(exit)}: ${perch.output().split('\n').slice(-4).join(' | ').slice(0, 600)}`);
    relay.release();
    await waitFor(() => perch.stdout().split('cache purge counters synced').length === 3, 10_000);
    const answer = await fetch(`${perch.url}/v1/users/1`, { headers: { 'x-api-key': KEY } });
    assert.equal(answer.status, 200);
  },
);

/**
 * A perch process started on a Redis that accepts connections but does not answer yet: it waits
 * in its start wait (up to 2 s for the purge counters) once it has logged `starting`.
 */
async function startingOnFrozenRedis(t: TestContext) {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const path = join(tempDir(t, 'perch-starting-'), 'perch.yaml');
  writeFileSync(path, testConfig(v1('main', upstream.url), `cache: { redis: { url: "${redis.url}", command_timeout_ms: 5000 } }`));
  redis.freeze();
  onCleanup(t, () => redis.thaw());
  const child = spawn(process.execPath, [MAIN, '--config', path], { env: { PATH: process.env.PATH }, stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  onCleanup(t, async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
  });
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  // Logged just before the signals are handled, in the same synchronous step.
  await waitFor(() => output.includes('starting'), 10_000);
  return { redis, child, exited, output: () => output };
}

/** How many times an instance logged that it read the purge counters. */
function synced(perch: { logs: { text(): string } }): number {
  return perch.logs.text().split('cache purge counters synced').length - 1;
}

test(
  'cluster: a purge counted while the purge subscription was down is applied once it is back',
  { timeout: 60_000, todo: "ioredis's ClusterSubscriber moves the subscription to another node by itself and tells the Cluster nothing: perch cannot know to resync" }, async (t) => {
  const clock = new ManualClock();
  const cluster = await startRedisCluster(t);
  const upstream = await startUpstream(t, sampleProvider);
  const seeds = cluster.urls.map((url) => `"${url}"`).join(', ');
  const yaml = `cache: { stale_seconds: 0, ttl_seconds: { user: 300, tweets: 300 }, redis: { cluster: [${seeds}], prefix: "t:", command_timeout_ms: 1000 } }`;
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), yaml), { clock });
  await waitFor(() => perch.cache.redisConnected === true && synced(perch) >= 1, 10_000);

  assert.equal((await perch.request('/v1/users/1')).status, 200);
  const fetched = upstream.requests.length;
  assert.ok(fetched >= 1);
  assert.equal((await perch.request('/v1/users/1')).headers.get('cache-status')?.startsWith('perch; hit'), true);
  assert.equal(upstream.requests.length, fetched);

  // Another instance's `all` purge, counted in Redis while this instance's subscription is
  // down: the message is lost to it, as any message sent in that gap is.
  const pubsub = async () => (await Promise.all(cluster.nodes.map((node) => cluster.cli(node.port, 'client', 'list', 'type', 'pubsub')))).map((s) => s.split('\n').filter((l) => l !== '').length);
  assert.equal((await pubsub()).reduce((a, b) => a + b, 0), 1, 'one purge subscriber in the cluster');
  await cluster.cli(cluster.nodes[0]!.port, '-c', 'hincrby', 't:gen', 'all', '1');
  for (const node of cluster.nodes) await cluster.cli(node.port, 'client', 'kill', 'type', 'pubsub');
  // ioredis's ClusterSubscriber picks a node and subscribes again on its own.
  await waitFor(async () => (await pubsub()).reduce((a, b) => a + b, 0) === 1, 10_000);

  // Back on the channel: the instance must re-read the counters before it relies on messages
  // again (docs/caching.md), and so drop the entry the purge dropped.
  let status = '';
  const refetched = async () => {
    status = (await perch.request('/v1/users/1')).headers.get('cache-status') ?? '';
    return upstream.requests.length > fetched;
  };
  await waitFor(refetched, 3000).catch(() => undefined);
  assert.ok(
    upstream.requests.length > fetched,
    `purged entry still served 3 s after the subscription came back: upstream calls ${upstream.requests.length} (was ${fetched}), last cache-status "${status}", resyncs logged ${synced(perch)}`,
  );
});

test('a SIGHUP while perch waits for its first purge resync reloads it rather than killing it', { timeout: 30_000 }, async (t) => {
  const { redis, child, output } = await startingOnFrozenRedis(t);
  assert.ok(!output().includes('perch is up'), 'still in its start wait');
  const startedAt = performance.now();
  // An operator's (or a config manager's) reload of a perch that is starting.
  child.kill('SIGHUP');
  redis.thaw();
  await waitFor(() => output().includes('perch is up') || child.exitCode !== null || child.signalCode !== null, 10_000);
  assert.equal(child.signalCode, null, `perch died of ${String(child.signalCode)} ${Math.round(performance.now() - startedAt)} ms after a SIGHUP in its start wait; output:\n${output().slice(-600)}`);
  assert.match(output(), /perch is up/);
});

test('a brief purge-subscriber blip with no purge in it costs no provider calls for entries Redis holds', { timeout: 60_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = testConfig(v1('main', upstream.url), `cache: { stale_seconds: 0, ttl_seconds: { user: 300 }, redis: { url: "${redis.url}", prefix: "t:" } }`);
  const filler = await startPerch(t, yaml);
  const served = await startPerch(t, yaml);
  await waitFor(() => synced(filler) >= 1 && synced(served) >= 1, 10_000);
  const PATHS = Array.from({ length: 400 }, (_, i) => `/v1/users/${i + 1}`);
  for (const path of PATHS) assert.equal((await filler.request(path)).status, 200);
  const filled = upstream.requests.length;
  // Steady load on the other instance, every request a Redis hit, with the subscriber's
  // connection killed (a proxy's idle timeout, a failover's CLIENT KILL) a quarter of the way in.
  const statuses = new Map<string, number>();
  let killed = false;
  let i = 0;
  for (const path of PATHS) {
    if (i++ === 100) {
      await promisify(execFile)(process.env.REDIS_CLI ?? 'redis-cli', ['-p', String(redis.port), 'client', 'kill', 'type', 'pubsub']);
      killed = true;
    }
    const status = (await served.request(path)).headers.get('cache-status') ?? '';
    const kind = status.includes('detail=redis') ? 'redis' : status.includes('fwd=miss') ? 'miss' : status;
    if (killed) statuses.set(kind, (statuses.get(kind) ?? 0) + 1);
  }
  const calls = upstream.requests.length - filled;
  assert.equal(calls, 0, `provider calls during the blip: ${calls}; outcomes after the kill: ${JSON.stringify(Object.fromEntries(statuses))}`);
});

test('the start line about unsynced purge counters gives the time perch really waited', { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const port = await refusedPort();
  const started = performance.now();
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), `cache: { redis: { url: "redis://127.0.0.1:${port}", prefix: "t:" } }`));
  const ms = performance.now() - started;
  const line = perch.logs.lines().find((l) => l.msg === 'listening before the cache purge counters synced: until they are, each Redis read reads them too and nothing is written to Redis');
  assert.ok(line !== undefined, 'the line is logged');
  const waited = (line as { waited_ms?: number }).waited_ms ?? NaN;
  assert.ok(waited <= ms + 50, `logged waited_ms ${waited} for a start that took ${Math.round(ms)} ms in all (Redis refusing)`);
});

/** A password for the ACL users below. */
const PASSWORD = 'pw-0123456789';

/**
 * A Redis user that may run every command on every key but subscribe to no channel (Redis 7's
 * `acl-pubsub-default resetchannels`): an instance using it never syncs its purge counters,
 * while it is not cut off from Redis.
 */
async function noChannels(root: Redis, user: string): Promise<void> {
  await root.call('ACL', 'SETUSER', user, 'on', `>${PASSWORD}`, '~*', '+@all');
}

function asUser(port: number, user: string): string {
  return `redis://${user}:${PASSWORD}@127.0.0.1:${port}`;
}

/**
 * A on Redis's default user and B on one that may subscribe to no channel (`noChannels`): B's
 * purge counters never sync, while every other command it sends works.
 */
async function aAndUnsyncedB(t: TestContext, yaml: (url: string) => string): Promise<{ redis: TestRedis; a: RunningPerch; b: RunningPerch }> {
  const redis = await startRedis(t);
  await noChannels(await admin(t, redis.url), 'perchb');
  const a = await startPerch(t, yaml(redis.url));
  const b = await startPerch(t, yaml(asUser(redis.port, 'perchb')));
  await waitFor(() => a.cache.redisConnected === true && b.cache.redisConnected === true);
  return { redis, a, b };
}

/** A perch with purges, in front of `upstream`, on the Redis at the URL it is given. */
function purgeable(upstream: string): (url: string) => string {
  return (url) => testConfig(v1('main', upstream), `${ADMIN_YAML}\ncache: { stale_seconds: 0, ttl_seconds: { user: 300 }, redis: { url: "${url}", prefix: "t:" } }`);
}

test('a SIGTERM while perch waits for its first purge resync stops it with status 0 and it never listens', { timeout: 30_000 }, async (t) => {
  const { redis, child, exited, output } = await startingOnFrozenRedis(t);
  const sent = performance.now();
  child.kill('SIGTERM');
  // Redis stays frozen past the 2 s start wait.
  let done: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  void exited.then((exit) => (done = exit));
  await waitFor(() => done !== undefined, 6000).catch(() => undefined);
  const ms = Math.round(performance.now() - sent);
  redis.thaw();
  assert.ok(done !== undefined && done.code === 0, `after a SIGTERM in the start wait: ${done === undefined ? `still running after ${ms} ms` : `exit ${String(done.code)} signal ${String(done.signal)} after ${ms} ms`}; listened: ${output().includes('perch is up')}; output:\n${output().slice(-800)}`);
  assert.ok(!output().includes('perch is up'), `listened after the SIGTERM:\n${output().slice(-800)}`);
});

test(
  'after Redis lost its counters, an entry stored by an unsynced instance under its higher view is not served after a purge of its scope answered 200',
  { timeout: 30_000 },
  async (t) => {
    const redis = await startRedis(t);
    const root = await admin(t, redis.url);
    await root.call('ACL', 'SETUSER', 'percha', 'on', `>${PASSWORD}`, '~*', '&*', '+@all');
    // B may run every command but subscribe to nothing: it never syncs, and reads the counters
    // after each entry it finds (catchUp).
    await noChannels(root, 'perchb');
    const upstream = await startUpstream(t, sampleProvider);
    const yaml = purgeable(upstream.url);
    const a = await startPerch(t, yaml(asUser(redis.port, 'percha')));
    const b = await startPerch(t, yaml(asUser(redis.port, 'perchb')));
    await waitFor(() => a.cache.current && b.cache.redisConnected === true);
    assert.equal((await purge(a, { all: true })).status, 200);
    assert.equal((await purge(a, { all: true })).status, 200);
    assert.equal(await outcome(a, '/v1/users/9'), 'miss');
    await a.cache.settled();
    // B finds the entry and raises its view to the counters (all 2).
    assert.equal(await outcome(b, '/v1/users/9'), 'redis');
    assert.equal(b.cache.generations.all, 2);
    // A leaves the fleet (its user disabled), then Redis loses its data.
    await root.call('ACL', 'SETUSER', 'percha', 'off');
    await root.call('CLIENT', 'KILL', 'USER', 'percha');
    await root.flushall();
    // A new instance restores the counters from its own view (all 0).
    const c = await startPerch(t, yaml(redis.url));
    await waitFor(() => c.cache.current, 10_000);
    await waitFor(async () => (await root.hget('t:gen', 'all')) !== null);
    const hash = await root.hgetall('t:gen');
    // B misses and stores its fetch in Redis under its view (all 2).
    assert.equal(await outcome(b, '/v1/users/1'), 'miss');
    await b.cache.settled();
    const res = await purge(c, { endpoint: 'user', user_id: '1' });
    assert.equal(res.status, 200, res.text);
    const after = await outcome(c, '/v1/users/1');
    assert.ok(
      after !== 'redis' && after !== 'memory',
      `C served B's pre-purge entry from Redis after its own purge answered 200: cache-status "${after}"; counters after C's start ${JSON.stringify(hash)}, now ${JSON.stringify(await root.hgetall('t:gen'))}; views: B all ${b.cache.generations.all}, C all ${c.cache.generations.all}`,
    );
  },
);

test(
  'after Redis lost its counters and an instance restored them lower, an unsynced instance writes its higher view back on its next read of an entry: the fleet agrees again, and what one stores the other takes',
  { timeout: 30_000 },
  async (t) => {
    const redis = await startRedis(t);
    const root = await admin(t, redis.url);
    await root.call('ACL', 'SETUSER', 'percha', 'on', `>${PASSWORD}`, '~*', '&*', '+@all');
    // B's subscription lost and never back, everything else it sends reaching Redis.
    const relay = await markerRelay(t, redis.port, 'SUBSCRIBE', 'drop');
    const upstream = await startUpstream(t, sampleProvider);
    const yaml = purgeable(upstream.url);
    const a = await startPerch(t, yaml(asUser(redis.port, 'percha')));
    const b = await startPerch(t, yaml(relay.url));
    await waitFor(() => a.cache.current && b.cache.current);
    assert.equal((await purge(a, { all: true })).status, 200);
    assert.equal((await purge(a, { all: true })).status, 200);
    assert.equal(b.cache.generations.all, 2);
    relay.arm();
    await root.call('CLIENT', 'KILL', 'TYPE', 'pubsub');
    await waitFor(() => !b.cache.current && relay.stalled() > 0);
    // A leaves the fleet, then Redis loses its data; a new instance restores the counters from
    // its own view (all 0).
    await root.call('ACL', 'SETUSER', 'percha', 'off');
    await root.call('CLIENT', 'KILL', 'USER', 'percha');
    await root.flushall();
    const c = await startPerch(t, yaml(redis.url));
    await waitFor(() => c.cache.current, 10_000);
    // An `all` purge after the loss, counted from the restored (lower) counters.
    assert.equal((await purge(c, { all: true })).status, 200);
    // B's next read of an entry reads the counters after it, finds them below its view and writes
    // its view back, which the others hear: every view stands at B's, above both lineages' purges.
    // The entry, stamped below it, is a miss (once, after Redis lost everything).
    assert.equal(await outcome(c, '/v1/users/99'), 'miss');
    await c.cache.settled();
    assert.equal(await outcome(b, '/v1/users/99'), 'miss');
    await waitFor(() => c.cache.generations.all === 2);
    assert.equal(b.cache.generations.all, 2);
    assert.equal(await root.hget('t:gen', 'all'), '2');
    const paths = Array.from({ length: 20 }, (_, i) => `/v1/users/${i + 100}`);
    for (const path of paths) assert.equal(await outcome(c, path), 'miss');
    await c.cache.settled();
    const before = upstream.requests.length;
    const kinds: string[] = [];
    for (const path of paths) kinds.push(await outcome(b, path));
    const calls = upstream.requests.length - before;
    assert.equal(calls, 0, `B's reads of 20 entries C stored: ${calls} provider calls, outcomes ${JSON.stringify(kinds.slice(0, 3))}...; counters ${JSON.stringify(await root.hgetall('t:gen'))}; views B all ${b.cache.generations.all}, C all ${c.cache.generations.all}`);
  },
);

test('an unsynced instance keeps its fetches out of Redis, where its stamps could be below or above the fleet\'s counters; once synced, it shares them again', { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const { redis, a, b } = await aAndUnsyncedB(t, purgeable(upstream.url));
  const root = await admin(t, redis.url);
  await waitFor(() => a.cache.current);
  // Purges long before: the fleet's counters stand at all 1; B, which never syncs, found no entry
  // in Redis yet, so its view stands at 0.
  assert.equal((await purge(a, { all: true })).status, 200);
  const paths = Array.from({ length: 10 }, (_, i) => `/v1/users/${i + 50}`);
  for (const path of paths) assert.equal(await outcome(b, path), 'miss');
  await b.cache.settled();
  assert.equal(await root.exists(...paths.map((path) => `t:c:${path}`)), 0);
  // A's own fetches are in Redis, and B takes them, judged by the counters it reads after each.
  assert.equal(await outcome(a, '/v1/users/60'), 'miss');
  await a.cache.settled();
  assert.equal(await outcome(b, '/v1/users/60'), 'redis');
  assert.equal(b.cache.generations.all, 1);
});

test(
  'after a purge-subscriber loss that does not come back, an instance still talking to Redis serves no memory entry older than a purge answered 200',
  { timeout: 30_000, todo: 'its memory is served until it resyncs, as when cut off (docs/caching.md): judging it by the counters on every request charged free hits and made them wait on a stalled Redis' },
  async (t) => {
  const redis = await startRedis(t);
  const relay = await markerRelay(t, redis.port, 'SUBSCRIBE', 'drop');
  const upstream = await startUpstream(t, sampleProvider);
  const yaml = purgeable(upstream.url);
  const a = await startPerch(t, yaml(redis.url));
  const b = await startPerch(t, yaml(relay.url));
  await waitFor(() => a.cache.current && b.cache.current);
  assert.equal(await outcome(b, '/v1/users/1'), 'miss');
  assert.equal(await outcome(b, '/v1/users/1'), 'memory');
  relay.arm();
  // A proxy's idle timeout, a failover's CLIENT KILL: B's subscriber reconnects, its SUBSCRIBE lost.
  await promisify(execFile)(process.env.REDIS_CLI ?? 'redis-cli', ['-p', String(redis.port), 'client', 'kill', 'type', 'pubsub']);
  await waitFor(() => !b.cache.current && relay.stalled() > 0);
  await waitFor(() => a.cache.current);
  const res = await purge(a, { endpoint: 'user', user_id: '1' });
  assert.equal(res.status, 200, res.text);
  // B's cache connection works: it reads Redis (a hit on another key's entry would catch up).
  const after = await outcome(b, '/v1/users/1');
  assert.ok(after !== 'memory', `B served its pre-purge memory entry after the purge was answered 200: cache-status "${after}"; B redis connected ${String(b.cache.redisConnected)}, breaker ${String(b.cache.redisState)}, current ${String(b.cache.current)}`);
});

/** One token, nearly no refill: the first miss empties the bucket; only free hits pass after it. */
const FREE_HITS = '{ capacity: 1, refill_per_second: 0.001, cost_of_hit: 0 }';

function freeHits(upstream: string, redisUrl: string): string {
  return withPlan(testConfig(v1('main', upstream), `cache: { stale_seconds: 0, ttl_seconds: { user: 300 }, redis: { url: "${redisUrl}", prefix: "t:", command_timeout_ms: 500 } }`), FREE_HITS);
}

test(
  'cost_of_hit 0: a memory hit is free with an empty bucket while the purge subscription is down and Redis is reachable',
  { timeout: 30_000 },
  async (t) => {
    const redis = await startRedis(t);
    await noChannels(await admin(t, redis.url), 'nosub');
    const upstream = await startUpstream(t, sampleProvider);
    const perch = await startPerch(t, freeHits(upstream.url, asUser(redis.port, 'nosub')));
    await waitFor(() => perch.cache.redisConnected === true);
    assert.equal(perch.cache.current, false);
    const miss = await perch.request(PATH);
    assert.equal(miss.status, 200);
    const statuses: string[] = [];
    for (let i = 0; i < 5; i++) {
      const res = await perch.request(PATH);
      statuses.push(`${res.status} ${res.headers.get('cache-status') ?? ''} ${res.headers.get('ratelimit') ?? ''}`);
    }
    assert.ok(
      statuses.every((s) => s.startsWith('200 perch; hit')),
      `memory hits of a cost_of_hit 0 plan after the bucket emptied, unsynced: ${JSON.stringify(statuses)}; provider calls ${upstream.requests.length}`,
    );
  },
);

test('cost_of_hit 0: a memory hit is free with an empty bucket while Redis is down', { timeout: 30_000 }, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, freeHits(upstream.url, redis.url));
  await waitFor(() => perch.cache.current);
  assert.equal((await perch.request(PATH)).status, 200);
  await perch.cache.settled();
  const synced = await perch.request(PATH);
  assert.equal(synced.status, 200, 'a free hit while synced');
  await redis.kill();
  await waitFor(() => !perch.cache.current);
  const statuses: string[] = [];
  for (let i = 0; i < 5; i++) {
    const res = await perch.request(PATH);
    statuses.push(`${res.status} ${res.headers.get('cache-status') ?? ''} ${res.headers.get('ratelimit') ?? ''}`);
  }
  assert.ok(
    statuses.every((s) => s.startsWith('200 perch; hit')),
    `memory hits of a cost_of_hit 0 plan after the bucket emptied, Redis down: ${JSON.stringify(statuses)}; provider calls ${upstream.requests.length}`,
  );
});

test(
  'cost_of_hit 0: a memory hit is answered without waiting on a stalled Redis while the purge subscription is down',
  { timeout: 30_000 },
  async (t) => {
    const redis = await startRedis(t);
    await noChannels(await admin(t, redis.url), 'nosub');
    const upstream = await startUpstream(t, sampleProvider);
    // Free hits on a roomy bucket: a hit never asks the limiter's Redis, only the cache can wait.
    const perch = await startPerch(t, freeHits(upstream.url, asUser(redis.port, 'nosub')).replace(FREE_HITS, '{ capacity: 100000, refill_per_second: 100000, cost_of_hit: 0 }'));
    await waitFor(() => perch.cache.redisConnected === true);
    assert.equal(perch.cache.current, false);
    assert.equal((await perch.request(PATH)).status, 200);
    await perch.cache.settled();
    redis.freeze();
    onCleanup(t, () => redis.thaw());
    const took: string[] = [];
    for (let i = 0; i < 8; i++) {
      const began = performance.now();
      const res = await perch.request(PATH);
      took.push(`${res.status} ${res.headers.get('cache-status') ?? ''} ${Math.round(performance.now() - began)}ms`);
    }
    const slowest = Math.max(...took.map((s) => Number(/(\d+)ms$/.exec(s)![1])));
    assert.ok(slowest < 100, `memory hits with Redis frozen, unsynced (command_timeout_ms 500): ${JSON.stringify(took)}; provider calls ${upstream.requests.length}`);
  },
);

/** A whole perch on a Redis user that may subscribe to no channel (`noChannels`): never synced, never cut off. */
async function unsyncedPerch(t: TestContext) {
  const redis = await startRedis(t);
  await noChannels(await admin(t, redis.url), 'perchb');
  const upstream = await startUpstream(t, sampleProvider);
  const perch = await startPerch(t, testConfig(v1('main', upstream.url), `cache: { stale_seconds: 0, ttl_seconds: { user: 100, user_by_username: 50 }, redis: { url: "${asUser(redis.port, 'perchb')}", prefix: "t:" } }`), { clock: new ManualClock() });
  await waitFor(() => perch.cache.redisConnected === true);
  assert.equal(perch.cache.current, false);
  return { perch, upstream };
}

test('an unsynced perch answers a user by id from its fetch by username: one provider call for both routes', { timeout: 20_000 }, async (t) => {
  const { perch, upstream } = await unsyncedPerch(t);
  assert.equal((await perch.request('/v1/users/by/username/alice')).status, 200);
  const twin = await perch.request('/v1/users/123');
  assert.equal(twin.status, 200);
  assert.equal(upstream.requests.length, 1, `twin route: ${twin.headers.get('cache-status')}`);
});

