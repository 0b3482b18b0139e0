import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { closeSync, constants, copyFileSync, openSync, readdirSync, readFileSync, readlinkSync, renameSync, writeFileSync, writeSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { createServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { parseCommand } from '../src/cli.js';
import { nodeVersionProblem } from '../src/node-version.js';
import { onCleanup } from './helpers/cleanup.js';
import { KEY, OTHER_KEY, waitFor } from './helpers/perch.js';
import { freePort, MAIN, runCli, spawnPerch, within, type PerchProcess } from './helpers/perch-process.js';
import { startRedis } from './helpers/redis-server.js';
import { tempDir } from './helpers/temp-dir.js';
import { selfSignedCertificate } from './helpers/tls-files.js';
import { sampleProvider, startUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';

const T = { timeout: 60_000 };

/** Two keys on a plan of 10 requests that refills next to never, so a limit shows exactly. */
function yaml(port: number, upstream: string, redis: string | undefined, keys = [`{ id: alpha, key: "${KEY}", plan: small }`], extra = ''): string {
  return `
server: { host: 127.0.0.1, port: ${port}, shutdown_grace_ms: 5000 }
auth:
  keys:
${keys.map((k) => `    - ${k}`).join('\n')}
rate_limits:
  small: { capacity: 10, refill_per_second: 0.001 }
  big: { capacity: 100000, refill_per_second: 1000 }
upstreams:
  main: { kind: v1, url: "${upstream}", timeout_ms: 5000 }
${redis === undefined ? '' : `cache: { redis: { url: "${redis}" } }`}
${extra}
`;
}

/** GET on a connection of its own, so the kernel picks a worker for each; resolves with the status. */
function get(port: number, path: string, key: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, agent: false, headers: { 'x-api-key': key } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    req.end();
  });
}

function lines(perch: PerchProcess): Record<string, any>[] {
  return perch
    .stdout()
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as Record<string, any>);
}

/** The pids of the workers started so far, by worker number; each is killed when the test ends. */
function workerPids(t: TestContext, perch: PerchProcess): Map<number, number> {
  const pids = new Map<number, number>();
  for (const line of lines(perch)) if (line.msg === 'worker started') pids.set(line.worker, line.pid);
  for (const pid of pids.values()) {
    onCleanup(t, () => {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // Gone already, as it should be.
      }
    });
  }
  return pids;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** `perch --workers 2` on a free port, its limits and cache in a Redis of its own, once both listen. */
async function twoWorkers(t: TestContext, behaviour: UpstreamBehaviour, keys?: string[]) {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, behaviour);
  const port = await freePort();
  const config = join(tempDir(t, 'perch-workers-'), 'perch.yaml');
  writeFileSync(config, yaml(port, upstream.url, redis.url, keys));
  const perch = await spawnPerch(t, config, {}, ['--workers', '2']);
  await waitFor(() => lines(perch).filter((l) => l.msg === 'perch listening').length === 2, 30_000);
  return { perch, port, config, upstream, redis };
}

test('--workers takes a count from 1 to 1024 or auto, and goes with serving only', { timeout: 5000 }, () => {
  assert.deepEqual(parseCommand(['--config', 'p.yaml', '--workers', '3'], {}), { kind: 'serve', configPath: 'p.yaml', workers: 3 });
  assert.deepEqual(parseCommand(['--config', 'p.yaml'], {}), { kind: 'serve', configPath: 'p.yaml', workers: 1 });
  const auto = parseCommand(['--config', 'p.yaml', '--workers', 'auto'], {});
  assert.ok(auto.kind === 'serve' && auto.workers >= 1);
  for (const bad of ['0', '1025', '2.5', 'two', '']) {
    assert.deepEqual(parseCommand(['--config', 'p.yaml', '--workers', bad], {}), {
      kind: 'usage_error',
      message: `--workers takes a whole number from 1 to 1024 or auto, not ${JSON.stringify(bad)}`,
    });
  }
  assert.deepEqual(parseCommand(['--config', 'p.yaml', '--workers', '2', '--check-config'], {}), { kind: 'check', configPath: 'p.yaml', workers: 2 });
  assert.deepEqual(parseCommand(['--config', 'p.yaml', '--check-config'], {}), { kind: 'check', configPath: 'p.yaml', workers: 1 });
  assert.deepEqual(parseCommand(['--config', 'p.yaml', '--workers', '2', '--health-check'], {}), {
    kind: 'usage_error',
    message: '--workers goes with serving or --check-config, not with --health-check',
  });
});

test('--workers above 1 without cache.redis (rate_limits_redis alone too), or on port 0, is refused at start and by --check-config with the reason', T, async (t) => {
  const dir = tempDir(t, 'perch-workers-');
  const noRedis = join(dir, 'no-redis.yaml');
  writeFileSync(noRedis, yaml(await freePort(), 'http://127.0.0.1:9', undefined));
  const limitsOnly = join(dir, 'limits-only.yaml');
  writeFileSync(limitsOnly, yaml(await freePort(), 'http://127.0.0.1:9', undefined, undefined, 'rate_limits_redis: { url: "redis://127.0.0.1:9" }'));
  const reason =
    'needs cache.redis: each worker has a memory cache of its own, and only through the shared cache do purges, shared flights and the rate limits reach every worker';
  for (const file of [noRedis, limitsOnly]) {
    const refused = await within(runCli(t, ['--config', file, '--workers', '2']), 10_000, 'perch --workers 2 refuses');
    assert.deepEqual([refused.code, refused.stderr], [2, `perch: --workers 2 ${reason}\n`]);
    const checked = await runCli(t, ['--config', file, '--workers', '2', '--check-config']);
    assert.deepEqual([checked.code, checked.stderr], [2, `perch: ${file} is not a valid configuration:\n  --workers 2 ${reason}\n`]);
    assert.equal((await runCli(t, ['--config', file, '--check-config'])).code, 0, 'one process needs no Redis');
  }
  const anyPort = join(dir, 'port-0.yaml');
  writeFileSync(anyPort, yaml(0, 'http://127.0.0.1:9', 'redis://127.0.0.1:9'));
  const portZero = await runCli(t, ['--config', anyPort, '--workers', '3']);
  assert.deepEqual([portZero.code, portZero.stderr], [2, 'perch: --workers 3 needs a fixed server.port: with port 0 each worker would pick a port of its own\n']);
});

test('two workers on one port both answer, share the cache and a key\'s limit through Redis, reload together on SIGHUP, and drain together on SIGTERM', T, async (t) => {
  const { perch, port, config, upstream, redis } = await twoWorkers(t, sampleProvider);
  const pids = workerPids(t, perch);
  assert.deepEqual([...pids.keys()].sort(), [1, 2]);

  // Sixteen requests, each on a connection of its own: the plan's ten pass across both workers.
  const statuses: number[] = [];
  for (let i = 0; i < 16; i++) statuses.push(await get(port, '/v1/users/1', KEY));
  assert.deepEqual(statuses, [...Array(10).fill(200), ...Array(6).fill(429)]);
  // Access lines leave in batches: wait for all sixteen.
  await waitFor(() => lines(perch).filter((l) => l.msg === 'request').length === 16, 30_000);
  const served = lines(perch).filter((l) => l.msg === 'request');
  assert.deepEqual(new Set(served.map((l) => l.worker)), new Set([1, 2]), 'the kernel spread the connections');
  assert.equal(upstream.requests.length, 1, 'one provider call, whichever worker was asked');

  // A key added to the file: SIGHUP to the primary reloads both workers.
  writeFileSync(config, yaml(port, upstream.url, redis.url, [`{ id: alpha, key: "${KEY}", plan: small }`, `{ id: bravo, key: "${OTHER_KEY}", plan: small }`]));
  perch.process.kill('SIGHUP');
  await waitFor(() => lines(perch).filter((l) => l.msg === 'configuration reloaded').length === 2, 30_000);
  assert.deepEqual(new Set(lines(perch).filter((l) => l.msg === 'configuration reloaded').map((l) => l.worker)), new Set([1, 2]));
  for (let i = 0; i < 8; i++) assert.equal(await get(port, '/v1/users/1', OTHER_KEY), 200);
  await waitFor(() => lines(perch).filter((l) => l.msg === 'request' && l.key_id === 'bravo').length === 8, 30_000);
  assert.deepEqual(new Set(lines(perch).filter((l) => l.msg === 'request' && l.key_id === 'bravo').map((l) => l.worker)), new Set([1, 2]));

  perch.process.kill('SIGTERM');
  assert.deepEqual(await perch.exited, { code: 0, signal: null });
  for (const pid of pids.values()) assert.equal(alive(pid), false);
  assert.equal(lines(perch).filter((l) => l.msg === 'perch stopped').length, 3, 'both workers, then the primary');
});

test('a worker that dies is started again, and the port keeps serving', T, async (t) => {
  const { perch, port } = await twoWorkers(t, sampleProvider);
  const first = workerPids(t, perch).get(2)!;
  process.kill(first, 'SIGKILL');
  await waitFor(() => lines(perch).filter((l) => l.msg === 'perch listening').length === 3, 30_000);
  const exited = lines(perch).find((l) => l.msg === 'worker exited: starting it again')!;
  assert.deepEqual([exited.worker, exited.pid, exited.signal, exited.restart_in_ms], [2, first, 'SIGKILL', 100]);
  const again = workerPids(t, perch).get(2)!;
  assert.notEqual(again, first);
  for (let i = 0; i < 6; i++) assert.equal(await get(port, '/v1/users/1', KEY), 200);
  perch.process.kill('SIGTERM');
  assert.deepEqual(await perch.exited, { code: 0, signal: null });
});

test("a terminal's Ctrl-C, which reaches the primary and every worker, stops each worker once: the request in flight is answered", T, async (t) => {
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  const { perch, port, upstream } = await twoWorkers(t, (req, res) => void held.then(() => sampleProvider(req, res)));
  const pids = workerPids(t, perch);
  const answer = get(port, '/v1/users/1', KEY);
  await waitFor(() => upstream.requests.length === 1, 30_000);
  // What a process group's SIGINT does: every process gets it.
  for (const pid of [perch.process.pid!, ...pids.values()]) process.kill(pid, 'SIGINT');
  await waitFor(() => lines(perch).filter((l) => l.msg === 'perch stopping: draining in-flight requests').length === 3, 30_000);
  release();
  assert.equal(await answer, 200);
  assert.deepEqual(await perch.exited, { code: 0, signal: null });
  assert.equal(lines(perch).filter((l) => String(l.msg).startsWith('second stop signal')).length, 0);
});

/** Waits until none of `pids` runs; fails after `ms`. */
async function allGone(pids: Iterable<number>, ms: number): Promise<void> {
  await waitFor(() => [...pids].every((pid) => !alive(pid)), ms);
}

test('a port taken at start ends a single perch with status 1 and one JSON line naming the port', T, async (t) => {
  const holder = createServer();
  await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve));
  onCleanup(t, () => new Promise<void>((resolve) => holder.close(() => resolve())));
  const port = (holder.address() as AddressInfo).port;
  const config = join(tempDir(t, 'perch-workers-'), 'perch.yaml');
  // A Redis client, trying to connect, is one of the handles that kept such a process alive.
  writeFileSync(config, yaml(port, 'http://127.0.0.1:9', 'redis://127.0.0.1:9'));
  const run = await within(runCli(t, ['--config', config]), 10_000, 'perch on a taken port exits');
  assert.equal(run.code, 1);
  const fatal = run.stdout.split('\n').filter((line) => line.includes('"level":60')).map((line) => JSON.parse(line));
  assert.equal(fatal.length, 1);
  assert.equal(fatal[0].msg, `perch could not start: listen EADDRINUSE: address already in use 127.0.0.1:${port}`);
});

test('a metrics port that would be the API port of a worker is refused at start and by --check-config, naming the port', T, async (t) => {
  const port = await freePort();
  const config = join(tempDir(t, 'perch-workers-'), 'perch.yaml');
  writeFileSync(config, yaml(port, 'http://127.0.0.1:9', 'redis://127.0.0.1:9', undefined, `metrics: { port: ${port - 1} }`));
  const reason = `port ${port} is both server.port and worker 2's metrics port (metrics.port ${port - 1} + 1): with --workers 2 the metrics take ports ${port - 1}-${port}`;
  const checked = await runCli(t, ['--config', config, '--workers', '2', '--check-config']);
  assert.deepEqual([checked.code, checked.stderr], [2, `perch: ${config} is not a valid configuration:\n  ${reason}\n`]);
  const refused = await runCli(t, ['--config', config, '--workers', '2']);
  assert.deepEqual([refused.code, refused.stderr], [2, `perch: ${reason}\n`]);
  assert.equal((await runCli(t, ['--config', config, '--check-config'])).code, 0, 'one process takes metrics.port alone');
});

/** `perch --workers 2` whose worker 2 cannot start: its metrics port (metrics.port + 1) is held by the test. */
async function workerTwoCannotStart(t: TestContext) {
  const redis = await startRedis(t);
  // Worker 1's metrics port is the one below the held one: a port the system handed out is no
  // promise that its neighbour is free, so a pair is taken whose lower port was seen free.
  const listen = (server: ReturnType<typeof createServer>, port: number) =>
    new Promise<boolean>((resolve) => {
      server.once('error', () => resolve(false));
      server.listen(port, '127.0.0.1', () => resolve(true));
    });
  let holder = createServer();
  for (;;) {
    await listen(holder, 0);
    const probe = createServer();
    if (await listen(probe, (holder.address() as AddressInfo).port - 1)) {
      await new Promise<void>((resolve) => probe.close(() => resolve()));
      break;
    }
    await new Promise<void>((resolve) => holder.close(() => resolve()));
    holder = createServer();
  }
  const kept = holder;
  onCleanup(t, () => new Promise<void>((resolve) => kept.close(() => resolve())));
  const held = (holder.address() as AddressInfo).port;
  const config = join(tempDir(t, 'perch-workers-'), 'perch.yaml');
  writeFileSync(config, yaml(await freePort(), 'http://127.0.0.1:9', redis.url, undefined, `metrics: { port: ${held - 1} }`));
  const perch = await spawnPerch(t, config, {}, ['--workers', '2']);
  return { perch, held };
}

test('a worker that cannot start exits with its reason and is started again with backoff; SIGTERM then ends the primary and every worker', T, async (t) => {
  const { perch, held } = await workerTwoCannotStart(t);
  await waitFor(() => lines(perch).filter((l) => l.msg === 'worker exited: starting it again').length >= 2, 30_000);
  const pids = workerPids(t, perch);
  const fatal = lines(perch).filter((l) => l.level === 60);
  assert.ok(fatal.length >= 2);
  for (const line of fatal) assert.deepEqual([line.worker, line.msg], [2, `perch could not start: listen EADDRINUSE: address already in use 127.0.0.1:${held}`]);
  const restarts = lines(perch).filter((l) => l.msg === 'worker exited: starting it again');
  assert.deepEqual(restarts.slice(0, 2).map((l) => [l.worker, l.code, l.restart_in_ms]), [[2, 1, 100], [2, 1, 200]]);
  perch.process.kill('SIGTERM');
  const started = performance.now();
  await within(perch.exited, 10_000, 'the primary exits');
  const all = [...workerPids(t, perch).values(), ...pids.values()];
  await allGone(all, 10_000 - (performance.now() - started));
  t.diagnostic(`primary and ${new Set(all).size} workers gone ${Math.round(performance.now() - started)} ms after SIGTERM`);
});

test(`a worker that fails to start ${5} times in a row stops perch with status 1 and a clear line`, T, async (t) => {
  const { perch } = await workerTwoCannotStart(t);
  assert.deepEqual(await within(perch.exited, 20_000, 'the primary gives up'), { code: 1, signal: null });
  const pids = workerPids(t, perch);
  await allGone(pids.values(), 10_000);
  const gaveUp = lines(perch).filter((l) => l.level === 60 && l.worker === 2 && l.failures !== undefined);
  assert.deepEqual(
    gaveUp.map((l) => [l.failures, l.msg]),
    [[5, 'worker 2 failed to start 5 times in a row: perch stops (its own lines say why)']],
  );
  assert.equal(lines(perch).filter((l) => l.msg === 'perch stopped').length, 2, 'worker 1, then the primary');
});

test('when the primary dies, the workers answer the requests in flight, flush their lines and exit', T, async (t) => {
  const { perch, port, upstream } = await twoWorkers(t, (req, res) => void setTimeout(() => sampleProvider(req, res), 3000));
  const pids = workerPids(t, perch);
  const answers = [1, 2, 3, 4].map((id) => get(port, `/v1/users/${id}`, KEY));
  await waitFor(() => upstream.requests.length === 4, 30_000);
  perch.process.kill('SIGKILL');
  assert.deepEqual(await Promise.all(answers), [200, 200, 200, 200]);
  await allGone(pids.values(), 15_000);
  await waitFor(() => lines(perch).filter((l) => l.msg === 'perch stopped').length === 2, 5000);
  assert.equal(lines(perch).filter((l) => l.msg === 'request').length, 4, 'each access line written before the exit');
  assert.deepEqual(
    lines(perch)
      .filter((l) => l.msg === 'perch stopping: draining in-flight requests')
      .map((l) => l.signal),
    ['primary_gone', 'primary_gone'],
  );
});

test('workers under a stalled stdout: every line whole JSON, one access line per answer', { timeout: 120_000 }, async (t) => {
  const { perch, port } = await twoWorkers(t, sampleProvider, [`{ id: alpha, key: "${KEY}", plan: big }`]);
  const stdout = perch.process.stdout!;
  stdout.pause();
  const agent = new Agent({ keepAlive: true, maxSockets: 16 });
  onCleanup(t, () => agent.destroy());
  const total = 4000;
  let answered = 0;
  const one = (i: number) =>
    new Promise<void>((resolve, reject) => {
      const req = request({ host: '127.0.0.1', port, path: `/v1/users/${i % 50}`, agent, headers: { 'x-api-key': KEY, 'user-agent': `load-${'x'.repeat(i % 200)}` } }, (res) => {
        res.resume();
        res.on('end', () => {
          if (res.statusCode === 200) answered++;
          resolve();
        });
      });
      req.on('error', reject);
      req.end();
    });
  const started = performance.now();
  for (let i = 0; i < total; i += 64) await Promise.all(Array.from({ length: Math.min(64, total - i) }, (_, k) => one(i + k)));
  // The reader stays stalled at least 6 s, whatever the load took.
  await new Promise((resolve) => setTimeout(resolve, Math.max(0, 6000 - (performance.now() - started))));
  stdout.resume();
  await waitFor(() => perch.stdout().split('\n').filter((l) => l.includes('"msg":"request"')).length >= answered, 60_000);
  perch.process.kill('SIGTERM');
  await perch.exited;
  const raw = perch.stdout().split('\n').filter((line) => line !== '');
  const torn = raw.filter((line) => {
    try {
      JSON.parse(line);
      return false;
    } catch {
      return true;
    }
  });
  t.diagnostic(`${raw.length} lines, ${torn.length} not JSON; ${answered} answered, ${lines(perch).filter((l) => l.msg === 'request').length} access lines`);
  assert.equal(torn.length, 0, `lines not JSON, the first: ${torn.slice(0, 2).join('\n')}`);
  assert.equal(answered, total);
  assert.equal(lines(perch).filter((l) => l.msg === 'request').length, answered);
});

test('a restarted worker runs the configuration the others run: a port changed by SIGHUP waits for a restart of perch', T, async (t) => {
  const { perch, port, config, upstream, redis } = await twoWorkers(t, sampleProvider);
  const other = await freePort();
  writeFileSync(config, yaml(other, upstream.url, redis.url, [`{ id: alpha, key: "${KEY}", plan: small }`, `{ id: bravo, key: "${OTHER_KEY}", plan: small }`]));
  perch.process.kill('SIGHUP');
  await waitFor(() => lines(perch).filter((l) => l.msg === 'configuration reloaded').length === 2, 30_000);
  process.kill(workerPids(t, perch).get(2)!, 'SIGKILL');
  await waitFor(() => lines(perch).filter((l) => l.msg === 'perch listening').length === 3, 30_000);
  workerPids(t, perch);
  assert.deepEqual(
    lines(perch)
      .filter((l) => l.msg === 'perch listening')
      .map((l) => l.address),
    Array(3).fill(`http://127.0.0.1:${port}`),
  );
  // The reloaded keys are the restarted worker's too: eight connections reach both workers.
  for (let i = 0; i < 8; i++) assert.equal(await get(port, '/v1/users/1', OTHER_KEY), 200);
  await assert.rejects(get(other, '/v1/users/1', KEY), { code: 'ECONNREFUSED' });
  perch.process.kill('SIGTERM');
  assert.deepEqual(await perch.exited, { code: 0, signal: null });
});

test('a SIGHUP while a worker starts reaches it, and no line of the primary repeats a key', T, async (t) => {
  const { perch, port, config, upstream, redis } = await twoWorkers(t, sampleProvider);
  const first = workerPids(t, perch).get(2)!;
  process.kill(first, 'SIGKILL');
  await waitFor(() => lines(perch).filter((l) => l.msg === 'worker started').length === 3, 30_000);
  writeFileSync(config, yaml(port, upstream.url, redis.url, [`{ id: alpha, key: "${KEY}", plan: small }`, `{ id: bravo, key: "${OTHER_KEY}", plan: small }`]));
  perch.process.kill('SIGHUP');
  await waitFor(() => lines(perch).filter((l) => l.msg === 'perch listening').length === 3, 30_000);
  const again = workerPids(t, perch).get(2)!;
  await waitFor(() => lines(perch).filter((l) => l.msg === 'configuration reloaded' && l.worker === 2).length === 1, 30_000);
  const starting = lines(perch).findIndex((l) => l.msg === 'worker started' && l.pid === again);
  const listening = lines(perch).findIndex((l, i) => i > starting && l.msg === 'perch listening' && l.worker === 2);
  const reloadSent = lines(perch).findIndex((l) => l.msg === 'reloading every worker');
  assert.ok(starting < reloadSent && reloadSent < listening, 'the SIGHUP came while worker 2 started');
  for (let i = 0; i < 8; i++) assert.equal(await get(port, '/v1/users/1', OTHER_KEY), 200);
  perch.process.kill('SIGTERM');
  assert.deepEqual(await perch.exited, { code: 0, signal: null });
  // The primary's lines (about itself, worker 0, and about each worker) and the workers' own.
  const all = perch.stdout().split('\n').filter((line) => line !== '');
  assert.ok(all.filter((line) => line.includes('"msg":"worker started"')).length === 3);
  for (const line of all) assert.deepEqual(repeatedKeys(line), [], line);
});

/** The keys that appear more than once in one object of a JSON line. */
function repeatedKeys(line: string): string[] {
  const repeated: string[] = [];
  const seen: Set<string>[] = [];
  for (const token of line.matchAll(/"((?:[^"\\]|\\.)*)"(\s*:)?|[{}]/g)) {
    if (token[0] === '{') seen.push(new Set());
    else if (token[0] === '}') seen.pop();
    else if (token[2] !== undefined) {
      const keys = seen.at(-1)!;
      if (keys.has(token[1]!)) repeated.push(token[1]!);
      keys.add(token[1]!);
    }
  }
  return repeated;
}

test('on Node older than 22.19 perch says which it needs and which it found, and exits 2', T, async (t) => {
  assert.equal(nodeVersionProblem('v20.20.2'), 'perch needs Node 22.19 or later; this is v20.20.2');
  assert.equal(nodeVersionProblem('v22.18.0'), 'perch needs Node 22.19 or later; this is v22.18.0');
  assert.equal(nodeVersionProblem('v23.10.0'), 'perch needs Node 22.19 or later, and 23.11 or later on Node 23; this is v23.10.0');
  for (const fine of ['v22.19.0', 'v22.20.1', 'v23.11.0', 'v23.11.1', 'v24.0.0', 'v26.1.0', 'v27.0.0']) assert.equal(nodeVersionProblem(fine), undefined);
  const old = '/usr/bin/node';
  let version: string;
  try {
    version = execFileSync(old, ['--version'], { encoding: 'utf8' }).trim();
  } catch {
    t.skip(`no ${old}`);
    return;
  }
  if (nodeVersionProblem(version) === undefined) {
    t.skip(`${old} is ${version}, not older than 22.19`);
    return;
  }
  const run = spawnSync(old, [MAIN, '--config', 'nowhere.yaml', '--check-config'], { encoding: 'utf8', timeout: 10_000 });
  assert.deepEqual([run.status, run.stdout, run.stderr], [2, '', `perch: perch needs Node 22.19 or later; this is ${version}\n`]);
});

test('a file made invalid and refused by SIGHUP does not stop a worker started after it: the primary hands over the running configuration', T, async (t) => {
  const { perch, port, config } = await twoWorkers(t, sampleProvider);
  writeFileSync(config, 'server: { port: "not a port" }\n');
  perch.process.kill('SIGHUP');
  await waitFor(() => lines(perch).filter((l) => l.msg === 'reload failed: keeping the running configuration').length === 2, 30_000);
  const problems = lines(perch).filter((l) => l.msg === 'reload: configuration problem');
  assert.ok(problems.length >= 1);
  for (const line of problems) assert.equal(line.worker, 0, 'the primary read the file, once');
  process.kill(workerPids(t, perch).get(2)!, 'SIGKILL');
  await waitFor(() => lines(perch).filter((l) => l.msg === 'perch listening').length === 3, 30_000);
  workerPids(t, perch);
  for (let i = 0; i < 6; i++) assert.equal(await get(port, '/v1/users/1', KEY), 200);
  perch.process.kill('SIGTERM');
  assert.deepEqual(await perch.exited, { code: 0, signal: null });
});

/** Whether `pid` has `path` open (a FIFO it is blocked reading, here). */
function hasOpen(pid: number, path: string): boolean {
  try {
    return readdirSync(`/proc/${pid}/fd`).some((fd) => {
      try {
        return readlinkSync(`/proc/${pid}/fd/${fd}`) === path;
      } catch {
        return false;
      }
    });
  } catch {
    return false;
  }
}

test('a SIGHUP or a Ctrl-C sent to every perch process (pkill, the process group) while workers start ends none of them', T, async (t) => {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, sampleProvider);
  const tls = await selfSignedCertificate(t);
  // The certificate is a FIFO: each worker blocks reading it, in the middle of its start, until
  // the test writes it. The primary never reads it.
  const fifo = join(tls.dir, 'cert-fifo.pem');
  execFileSync('mkfifo', [fifo]);
  const port = await freePort();
  const config = join(tempDir(t, 'perch-workers-'), 'perch.yaml');
  writeFileSync(config, yaml(port, upstream.url, redis.url).replace('shutdown_grace_ms: 5000', `shutdown_grace_ms: 5000, tls: { cert_file: "${fifo}", key_file: "${tls.key}" }`));
  // A process group of its own, as a terminal gives one.
  const child = spawn(process.execPath, [MAIN, '--config', config, '--workers', '2'], { env: { PATH: process.env.PATH }, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  onCleanup(t, async () => {
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      // Gone already.
    }
    await exited;
  });
  let stdout = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.resume();
  const perch = { process: child, url: '', exited, stdout: () => stdout, output: () => stdout };
  await waitFor(() => lines(perch).filter((l) => l.msg === 'worker started').length === 2, 30_000);
  const pids = workerPids(t, perch);
  let writer = -1;
  await waitFor(() => {
    try {
      writer = openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK);
      return true;
    } catch {
      return false;
    }
  }, 30_000);
  onCleanup(t, () => {
    if (writer !== -1) closeSync(writer);
  });
  await waitFor(() => [...pids.values()].every((pid) => hasOpen(pid, fifo)), 30_000);

  // Both workers are in their start now: what `pkill -HUP perch` and a Ctrl-C do to them.
  for (let i = 0; i < 3; i++) process.kill(-child.pid!, 'SIGHUP');
  for (const pid of pids.values()) process.kill(pid, 'SIGINT');
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.deepEqual([...pids.values()].map(alive), [true, true], 'both workers still starting');

  // The certificate arrives: a worker that read the FIFO's end rather than its text fails its start
  // (status 1) and is started again on the file.
  const copy = join(tls.dir, 'cert-copy.pem');
  copyFileSync(tls.cert, copy);
  renameSync(copy, fifo);
  writeSync(writer, readFileSync(tls.cert));
  closeSync(writer);
  writer = -1;
  await waitFor(() => new Set(lines(perch).filter((l) => l.msg === 'perch listening').map((l) => l.worker)).size === 2, 30_000);
  workerPids(t, perch);
  assert.deepEqual(
    lines(perch).filter((l) => l.msg === 'worker exited: starting it again' && l.signal !== null),
    [],
    'no worker ended by a signal',
  );
  child.kill('SIGTERM');
  assert.deepEqual(await exited, { code: 0, signal: null });
});

test('a stdout nobody reads does not hold the primary past the drain: SIGTERM ends it and every worker', T, async (t) => {
  const { perch, port } = await twoWorkers(t, sampleProvider, [`{ id: alpha, key: "${KEY}", plan: big }`]);
  const pids = workerPids(t, perch);
  perch.process.stdout!.pause();
  onCleanup(t, () => void perch.process.stdout!.resume());
  // Far more than a pipe holds (64 KB): every process's next write blocks.
  const agent = new Agent({ keepAlive: true, maxSockets: 16 });
  onCleanup(t, () => agent.destroy());
  const one = (i: number) =>
    new Promise<void>((resolve, reject) => {
      const req = request({ host: '127.0.0.1', port, path: `/v1/users/${i % 50}`, agent, headers: { 'x-api-key': KEY, 'user-agent': 'x'.repeat(300) } }, (res) => {
        res.resume();
        res.on('end', resolve);
      });
      req.on('error', reject);
      req.end();
    });
  for (let i = 0; i < 1536; i += 64) await Promise.all(Array.from({ length: 64 }, (_, k) => one(i + k)));
  perch.process.kill('SIGTERM');
  const started = performance.now();
  // shutdown_grace_ms 5000, then the workers still blocked on their log are killed (3 s), then
  // the primary's last lines have LAST_LINES_MS.
  const exit = await within(perch.exited, 10_000, 'the primary exits');
  await allGone(pids.values(), 1000);
  t.diagnostic(`primary gone ${Math.round(performance.now() - started)} ms after SIGTERM: ${JSON.stringify(exit)}`);
  assert.deepEqual(exit, { code: null, signal: 'SIGKILL' }, 'workers had to be killed: a failed stop');
});

test('a port another process holds with SO_REUSEPORT (another perch --workers) ends perch --workers at start, naming the port', T, async (t) => {
  // What the workers of a fleet already running hold: the port, with SO_REUSEPORT.
  const holder = createServer();
  await new Promise<void>((resolve) => holder.listen({ port: 0, host: '127.0.0.1', reusePort: true }, resolve));
  onCleanup(t, () => new Promise<void>((resolve) => holder.close(() => resolve())));
  const port = (holder.address() as AddressInfo).port;
  const config = join(tempDir(t, 'perch-workers-'), 'perch.yaml');
  writeFileSync(config, yaml(port, 'http://127.0.0.1:9', 'redis://127.0.0.1:9'));
  const run = await within(runCli(t, ['--config', config, '--workers', '2']), 10_000, 'perch --workers on a taken port exits');
  const fatal = run.stdout.split('\n').filter((line) => line.includes('"level":60')).map((line) => JSON.parse(line));
  assert.deepEqual(
    [run.code, fatal.map((line) => [line.worker, line.msg])],
    [1, [[0, `perch could not start: listen EADDRINUSE: address already in use 127.0.0.1:${port}: another process serves it (another perch --workers?); server.reuse_port: true shares it on purpose`]]],
  );
  assert.equal(run.stdout.includes('worker started'), false, 'no worker forked');
});
