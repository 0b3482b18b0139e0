// Documented claims about signals (docs/cli.md, Signals; docs/configuration.md), each held
// against a real `perch` process (dist/src/main.js): a second stop signal, and what a SIGHUP
// re-reads and applies.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { closeSync, constants, openSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { ADMIN_KEY } from './helpers/admin.js';
import { KEY, OTHER_KEY, testConfig, v1, waitFor } from './helpers/perch.js';
import { onCleanup } from './helpers/cleanup.js';
import { MAIN, spawnPerch, within } from './helpers/perch-process.js';
import { rawExchange } from './helpers/raw-http.js';
import { tempDir } from './helpers/temp-dir.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';

const T = { timeout: 30_000 };

const get = (url: string, key: string | null, headers: Record<string, string> = {}) =>
  fetch(url, { headers: key === null ? headers : { ...headers, 'x-api-key': key } });

async function status(url: string, key: string | null, headers: Record<string, string> = {}): Promise<number> {
  const res = await get(url, key, headers);
  await res.arrayBuffer();
  return res.status;
}

function count(text: string, needle: string): number {
  return text.split(needle).length - 1;
}

// docs/cli.md, Signals: "A second signal exits at once (status 1)."
for (const [first, second] of [
  ['SIGTERM', 'SIGTERM'],
  ['SIGTERM', 'SIGINT'],
  ['SIGINT', 'SIGTERM'],
] as const) {
  test(`a second stop signal during shutdown (${first}, then ${second}) exits at once with status 1`, T, async (t) => {
    // An upstream that never answers keeps a request in flight, and a long grace would make
    // the first signal's drain last a minute.
    const upstream = await startUpstream(t, () => {});
    const dir = tempDir(t, 'perch-claims-');
    const path = join(dir, 'perch.yaml');
    writeFileSync(path, testConfig(v1('stuck', upstream.url, 'timeout_ms: 60000')).replace('port: 0 }', 'port: 0, shutdown_grace_ms: 60000 }'));
    const perch = await spawnPerch(t, path);
    const pending = get(`${perch.url}/v1/users/42`, KEY).then(
      () => 'answered',
      () => 'closed',
    );
    await waitFor(() => upstream.requests.length === 1);

    perch.process.kill(first);
    await waitFor(() => perch.stdout().includes('perch stopping: draining in-flight requests'));
    assert.equal(perch.process.exitCode, null, 'the first signal waits for the in-flight request');

    perch.process.kill(second);
    const exit = await within(perch.exited, 5000, `exit after the second signal (${second})`);
    assert.deepEqual(exit, { code: 1, signal: null });
    assert.equal(await pending, 'closed');
    assert.equal(count(perch.stdout(), 'perch stopped'), 0, 'it did not wait for the drain');
  });
}

// docs/cli.md, Signals: "... within half a second without them when stdout does not take them."
test('a second stop signal ends perch within a second while stdout takes nothing (a stalled pipe)', T, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const dir = tempDir(t, 'perch-claims-');
  const path = join(dir, 'perch.yaml');
  writeFileSync(path, testConfig(v1('main', upstream.url)));
  const fifo = join(dir, 'stdout');
  execFileSync('mkfifo', [fifo]);
  // The read end is open, so the write end opens, and never read: the pipe fills and stays full.
  const reader = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
  onCleanup(t, () => closeSync(reader));
  const writer = openSync(fifo, 'w');
  const child = spawn(process.execPath, [MAIN, '--config', path], { env: { PATH: process.env.PATH }, stdio: ['ignore', writer, 'pipe'] });
  closeSync(writer);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  onCleanup(t, async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  await waitFor(() => /perch is up on (\S+)\n/.test(stderr) || child.exitCode !== null, 10_000);
  const url = /perch is up on (\S+)\n/.exec(stderr)?.[1];
  assert.ok(url !== undefined, `perch did not start:\n${stderr}`);
  // About 300 bytes of access line each: 1000 requests are over 4 pipes' worth (64 KiB each).
  for (let i = 0; i < 1000; i++) assert.equal(await status(`${url}/v1/users/1`, KEY), 200);

  child.kill('SIGTERM');
  // The first signal is under way once the listener is closed; its flush waits on the pipe.
  await waitFor(() => fetch(`${url}/healthz`).then(() => false, () => true));
  assert.equal(child.exitCode, null);
  const started = performance.now();
  child.kill('SIGTERM');
  const exit = await within(exited, 1000, 'exit after the second signal');
  assert.deepEqual(exit, { code: null, signal: 'SIGTERM' }, `after ${Math.round(performance.now() - started)} ms`);
});

// docs/cli.md, Signals: "An uncaught exception ... writes the log's last lines synchronously".
test('an uncaught exception writes the access lines still batched and the fatal line, then exits 1', T, async (t) => {
  const upstream = await startUpstream(t, sampleProvider);
  const dir = tempDir(t, 'perch-claims-');
  const path = join(dir, 'perch.yaml');
  writeFileSync(path, testConfig(v1('main', upstream.url)));
  // A real uncaught exception in the perch process, on demand: thrown from a signal listener.
  const crash = join(dir, 'crash.cjs');
  writeFileSync(crash, "process.on('SIGUSR2', () => { throw new Error('test crash'); });\n");
  // Node's own heap settings: no relaunch, so the signal reaches perch itself, not a launcher.
  const perch = await spawnPerch(t, path, { NODE_OPTIONS: `--require ${crash}`, PERCH_HEAP_SIZING: 'off' });
  for (const id of [1, 2, 3]) assert.equal(await status(`${perch.url}/v1/users/${id}`, KEY), 200);
  // At once: the last line is still in the log's batch (written within 100 ms otherwise).
  perch.process.kill('SIGUSR2');
  const exit = await within(perch.exited, 5000, 'exit after the uncaught exception');
  assert.deepEqual(exit, { code: 1, signal: null });
  const lines = perch
    .stdout()
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => JSON.parse(line) as { msg?: string; path?: string; err?: { message?: string } });
  assert.deepEqual(
    lines.filter((l) => l.msg === 'request').map((l) => l.path),
    ['/v1/users/1', '/v1/users/2', '/v1/users/3'],
  );
  const fatal = lines.at(-1);
  assert.deepEqual([fatal?.msg, fatal?.err?.message], ['uncaught exception: exiting', 'test crash']);
});

// docs/configuration.md, How the file is read: "Files are read at start-up and again on every SIGHUP, so a
// rotated secret applies on reload."
test('a ${file:...} client key is re-read on SIGHUP: the rotated key is accepted, the old one is 401', T, async (t) => {
  const dir = tempDir(t, 'perch-claims-');
  const keyFile = join(dir, 'alpha_key');
  const oldKey = 'file-key-old-0123456789abcdef';
  const newKey = 'file-key-new-0123456789abcdef';
  writeFileSync(keyFile, `${oldKey}\n`);
  const path = join(dir, 'perch.yaml');
  const yaml = testConfig('demo: { kind: fixture }').replace(`key: "${KEY}"`, `key: "\${file:${keyFile}}"`);
  assert.ok(yaml.includes(`\${file:${keyFile}}`));
  writeFileSync(path, yaml);
  const perch = await spawnPerch(t, path);
  const user = `${perch.url}/v1/users/1`;
  assert.equal(await status(user, oldKey), 200);
  assert.equal(await status(user, newKey), 401);

  // Only the secret file changes; the configuration file stays as it is.
  writeFileSync(keyFile, `${newKey}\n`);
  perch.process.kill('SIGHUP');
  await waitFor(async () => (await status(user, newKey)) === 200, 10_000);
  assert.equal(await status(user, oldKey), 401);
  assert.equal(await status(user, newKey), 200);
  assert.equal(await status(user, OTHER_KEY), 200, 'the other key is untouched');
  // The log is written in batches: the reload's line may trail its effect a little.
  await waitFor(() => perch.stdout().includes('configuration reloaded'));
  assert.equal(count(perch.stdout(), 'configuration reloaded'), 1);
  assert.equal(perch.output().includes(newKey) || perch.output().includes(oldKey), false, 'no secret is logged');
});

// docs/cli.md, Signals: "keys ..., admin keys, TTLs, routes, upstreams and `log.level` apply to the next
// request"; Status page: "The option [admin.status_page] applies on SIGHUP like the admin keys."
test('SIGHUP applies log.level and admin.status_page', T, async (t) => {
  const dir = tempDir(t, 'perch-claims-');
  const path = join(dir, 'perch.yaml');
  const config = (level: string, statusPage: boolean) =>
    testConfig('demo: { kind: fixture }', `admin:\n  keys:\n    - { id: ops, key: "${ADMIN_KEY}" }\n  status_page: ${statusPage}\nlog: { level: ${level} }\n`);
  writeFileSync(path, config('info', false));
  const perch = await spawnPerch(t, path);
  const port = Number(new URL(perch.url).port);
  const user = `${perch.url}/v1/users/1`;
  const page = `${perch.url}/status`;
  const figures = `${perch.url}/status.json`;

  // info, no status page: the access line is written, /status is an unknown route.
  assert.equal(await status(user, KEY, { 'user-agent': 'claims-at-info' }), 200);
  await waitFor(() => perch.stdout().includes('"user_agent":"claims-at-info"'));
  // Off, both paths answer like any unknown route: 404 to a client key.
  assert.equal(await status(page, KEY), 404);
  assert.equal(await status(figures, KEY), 404);
  // A malformed request is logged at debug only: not at info.
  const malformed = 'GET /v1/users/1 HTTP/1.1\r\nHost: perch.test\r\nBad Header : x\r\n\r\n';
  assert.equal((await rawExchange(port, malformed)).text.startsWith('HTTP/1.1 400 '), true);

  // warn, status page on.
  writeFileSync(path, config('warn', true));
  perch.process.kill('SIGHUP');
  await waitFor(async () => (await status(page, null)) === 200, 10_000);
  assert.equal(await status(figures, ADMIN_KEY), 200);
  assert.equal(await status(user, KEY, { 'user-agent': 'claims-at-warn' }), 200);
  // A refused status read logs a warn line after the request above: once it is out, the access
  // line (info) would have been written before it.
  assert.equal(await status(figures, 'not-the-admin-key-0123456789'), 401);
  await waitFor(() => perch.stdout().includes('admin status refused'));
  assert.equal(count(perch.stdout(), '"user_agent":"claims-at-warn"'), 0, 'no info line at level warn');
  assert.equal(count(perch.stdout(), 'configuration reloaded'), 0, 'the reload line is info, so not written at warn');

  // debug, status page off again.
  writeFileSync(path, config('debug', false));
  perch.process.kill('SIGHUP');
  await waitFor(async () => (await status(page, KEY)) === 404, 10_000);
  assert.equal(await status(figures, KEY), 404);
  assert.equal(await status(figures, ADMIN_KEY), 401, 'an admin key is no client key');
  assert.equal(await status(user, KEY, { 'user-agent': 'claims-at-debug' }), 200);
  await waitFor(() => perch.stdout().includes('"user_agent":"claims-at-debug"'));
  assert.equal(count(perch.stdout(), 'malformed request rejected'), 0);
  assert.equal((await rawExchange(port, malformed)).text.startsWith('HTTP/1.1 400 '), true);
  await waitFor(() => perch.stdout().includes('malformed request rejected'));
  assert.equal(count(perch.stdout(), 'malformed request rejected'), 1);
});

// docs/cli.md, Signals: "A changed plan keeps each client's current token count (capped at the new
// capacity)."
test("a SIGHUP that changes plans keeps each client's token count, capped at the new capacity", T, async (t) => {
  const dir = tempDir(t, 'perch-claims-');
  const path = join(dir, 'perch.yaml');
  // Refill of one token per 1000 s: nothing flows back during the test.
  const config = (growing: number, shrinking: number) =>
    testConfig('demo: { kind: fixture }')
      .replace('plan: big }', 'plan: growing }')
      .replace('plan: big }', 'plan: shrinking }')
      .replace(
        'big: { capacity: 100000, refill_per_second: 100000 }',
        `growing: { capacity: ${growing}, refill_per_second: 0.001 }\n  shrinking: { capacity: ${shrinking}, refill_per_second: 0.001 }`,
      );
  writeFileSync(path, config(5, 10));
  const perch = await spawnPerch(t, path);
  const user = `${perch.url}/v1/users/1`;
  const spend = async (key: string) => {
    const res = await get(user, key);
    await res.arrayBuffer();
    return [res.status, res.headers.get('ratelimit-policy'), res.headers.get('ratelimit')?.replace(/;t=\d+$/, '')];
  };

  // alpha (growing, 5) spends 3 of 5; bravo (shrinking, 10) spends 1 of 10.
  for (const left of [4, 3, 2]) assert.deepEqual(await spend(KEY), [200, '"growing";q=5;w=5000', `"growing";r=${left}`]);
  assert.deepEqual(await spend(OTHER_KEY), [200, '"shrinking";q=10;w=10000', '"shrinking";r=9']);

  writeFileSync(path, config(10, 3));
  perch.process.kill('SIGHUP');
  await waitFor(() => perch.stdout().includes('configuration reloaded'), 10_000);

  // alpha keeps its 2 tokens under the larger plan: no refill to 10.
  assert.deepEqual(await spend(KEY), [200, '"growing";q=10;w=10000', '"growing";r=1']);
  assert.deepEqual(await spend(KEY), [200, '"growing";q=10;w=10000', '"growing";r=0']);
  assert.deepEqual(await spend(KEY), [429, '"growing";q=10;w=10000', '"growing";r=0']);
  // bravo's 9 tokens are capped at the new capacity, 3.
  assert.deepEqual(await spend(OTHER_KEY), [200, '"shrinking";q=3;w=3000', '"shrinking";r=2']);
  assert.deepEqual(await spend(OTHER_KEY), [200, '"shrinking";q=3;w=3000', '"shrinking";r=1']);
  assert.deepEqual(await spend(OTHER_KEY), [200, '"shrinking";q=3;w=3000', '"shrinking";r=0']);
  assert.deepEqual(await spend(OTHER_KEY), [429, '"shrinking";q=3;w=3000', '"shrinking";r=0']);
});
