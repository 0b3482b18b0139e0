import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import { fileURLToPath } from 'node:url';
import { HEAP_LIMIT_WARNING } from '../src/app/advice.js';
import { DEMO_KEY } from '../src/app/demo-key.js';
import { PERCH_VERSION } from '../src/version.js';
import { waitFor } from './helpers/perch.js';
import { tempDir } from './helpers/temp-dir.js';
import { selfSignedCertificate } from './helpers/tls-files.js';
import { onCleanup } from './helpers/cleanup.js';

const MAIN = fileURLToPath(new URL('../src/main.js', import.meta.url));
const DEMO_CONFIG = fileURLToPath(new URL('../../config/perch.yaml', import.meta.url));

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

const T = { timeout: 20_000 };

/** Runs the CLI to its exit; killed if the test ends first. */
function run(t: TestContext, args: string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [MAIN, ...args], { env: { PATH: process.env.PATH, ...env } });
    onCleanup(t, () => void child.kill('SIGKILL'));
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** A config file in a temporary directory removed when the test ends. */
function writeConfig(t: TestContext, text: string): string {
  const path = join(tempDir(t, 'perch-cli-'), 'perch.yaml');
  writeFileSync(path, text);
  return path;
}

test('--check-config accepts the demo configuration', T, async (t) => {
  const result = await run(t, ['--check-config', '--config', DEMO_CONFIG]);
  assert.equal(result.code, 0, result.stderr);
  assert.match(result.stdout, /is valid/);
});

test('--check-config exits 2 listing every problem with its key path', T, async (t) => {
  const path = writeConfig(t, `
auth: { keys: [ { id: a, key: "\${MISSING_SECRET_VAR}", plan: nope } ] }
rate_limits: { small: { capacity: 0, refill_per_second: 1 } }
upstreams: { demo: { kind: fixture } }
server: { port: 99999 }
`);
  const result = await run(t, ['--check-config', '--config', path]);
  assert.equal(result.code, 2);
  for (const expected of [
    'auth.keys[0].key: environment variable MISSING_SECRET_VAR is not set',
    'rate_limits.small.capacity: must be an integer from 1 to 999999999999999',
    'server.port:',
    'auth.keys[0].plan:',
  ]) {
    assert.ok(result.stderr.includes(expected), `missing "${expected}" in:\n${result.stderr}`);
  }
});

test('a normal start with a bad configuration exits 2 the same way, and PERCH_CONFIG names the file', T, async (t) => {
  const path = writeConfig(t, 'rate_limits: { small: { capacity: -1, refill_per_second: 1 } }\n');
  const result = await run(t, [], { PERCH_CONFIG: path });
  assert.equal(result.code, 2);
  assert.match(result.stderr, /rate_limits\.small\.capacity: must be an integer from 1 to 999999999999999/);
  assert.match(result.stderr, /upstreams: is required/);
});

test('a missing config file or no config at all exits 2 with a message', T, async (t) => {
  const missing = await run(t, ['--config', '/nonexistent/perch.yaml']);
  assert.equal(missing.code, 2);
  assert.match(missing.stderr, /\/nonexistent\/perch\.yaml/);
  const none = await run(t, []);
  assert.equal(none.code, 2);
  assert.match(none.stderr, /--config/);
  const unknown = await run(t, ['--bogus']);
  assert.equal(unknown.code, 2);
});

test('the demo configuration serves fixture data to the printed curl line and stops on SIGTERM; stdout is JSON only', T, async (t) => {
  const child = spawn(process.execPath, [MAIN, '--config', DEMO_CONFIG], {
    env: { PATH: process.env.PATH, PERCH_PORT: '0' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  onCleanup(t, () => void child.kill('SIGKILL'));
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  // The line for a person goes to stderr, so log shippers reading stdout see JSON lines only.
  const line = await new Promise<string>((resolve, reject) => {
    child.stderr.on('data', () => {
      const match = /Try: (curl .*)\n/.exec(stderr);
      if (match) resolve(match[1]!);
    });
    child.on('exit', () => reject(new Error(`perch exited early: ${stderr}`)));
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
  const lines = stdout.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.deepEqual([lines[0]!.msg, lines[0]!.version, lines[0]!.node], [`perch ${PERCH_VERSION} starting`, PERCH_VERSION, process.version]);
  // Node's default heap limit is far above what the demo's 256 MiB cache may need.
  assert.equal(lines.filter((l) => l.msg === HEAP_LIMIT_WARNING).length, 0);
});

test('a heap limit too small for a full memory cache is a start-up warning with the heap needed', T, async (t) => {
  const child = spawn(process.execPath, ['--max-old-space-size=64', MAIN, '--config', DEMO_CONFIG], {
    env: { PATH: process.env.PATH, PERCH_PORT: '0' },
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  onCleanup(t, () => void child.kill('SIGKILL'));
  let stdout = '';
  child.stdout.on('data', (d) => (stdout += d));
  await waitFor(() => stdout.includes(HEAP_LIMIT_WARNING));
  const warning = stdout
    .split('\n')
    .filter((l) => l.includes(HEAP_LIMIT_WARNING))
    .map((l) => JSON.parse(l) as Record<string, unknown>)[0]!;
  // The demo's max_bytes is 64 MiB: 0.85 x 64 + 64 = 118.4, rounded up.
  assert.deepEqual([warning.level, warning.old_space_limit_mib, warning.needed_mib], [40, 64, 119]);
});

test('--version prints the package version and the node it runs on', T, async (t) => {
  const result = await run(t, ['--version']);
  assert.equal(result.code, 0);
  const pkg = JSON.parse(readFileSync(fileURLToPath(new URL('../../package.json', import.meta.url)), 'utf8')) as { version: string };
  assert.equal(result.stdout, `${pkg.version} (node ${process.version})\n`);
  assert.equal(PERCH_VERSION, pkg.version);
});

test('--check-config reads the TLS and CA files a start-up would, naming the key and never the content', T, async (t) => {
  const tls = await selfSignedCertificate(t);
  const base = `
auth: { keys: [ { id: a, key: "cli-test-key-0123456789", plan: p } ] }
rate_limits: { p: { capacity: 1, refill_per_second: 1 } }
upstreams: { demo: { kind: fixture } }
`;
  const good = await run(t, ['--check-config', '--config', writeConfig(t, `${base}server: { tls: { cert_file: ${tls.cert}, key_file: ${tls.key} } }\n`)]);
  assert.equal(good.code, 0, good.stderr);

  const missing = join(tls.dir, 'absent.pem');
  const absent = await run(t, ['--check-config', '--config', writeConfig(t, `${base}server: { tls: { cert_file: ${missing}, key_file: ${tls.key} } }\n`)]);
  assert.equal(absent.code, 2);
  assert.match(absent.stderr, new RegExp(`server\\.tls\\.cert_file: cannot read ${missing} \\(ENOENT\\)`));

  // Certificate and key swapped: both readable, neither usable.
  const swapped = await run(t, ['--check-config', '--config', writeConfig(t, `${base}server: { tls: { cert_file: ${tls.key}, key_file: ${tls.cert} } }\n`)]);
  assert.equal(swapped.code, 2);
  assert.match(swapped.stderr, /server\.tls: the certificate and key are not usable/);
  assert.ok(!swapped.stderr.includes('PRIVATE KEY'), swapped.stderr);

  const notCa = join(tls.dir, 'not-a-ca.pem');
  writeFileSync(notCa, 'not a certificate\n');
  const ca = await run(t, ['--check-config', '--config', writeConfig(t, `${base}cache: { redis: { url: "rediss://127.0.0.1:1", tls_ca_file: ${notCa} } }\n`)]);
  assert.equal(ca.code, 2);
  assert.match(ca.stderr, new RegExp(`cache\\.redis\\.tls_ca_file: ${notCa} holds no PEM certificate`));
});

test('--health-check asks the configured port; a refused SIGHUP reload is visible in metrics and /readyz until a good one', T, async (t) => {
  const port = await freePort();
  const config = `
server: { host: 0.0.0.0, port: ${port} }
auth: { keys: [ { id: a, key: "cli-test-key-0123456789", plan: p } ] }
rate_limits: { p: { capacity: 100, refill_per_second: 100 } }
upstreams: { demo: { kind: fixture } }
`;
  const path = writeConfig(t, config);
  const down = await run(t, ['--health-check', '--config', path]);
  assert.equal(down.code, 1);
  assert.match(down.stderr, /perch: unhealthy: .*ECONNREFUSED/);

  const child = spawn(process.execPath, [MAIN, '--config', path], { env: { PATH: process.env.PATH }, stdio: ['ignore', 'ignore', 'pipe'] });
  onCleanup(t, () => void child.kill('SIGKILL'));
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  await waitFor(() => stderr.includes('perch is up'), 10_000);
  const up = await run(t, ['--health-check'], { PERCH_CONFIG: path });
  assert.equal(up.code, 0, up.stderr);

  const base = `http://127.0.0.1:${port}`;
  const reloadOk = async () => /^perch_config_last_reload_successful 1$/m.test(await (await fetch(`${base}/metrics`)).text());
  assert.ok(await reloadOk());
  writeFileSync(path, `${config}log: { level: [info\n`);
  child.kill('SIGHUP');
  await waitFor(async () => !(await reloadOk()));
  const ready = (await (await fetch(`${base}/readyz`)).json()) as { status: string; checks: { config: string } };
  assert.equal(ready.status, 'degraded');
  assert.match(ready.checks.config, /^last reload failed at /);
  assert.equal((await fetch(`${base}/v1/users/1`, { headers: { 'x-api-key': 'cli-test-key-0123456789' } })).status, 200);

  writeFileSync(path, config);
  child.kill('SIGHUP');
  await waitFor(reloadOk);
  assert.equal(((await (await fetch(`${base}/readyz`)).json()) as { status: string }).status, 'ok');
});

/** A port nothing listens on now: bound on 0, then released. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

test('--check-config refuses a nested default, a secret left a placeholder, and a client key that is a provider credential', T, async (t) => {
  const secret = 'shared-secret-0123456789';
  const path = writeConfig(t, `
auth:
  keys:
    - { id: alpha, key: "\${ALPHA_KEY:-\${FALLBACK_ALPHA_KEY}}", plan: p }
    - { id: beta, key: "$\${BETA_KEY_PLACEHOLDER}", plan: p }
    - { id: gamma, key: "${secret}", plan: p }
rate_limits: { p: { capacity: 10, refill_per_second: 1 } }
upstreams:
  one: { kind: v1, url: "http://127.0.0.1:9", headers: { X-API-Key: "\${PROVIDER_KEY:-\${PROVIDER_KEY_DEFAULT}}" } }
  two: { kind: v1, url: "http://127.0.0.1:9", credentials: [ { id: c1, headers: { X-API-Key: "${secret}" } } ] }
  three: { kind: v1, url: "http://127.0.0.1:9", headers: { X-API-Key: "$\${PROVIDER_KEY}" } }
routes: { user: [one] }
`);
  const result = await run(t, ['--check-config', '--config', path], { FALLBACK_ALPHA_KEY: 'fallback-secret-0123456789' });
  assert.equal(result.code, 2, result.stderr);
  for (const expected of [
    'auth.keys[0].key: "${" inside a reference or its default is not supported',
    'auth.keys[1].key: still looks like a "${...}" placeholder after substitution',
    'upstreams.one.headers.X-API-Key: "${" inside a reference or its default is not supported',
    'upstreams.three.headers.X-API-Key: still looks like a "${...}" placeholder after substitution',
    'upstreams.two.credentials[0].headers.X-API-Key: is the same secret as auth.keys[2] (a client key',
  ]) {
    assert.ok(result.stderr.includes(expected), `missing "${expected}" in:\n${result.stderr}`);
  }
  assert.ok(!result.stderr.includes(secret) && !result.stderr.includes('fallback-secret'), result.stderr);
});

test('--check-config refuses a plan whose bucket would take more than 15 digits of seconds to fill', T, async (t) => {
  const path = writeConfig(t, `
auth: { keys: [ { id: a, key: "0123456789abcdef0123", plan: tiny }, { id: b, key: "0123456789abcdef0124", plan: slow } ] }
rate_limits:
  tiny: { capacity: 1, refill_per_second: 1e-300 }
  slow: { capacity: 2, refill_per_second: 2e-15 }
upstreams: { demo: { kind: fixture } }
`);
  const result = await run(t, ['--check-config', '--config', path]);
  assert.equal(result.code, 2, result.stderr);
  for (const plan of ['tiny', 'slow']) {
    assert.ok(result.stderr.includes(`rate_limits.${plan}.refill_per_second: must be at least capacity / 999990000000000`), result.stderr);
  }
});

test('--check-config refuses a plan capacity or provider_calls limit longer than a 15-digit field', T, async (t) => {
  const path = writeConfig(t, `
auth: { keys: [ { id: a, key: "0123456789abcdef0123", plan: wide }, { id: b, key: "0123456789abcdef0124", plan: spender } ] }
rate_limits:
  wide: { capacity: 9007199254740991, refill_per_second: 9007199254740991 }
  spender: { capacity: 10, refill_per_second: 1, provider_calls: { limit: 1000000000000000, window: day } }
upstreams: { demo: { kind: fixture } }
`);
  const result = await run(t, ['--check-config', '--config', path]);
  assert.equal(result.code, 2, result.stderr);
  for (const at of ['rate_limits.wide.capacity', 'rate_limits.spender.provider_calls.limit']) {
    assert.ok(result.stderr.includes(`${at}: must be an integer from 1 to 999999999999999`), result.stderr);
  }
});

test('--check-config takes a secret that holds a lone "\${" from the environment, as substitution promises', T, async (t) => {
  const path = writeConfig(t, `
auth: { keys: [ { id: alpha, key: "\${ALPHA_KEY}", plan: p } ] }
rate_limits: { p: { capacity: 10, refill_per_second: 1 } }
upstreams: { one: { kind: v1, url: "http://127.0.0.1:9", headers: { X-API-Key: "\${PROVIDER_KEY}" } } }
`);
  const result = await run(t, ['--check-config', '--config', path], { ALPHA_KEY: 'Zq8${w!r2Lm9xT4vB', PROVIDER_KEY: 'pr0v${der-9f8e7d6c5b' });
  assert.equal(result.code, 0, result.stderr);
});

test('--check-config refuses a client key sent to a v1 provider as an Authorization bearer token', T, async (t) => {
  const secret = 'shared-secret-0123456789';
  const path = writeConfig(t, `
auth: { keys: [ { id: alpha, key: "${secret}", plan: p } ] }
rate_limits: { p: { capacity: 10, refill_per_second: 1 } }
upstreams: { one: { kind: v1, url: "http://127.0.0.1:9", headers: { Authorization: "Bearer ${secret}" } } }
`);
  const result = await run(t, ['--check-config', '--config', path]);
  assert.equal(result.code, 2, result.stderr);
  assert.ok(result.stderr.includes('upstreams.one.headers.Authorization: is the same secret as auth.keys[0]'), result.stderr);
  assert.ok(!result.stderr.includes(secret), result.stderr);
});
