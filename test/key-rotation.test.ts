import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { ConfigError, parseConfig } from '../src/config/load.js';
import { ManualClock } from './helpers/clock.js';
import { onCleanup } from './helpers/cleanup.js';
import { startPerch } from './helpers/perch.js';
import { runCli } from './helpers/perch-process.js';
import { tempDir } from './helpers/temp-dir.js';

const OLD = 'rotation-old-qwxyzjklmnop';
const NEW = 'rotation-new-qwxyzjklmnop';
const ADMIN_OLD = 'admin-old-qwxyzuvjklmnop';
const ADMIN_NEW = 'admin-new-qwxyzuvjklmnop';
const START = Date.UTC(2026, 0, 1);
const NOT_AFTER = START + 60_000;
const T = { timeout: 10_000 };
const fingerprint = (secret: string) => createHash('sha256').update(secret).digest('hex').slice(0, 8);

const yaml = (oldSecret = `{ key: "${OLD}", not_after: "${new Date(NOT_AFTER).toISOString()}" }`) => `
server: { host: 127.0.0.1, port: 0 }
auth:
  keys:
    - id: alpha
      plan: five
      secrets:
        - ${oldSecret}
        - { key: "${NEW}" }
rate_limits:
  five: { capacity: 5, refill_per_second: 0.001 }
upstreams:
  demo: { kind: fixture }
admin:
  status_page: true
  keys:
    - id: ops
      secrets:
        - { key: "${ADMIN_OLD}", not_after: "${new Date(NOT_AFTER).toISOString()}" }
        - { key: "${ADMIN_NEW}" }
`;

test('two secrets of one id share one bucket and one metrics label; past not_after the old one is 401, logged once', T, async (t) => {
  const clock = new ManualClock(START);
  const perch = await startPerch(t, yaml(), { clock, timers: clock });
  const statuses: number[] = [];
  for (const key of [OLD, NEW, OLD, NEW, OLD, NEW, OLD]) statuses.push((await perch.request(`/v1/users/${statuses.length + 1}`, { key })).status);
  assert.deepEqual(statuses, [200, 200, 200, 200, 200, 429, 429], 'capacity 5: five answers between the two secrets, then 429 for both');

  const metrics = (await perch.request('/metrics', { key: null })).text;
  const keyIds = new Set([...metrics.matchAll(/key_id="([^"]*)"/g)].map((m) => m[1]));
  assert.deepEqual([...keyIds], ['alpha'], 'metrics name the id only');
  for (const secret of [OLD, NEW]) assert.ok(!metrics.includes(secret) && !metrics.includes(fingerprint(secret)), 'no secret nor fingerprint in metrics');
  assert.match(metrics, new RegExp(`^perch_key_secret_last_used_timestamp_seconds\\{key_id="alpha",secret="0"\\} ${START / 1000}$`, 'm'));
  assert.match(metrics, new RegExp(`^perch_key_secret_last_used_timestamp_seconds\\{key_id="alpha",secret="1"\\} ${START / 1000}$`, 'm'));

  clock.advance(60_000);
  assert.equal((await perch.request('/v1/users/1', { key: OLD })).status, 429, 'at not_after itself the old secret still opens the key');
  clock.advance(1);
  assert.equal((await perch.request('/v1/users/1', { key: OLD })).status, 401);
  assert.equal((await perch.request('/v1/users/1', { key: OLD })).status, 401);
  assert.equal((await perch.request('/v1/users/1', { key: NEW })).status, 429, 'the new one is the same bucket, still spent');
  const warned = perch.logs.lines().filter((l) => l.msg === 'a key secret past its not_after was presented: refused (401); logged once');
  assert.equal(warned.length, 1);
  assert.deepEqual([warned[0]?.key_id, warned[0]?.secret, warned[0]?.fingerprint, warned[0]?.not_after], ['alpha', 0, fingerprint(OLD), new Date(NOT_AFTER).toISOString()]);

  const after = (await perch.request('/metrics', { key: null })).text;
  assert.match(after, new RegExp(`^perch_key_secret_last_used_timestamp_seconds\\{key_id="alpha",secret="0"\\} ${(NOT_AFTER) / 1000}$`, 'm'), 'a refused secret is not a use');
  assert.match(after, new RegExp(`^perch_key_secret_last_used_timestamp_seconds\\{key_id="alpha",secret="1"\\} ${(NOT_AFTER + 1) / 1000}$`, 'm'));
});

test('a keep-alive connection that presented a secret before its not_after is refused past it', T, async (t) => {
  const clock = new ManualClock(START);
  const perch = await startPerch(t, yaml(), { clock, timers: clock });
  const { Agent, request } = await import('undici');
  const agent = new Agent({ connections: 1 });
  onCleanup(t, () => agent.close());
  const get = async () => (await request(`${perch.url}/v1/users/1`, { dispatcher: agent, headers: { 'x-api-key': OLD } })).statusCode;
  assert.equal(await get(), 200);
  clock.advance(60_001);
  assert.equal(await get(), 401);
});

test('the status page names each secret by index and fingerprint with its last use; a reload keeps it; admin secrets expire too', T, async (t) => {
  const clock = new ManualClock(START);
  const perch = await startPerch(t, yaml(), { clock, timers: clock });
  assert.equal((await perch.request('/v1/users/1', { key: OLD })).status, 200);
  clock.advance(1000);
  perch.reload(yaml(`{ key: "${OLD}" }`));
  const status = await perch.request('/status.json', { key: ADMIN_OLD });
  assert.equal(status.status, 200);
  assert.ok(!status.text.includes(OLD) && !status.text.includes(NEW));
  assert.deepEqual(status.json().keys[0].secrets, [
    { index: 0, fingerprint: fingerprint(OLD), last_used: new Date(START).toISOString(), not_after: null },
    { index: 1, fingerprint: fingerprint(NEW), last_used: null, not_after: null },
  ]);
  clock.advance(60_000);
  assert.equal((await perch.request('/status.json', { key: ADMIN_OLD })).status, 401, 'an admin secret past its not_after');
  assert.equal((await perch.request('/status.json', { key: ADMIN_NEW })).status, 200);
  assert.equal((await perch.request('/v1/users/2', { key: OLD })).status, 200, 'the reload took the old client secret\'s end away');
});

test('secrets: either key, sha256 or secrets; each secret one of key and sha256; not_after an RFC 3339 time', T, () => {
  const problemsOf = (text: string): readonly string[] => {
    try {
      parseConfig(text, {});
    } catch (error) {
      assert.ok(error instanceof ConfigError, String(error));
      return error.problems;
    }
    return [];
  };
  assert.deepEqual(problemsOf(yaml()), []);
  assert.deepEqual(problemsOf(yaml(`{ key: "${OLD}", not_after: "2026-12-31" }`)), ['auth.keys[0].secrets[0].not_after: must be an RFC 3339 time with its offset, like 2026-12-31T00:00:00Z']);
  assert.deepEqual(problemsOf(yaml(`{ key: "${OLD}", not_after: "2026-12-31T00:00:00" }`)), ['auth.keys[0].secrets[0].not_after: must be an RFC 3339 time with its offset, like 2026-12-31T00:00:00Z']);
  assert.deepEqual(problemsOf(yaml(`{ not_after: "2026-12-31T00:00:00Z" }`)), ['auth.keys[0].secrets[0]: needs key or sha256']);
  assert.deepEqual(problemsOf(yaml(`{ key: "${NEW}" }`)), ['auth.keys[0].secrets[1].key: has the same secret as auth.keys[0].secrets[0]']);
  assert.deepEqual(problemsOf(yaml().replace('plan: five\n', `plan: five\n      key: "${'k'.repeat(20)}"\n`)), ['auth.keys[0]: set either key or sha256 or secrets, not two of them']);
  assert.deepEqual(problemsOf(yaml().replace(/secrets:\n {8}- .*\n {8}- .*\n/, 'secrets: []\n')), ['auth.keys[0].secrets: must be a non-empty list']);
});

test('not_after: an impossible calendar time is refused, not rolled over; offsets and fractions count exactly', T, () => {
  const parse = (notAfter: string) => {
    try {
      return parseConfig(yaml(`{ key: "${OLD}", not_after: "${notAfter}" }`), {}).auth.keys[0]?.secrets[0]?.notAfterMs;
    } catch (error) {
      assert.ok(error instanceof ConfigError, String(error));
      return error.problems;
    }
  };
  const refused = ['auth.keys[0].secrets[0].not_after: must be an RFC 3339 time with its offset, like 2026-12-31T00:00:00Z'];
  // Date.parse takes each of these, as the day or hour after: a secret would live days longer or end days early.
  for (const impossible of ['2026-02-31T00:00:00Z', '2026-02-29T00:00:00Z', '2026-04-31T00:00:00Z', '2026-13-01T00:00:00Z', '2026-12-31T24:00:00Z', '2026-12-31T23:60:00Z', '2026-12-31T00:00:00+24:00']) {
    assert.deepEqual(parse(impossible), refused, impossible);
  }
  assert.equal(parse('2024-02-29T00:00:00Z'), Date.UTC(2024, 1, 29), 'a leap day is a day');
  assert.equal(parse('2026-12-31T00:00:00.5-05:30'), Date.UTC(2026, 11, 31, 5, 30, 0, 500));
  assert.equal(parse('2027-01-01T01:00:00+02:00'), Date.UTC(2026, 11, 31, 23));
});

test('a secret already past its not_after at a load is warned about at once, naming whether its key has another', T, async (t) => {
  const clock = new ManualClock(NOT_AFTER + 1);
  const perch = await startPerch(t, yaml(), { clock, timers: clock });
  const atLoad = () => perch.logs.lines().filter((l) => typeof l.msg === 'string' && l.msg.includes('past its not_after at load'));
  assert.deepEqual(
    atLoad().map((l) => [l.msg, l.key_id, l.secret, l.fingerprint, l.valid_secrets_left]),
    [
      ['auth.keys: a key secret is already past its not_after at load: it is refused (401); remove it', 'alpha', 0, fingerprint(OLD), true],
      ['admin.keys: a key secret is already past its not_after at load: it is refused (401); remove it', 'ops', 0, fingerprint(ADMIN_OLD), true],
    ],
  );
  // A reload that leaves the key with only the expired secret: the key itself is dead, and said so.
  perch.reload(yaml().replace(/ {8}- \{ key: "rotation-new-[^\n]*\n/, ''));
  assert.deepEqual(atLoad().slice(2).map((l) => [l.msg, l.key_id, l.valid_secrets_left]), [
    ['auth.keys: every secret of this key is past its not_after at load: the key is refused (401)', 'alpha', false],
    ['admin.keys: a key secret is already past its not_after at load: it is refused (401); remove it', 'ops', true],
  ]);
  assert.equal((await perch.request('/v1/users/1', { key: OLD })).status, 401);
});

test('--check-config says valid, and warns on stderr of each secret already past its not_after', T, async (t) => {
  const dir = tempDir(t, 'perch-rotation-');
  const file = join(dir, 'perch.yaml');
  writeFileSync(file, yaml(`{ key: "${OLD}", not_after: "2020-01-01T00:00:00Z" }`).replace(/ {8}- \{ key: "rotation-new-[^\n]*\n/, ''));
  const run = await runCli(t, ['--check-config', '--config', file]);
  assert.equal(run.code, 0, run.stderr);
  assert.equal(run.stdout, `perch: ${file} is valid\n`);
  assert.equal(
    run.stderr,
    'perch: warning: auth.keys[0].secrets[0]: not_after 2020-01-01T00:00:00.000Z is past: this secret is refused, and key "alpha" has no other\n' +
      `perch: warning: admin.keys[0].secrets[0]: not_after ${new Date(NOT_AFTER).toISOString()} is past: this secret is refused\n`,
  );
  assert.ok(!run.stderr.includes(OLD) && !run.stderr.includes(ADMIN_OLD));
});
