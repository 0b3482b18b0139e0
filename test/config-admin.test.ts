import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import { stringify } from 'yaml';
import { ConfigError, parseConfig } from '../src/config/load.js';

const CLIENT_SECRET = 'client-secret-0123456789';
const ADMIN_SECRET = 'admin-secret-0123456789';
const digest = (secret: string) => createHash('sha256').update(secret).digest('hex');

function tree(admin: unknown): Record<string, unknown> {
  return {
    auth: { keys: [{ id: 'alpha', key: CLIENT_SECRET, plan: 'small' }] },
    ...(admin === undefined ? {} : { admin }),
    rate_limits: { small: { capacity: 5, refill_per_second: 1 } },
    upstreams: { demo: { kind: 'fixture' } },
  };
}

function problems(admin: unknown): readonly string[] {
  try {
    parseConfig(stringify(tree(admin)), {});
  } catch (error) {
    assert.ok(error instanceof ConfigError);
    return error.problems;
  }
  return [];
}

test('admin keys are kept as digests, from a literal key or a sha256; no admin section stays absent', () => {
  assert.equal(parseConfig(stringify(tree(undefined)), {}).admin, undefined);
  const config = parseConfig(stringify(tree({ keys: [{ id: 'ops', key: ADMIN_SECRET }, { id: 'ci', sha256: digest('x'.repeat(20)).toUpperCase() }] })), {});
  assert.deepEqual(config.admin, {
    keys: [
      { id: 'ops', secrets: [{ sha256: digest(ADMIN_SECRET) }] },
      { id: 'ci', secrets: [{ sha256: digest('x'.repeat(20)) }] },
    ],
    status_page: false,
  });
});

test('admin keys follow the client keys rules, have no plan, and share no secret with a client key', () => {
  const cases: [unknown, string[]][] = [
    ['yes', ['admin: must be a mapping']],
    [{}, ['admin.keys: is required (at least one key)']],
    [{ keys: [] }, ['admin.keys: must be a non-empty list']],
    [{ keys: [{ id: 'ops', key: ADMIN_SECRET }], extra: 1 }, ['admin.extra: unknown key']],
    [{ keys: ['ops'] }, ['admin.keys[0]: must be a mapping with id and key or sha256']],
    [{ keys: [{ id: 'ops', key: ADMIN_SECRET, plan: 'small' }] }, ['admin.keys[0].plan: unknown key']],
    [{ keys: [{ id: 'o p', key: ADMIN_SECRET }] }, ['admin.keys[0].id: must match [A-Za-z0-9_.-]{1,64}']],
    [{ keys: [{ key: ADMIN_SECRET }] }, ['admin.keys[0].id: is required']],
    [{ keys: [{ id: 'ops', key: 'short' }] }, ['admin.keys[0].key: must be at least 16 characters (a shorter secret is guessable)']],
    [{ keys: [{ id: 'ops' }] }, ['admin.keys[0]: needs key, sha256 or secrets']],
    [{ keys: [{ id: 'ops', sha256: 'abc' }] }, ['admin.keys[0].sha256: must be 64 hex digits (a SHA-256 digest)']],
    [
      { keys: [{ id: 'ops', key: ADMIN_SECRET }, { id: 'ops', key: `${ADMIN_SECRET}x` }] },
      ['admin.keys[1].id: repeats the id of admin.keys[0] ("ops")'],
    ],
    [{ keys: [{ id: 'ops', key: ADMIN_SECRET }, { id: 'ci', sha256: digest(ADMIN_SECRET) }] }, ['admin.keys[1].sha256: has the same secret as admin.keys[0]']],
    [{ keys: [{ id: 'ops', key: CLIENT_SECRET }] }, ['admin.keys[0].key: has the same secret as auth.keys[0]']],
  ];
  for (const [admin, expected] of cases) assert.deepEqual(problems(admin), expected, JSON.stringify(admin));
});

test('metrics.path may not take the purge route or the status page', () => {
  for (const path of ['/admin/purge', '/status', '/status.json']) {
    const raw = { ...tree(undefined), metrics: { path } };
    assert.throws(
      () => parseConfig(stringify(raw), {}),
      (error: unknown) => error instanceof ConfigError && error.problems.includes(`metrics.path: must not be ${path} (perch serves that itself)`),
    );
  }
});

test('admin.status_page is a boolean, off by default, and may come from the environment', () => {
  const keys = [{ id: 'ops', key: ADMIN_SECRET }];
  assert.equal(parseConfig(stringify(tree({ keys, status_page: true })), {}).admin?.status_page, true);
  assert.equal(parseConfig(stringify(tree({ keys, status_page: '${STATUS}' })), { STATUS: 'true' }).admin?.status_page, true);
  assert.equal(parseConfig(stringify(tree({ keys, status_page: false })), {}).admin?.status_page, false);
  assert.deepEqual(problems({ keys, status_page: 'yes' }), ['admin.status_page: must be true or false']);
  assert.deepEqual(problems({ keys, status_pages: true }), ['admin.status_pages: unknown key (did you mean "status_page"?)']);
});
