import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { fileURLToPath } from 'node:url';
import { DEMO_KEY } from '../src/demo-key.js';
import { waitFor } from './helpers/perch.js';

const MAIN = fileURLToPath(new URL('../src/main.js', import.meta.url));
const DEMO_CONFIG = fileURLToPath(new URL('../../config/perch.yaml', import.meta.url));

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function run(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [MAIN, ...args], { env: { PATH: process.env.PATH, ...env } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

function writeConfig(text: string): string {
  const path = join(mkdtempSync(join(tmpdir(), 'perch-cli-')), 'perch.yaml');
  writeFileSync(path, text);
  return path;
}

test('--check-config accepts the demo configuration', async () => {
  const result = await run(['--check-config', '--config', DEMO_CONFIG]);
  assert.equal(result.code, 0, result.stderr);
  assert.match(result.stdout, /is valid/);
});

test('--check-config exits 2 listing every problem with its key path', async () => {
  const path = writeConfig(`
auth: { keys: [ { id: a, key: "\${MISSING_SECRET_VAR}", plan: nope } ] }
rate_limits: { small: { capacity: 0, refill_per_second: 1 } }
upstreams: { demo: { kind: fixture } }
server: { port: 99999 }
`);
  const result = await run(['--check-config', '--config', path]);
  assert.equal(result.code, 2);
  for (const expected of [
    'auth.keys[0].key: environment variable MISSING_SECRET_VAR is not set',
    'rate_limits.small.capacity: must be a positive integer',
    'server.port:',
    'auth.keys[0].plan:',
  ]) {
    assert.ok(result.stderr.includes(expected), `missing "${expected}" in:\n${result.stderr}`);
  }
});

test('a normal start with a bad configuration exits 2 the same way, and PERCH_CONFIG names the file', async () => {
  const path = writeConfig('rate_limits: { small: { capacity: -1, refill_per_second: 1 } }\n');
  const result = await run([], { PERCH_CONFIG: path });
  assert.equal(result.code, 2);
  assert.match(result.stderr, /rate_limits\.small\.capacity: must be a positive integer/);
  assert.match(result.stderr, /upstreams: is required/);
});

test('a missing config file or no config at all exits 2 with a message', async () => {
  const missing = await run(['--config', '/nonexistent/perch.yaml']);
  assert.equal(missing.code, 2);
  assert.match(missing.stderr, /\/nonexistent\/perch\.yaml/);
  const none = await run([]);
  assert.equal(none.code, 2);
  assert.match(none.stderr, /--config/);
  const unknown = await run(['--bogus']);
  assert.equal(unknown.code, 2);
});

test('the demo configuration serves fixture data to the printed curl line and stops on SIGTERM', async (t: TestContext) => {
  const child = spawn(process.execPath, [MAIN, '--config', DEMO_CONFIG], {
    env: { PATH: process.env.PATH, PERCH_PORT: '0' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  t.after(() => child.kill('SIGKILL'));
  let stdout = '';
  child.stdout.on('data', (d) => (stdout += d));
  const line = await new Promise<string>((resolve, reject) => {
    child.stdout.on('data', () => {
      const match = /Try: (curl .*)\n/.exec(stdout);
      if (match) resolve(match[1]!);
    });
    child.on('exit', () => reject(new Error(`perch exited early: ${stdout}`)));
  });
  const url = /(http:\/\/127\.0\.0\.1:\d+\/\S+)/.exec(line)![1]!;
  assert.ok(line.includes(`X-API-Key: ${DEMO_KEY}`));
  const res = await fetch(url, { headers: { 'x-api-key': DEMO_KEY } });
  assert.equal(res.status, 200);
  const user = (await res.json()) as Record<string, unknown>;
  assert.equal(user.username, 'perch_demo');
  assert.match(String(user.id), /^\d+$/);
  // The log is written asynchronously, so the warning may trail the curl line a little.
  await waitFor(() => stdout.includes('the public demo key is enabled'));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
});
