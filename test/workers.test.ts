import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { parseCommand } from '../src/cli.js';
import { onCleanup } from './helpers/cleanup.js';
import { KEY, OTHER_KEY, waitFor } from './helpers/perch.js';
import { freePort, runCli, spawnPerch, type PerchProcess } from './helpers/perch-process.js';
import { startRedis } from './helpers/redis-server.js';
import { tempDir } from './helpers/temp-dir.js';
import { sampleProvider, startUpstream, type UpstreamBehaviour } from './helpers/upstream-server.js';

const T = { timeout: 60_000 };

/** Two keys on a plan of 10 requests that refills next to never, so a limit shows exactly. */
function yaml(port: number, upstream: string, redis: string | undefined, keys = [`{ id: alpha, key: "${KEY}", plan: small }`]): string {
  return `
server: { host: 127.0.0.1, port: ${port}, shutdown_grace_ms: 2000 }
auth:
  keys:
${keys.map((k) => `    - ${k}`).join('\n')}
rate_limits:
  small: { capacity: 10, refill_per_second: 0.001 }
upstreams:
  main: { kind: v1, url: "${upstream}", timeout_ms: 2000 }
${redis === undefined ? '' : `cache: { redis: { url: "${redis}" } }`}
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
async function twoWorkers(t: TestContext, behaviour: UpstreamBehaviour) {
  const redis = await startRedis(t);
  const upstream = await startUpstream(t, behaviour);
  const port = await freePort();
  const config = join(tempDir(t, 'perch-workers-'), 'perch.yaml');
  writeFileSync(config, yaml(port, upstream.url, redis.url));
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
  assert.deepEqual(parseCommand(['--config', 'p.yaml', '--workers', '2', '--check-config'], {}), {
    kind: 'usage_error',
    message: '--workers goes with serving, not with --check-config or --health-check',
  });
});

test('--workers above 1 without Redis for the limits, or on port 0, is refused at start with the reason', T, async (t) => {
  const dir = tempDir(t, 'perch-workers-');
  const noRedis = join(dir, 'no-redis.yaml');
  writeFileSync(noRedis, yaml(await freePort(), 'http://127.0.0.1:9', undefined));
  const refused = await runCli(t, ['--config', noRedis, '--workers', '2']);
  assert.equal(refused.code, 2);
  assert.equal(
    refused.stderr,
    'perch: --workers 2 needs Redis for the rate limits (rate_limits_redis or cache.redis): without it each worker would enforce every plan in full by itself\n',
  );
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
