import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { fileURLToPath } from 'node:url';
import { KEY, OTHER_KEY, pollFor, testConfig, v1, waitFor } from './helpers/perch.js';
import { tempDir } from './helpers/temp-dir.js';
import { sampleProvider, startUpstream } from './helpers/upstream-server.js';
import { onCleanup } from './helpers/cleanup.js';

const MAIN = fileURLToPath(new URL('../src/main.js', import.meta.url));
const THIRD_KEY = 'test-key-charlie-0123456789';

interface Child {
  readonly process: ChildProcess;
  readonly url: string;
  readonly exited: Promise<number | null>;
  output(): string;
}

/** perch as a real process, as an operator runs it, so signals are real signals. */
async function spawnPerch(t: TestContext, configPath: string): Promise<Child> {
  const child = spawn(process.execPath, [MAIN, '--config', configPath], { env: { PATH: process.env.PATH }, stdio: ['ignore', 'pipe', 'pipe'] });
  onCleanup(t, () => void child.kill('SIGKILL'));
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  await waitFor(() => /perch is up on (\S+)\n/.test(output) || child.exitCode !== null, 10_000);
  const url = /perch is up on (\S+)\n/.exec(output)?.[1];
  assert.ok(url !== undefined, `perch did not start:\n${output}`);
  return { process: child, url, exited, output: () => output };
}

function writeConfig(path: string, text: string): string {
  writeFileSync(path, text);
  return path;
}

const get = (url: string, key: string) => fetch(url, { headers: { 'x-api-key': key } });

test('SIGTERM lets a slow in-flight request finish with 200, then exits 0', { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, (req, res) => void setTimeout(() => sampleProvider(req, res), 400));
  const dir = tempDir(t, 'perch-life-');
  const perch = await spawnPerch(t, writeConfig(join(dir, 'perch.yaml'), testConfig(v1('slow', upstream.url))));
  const pending = get(`${perch.url}/v1/users/42`, KEY);
  await waitFor(() => upstream.requests.length === 1);
  perch.process.kill('SIGTERM');
  const res = await pending;
  assert.equal(res.status, 200);
  assert.equal(((await res.json()) as { id: string }).id, '123');
  assert.equal(await perch.exited, 0);
  assert.match(perch.output(), /perch stopping/);
  assert.match(perch.output(), /perch stopped/);
});

test('SIGTERM closes connections still busy after server.shutdown_grace_ms and exits 0', { timeout: 30_000 }, async (t) => {
  const upstream = await startUpstream(t, () => {});
  const dir = tempDir(t, 'perch-life-');
  const yaml = testConfig(v1('stuck', upstream.url, 'timeout_ms: 60000')).replace('port: 0 }', 'port: 0, shutdown_grace_ms: 200 }');
  const perch = await spawnPerch(t, writeConfig(join(dir, 'perch.yaml'), yaml));
  const pending = get(`${perch.url}/v1/users/42`, KEY).then(
    () => 'answered',
    () => 'closed',
  );
  await waitFor(() => upstream.requests.length === 1);
  const started = Date.now();
  perch.process.kill('SIGTERM');
  assert.equal(await perch.exited, 0);
  assert.equal(await pending, 'closed');
  assert.ok(Date.now() - started < 5000, 'did not wait for the upstream timeout');
});

test('SIGHUP applies added and removed keys without a restart; a broken file keeps the running config', { timeout: 30_000 }, async (t) => {
  const dir = tempDir(t, 'perch-life-');
  const path = join(dir, 'perch.yaml');
  const initial = testConfig('demo: { kind: fixture }');
  const perch = await spawnPerch(t, writeConfig(path, initial));
  const user = `${perch.url}/v1/users/1`;
  assert.equal((await get(user, OTHER_KEY)).status, 200);
  assert.equal((await get(user, THIRD_KEY)).status, 401);

  // bravo removed, charlie added.
  writeConfig(path, initial.replace(OTHER_KEY, THIRD_KEY).replace('id: bravo', 'id: charlie'));
  perch.process.kill('SIGHUP');
  await waitFor(() => perch.output().includes('configuration reloaded'));
  assert.equal((await get(user, THIRD_KEY)).status, 200);
  assert.equal((await get(user, OTHER_KEY)).status, 401);
  assert.equal((await get(user, KEY)).status, 200);

  writeConfig(path, `${initial.replace(OTHER_KEY, 'short')}\nbogus_section: 1\n`);
  perch.process.kill('SIGHUP');
  await waitFor(() => perch.output().includes('reload failed'));
  assert.match(perch.output(), /auth\.keys\[1\]\.key: must be at least 16 characters/);
  assert.match(perch.output(), /bogus_section: unknown key/);
  assert.doesNotMatch(perch.output(), /"short"/, 'the rejected secret is not logged');
  // Still the configuration of the last good reload.
  assert.equal((await get(user, THIRD_KEY)).status, 200);
  assert.equal((await get(user, OTHER_KEY)).status, 401);

  perch.process.kill('SIGTERM');
  assert.equal(await perch.exited, 0);
});

test('cache.stale_seconds: 0 by SIGHUP stops stale serving: past its TTL the entry is a miss, not stale', { timeout: 30_000 }, async (t) => {
  const dir = tempDir(t, 'perch-life-');
  const path = join(dir, 'perch.yaml');
  const yaml = (stale: number) => testConfig('demo: { kind: fixture }', `cache: { stale_seconds: ${stale}, ttl_seconds: { tweet: 1 } }`);
  const perch = await spawnPerch(t, writeConfig(path, yaml(600)));
  const tweet = `${perch.url}/v1/tweets/1`;
  const past = () =>
    pollFor(async () => {
      const status = (await get(tweet, KEY)).headers.get('cache-status') ?? '';
      return status.startsWith('perch; hit') ? undefined : status;
    });
  assert.equal((await get(tweet, KEY)).headers.get('cache-status'), 'perch; fwd=miss; stored');
  // The first answer past the 1 s TTL: stale, while a refresh stores the entry again.
  assert.match(await past(), /^perch; fwd=stale; ttl=-\d+$/);
  writeConfig(path, yaml(0));
  perch.process.kill('SIGHUP');
  await waitFor(() => perch.output().includes('configuration reloaded'));
  assert.equal(await past(), 'perch; fwd=miss; stored');
  assert.doesNotMatch(perch.output(), /take effect only after a restart/);
  perch.process.kill('SIGTERM');
  assert.equal(await perch.exited, 0);
});
